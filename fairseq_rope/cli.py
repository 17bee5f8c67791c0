"""Small helpers shared by the plugin's command-line entry points."""

from __future__ import annotations

import shlex
import sys
from typing import List, Optional, Sequence, Tuple


def split_passthrough(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Split ``argv`` at the first ``--``: (own arguments, arguments passed through)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def command_line(script: str, argv: Optional[Sequence[str]] = None) -> str:
    """How an entry point was invoked, for the reports it writes (``argv`` None: the process's)."""
    return " ".join(shlex.quote(a) for a in [script, *(sys.argv[1:] if argv is None else argv)])
