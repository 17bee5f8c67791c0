"""Small helpers shared by the plugin's command-line entry points."""

from __future__ import annotations

from typing import List, Sequence, Tuple


def split_passthrough(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Split ``argv`` at the first ``--``: (own arguments, arguments passed through)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []
