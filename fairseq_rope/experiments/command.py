"""fairseq-train command lines, read as fairseq reads them: the one parser of the harness.

``train.sh`` compares a run's arguments with those it recorded, the convergence rule reads
``--patience`` and ``--max-update`` from them, and the table reads a run's architecture and
shape from its ``command.txt``: all through :func:`parse_command`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_rope.experiments.train_log import PROGRAM

#: A run directory's record of its latest training command: ``cd DIR`` then the fairseq-train line.
COMMAND_FILE = "command.txt"

#: Option name (no dashes) → the values of its last occurrence.
Options = Dict[str, Tuple[str, ...]]


def parse_command(argv: Sequence[str]) -> Tuple[List[str], Options]:
    """(positional arguments, options) of fairseq-train arguments, argparse-style.

    ``--name=value`` and ``--name value...`` are the same; a repeated option
    keeps its last values, as argparse does.
    """
    positional: List[str] = []
    options: Options = {}
    name: Optional[str] = None
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            options[name] = (value,) if eq else ()
            if eq:
                name = None
        elif name is not None:
            options[name] += (arg,)
        else:
            positional.append(arg)
    return positional, options


def last_value(options: Mapping[str, Tuple[str, ...]], name: str, default: Optional[str] = None) -> Optional[str]:
    """The last value given to option ``name`` (no dashes), else ``default``."""
    values = options.get(name)
    return values[-1] if values else default


def option_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The value of option ``name`` (no dashes) in ``argv``, as fairseq-train would read it."""
    return last_value(parse_command(argv)[1], name)


def read_command(run_dir: Path) -> Tuple[str, List[str]]:
    """(directory, fairseq-train arguments) recorded in ``run_dir/command.txt``; ValueError
    if it is not a ``cd DIR`` line followed by a fairseq-train command."""
    lines = (run_dir / COMMAND_FILE).read_text(encoding="utf-8").splitlines()
    cd, command = shlex.split(lines[0]), shlex.split(lines[1])
    if cd[:1] != ["cd"] or len(cd) != 2 or command[:1] != [PROGRAM]:
        raise ValueError("not a 'cd DIR' line followed by a fairseq-train command")
    return cd[1], command[1:]
