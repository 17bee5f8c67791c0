"""Peak resident memory of a child process, measured by the child.

::

    python fairseq_rope/benchmark/peak_rss.py REPORT (-m MODULE | SCRIPT) [ARGS…]

runs ``python -m MODULE ARGS…`` (or the Python script SCRIPT, a console script such as
fairseq-generate) in this process and, at exit, writes its peak resident set size in bytes
(``VmHWM`` of ``/proc/self/status``) to REPORT.

Why not ``ru_maxrss`` from ``wait4``: Linux carries the high-water mark of the forking
parent into the child's (measured: under a parent holding 800 MiB, ``python -c pass`` read
833 MB there and 13.6 MB in its own ``VmHWM``). A benchmark process that holds torch, fairseq
and CTranslate2 (about 500 MiB) would read at least that for every engine. ``VmHWM`` belongs
to the address space that ``exec`` created. Linux only. Run as a file, not with ``-m``: the
package's ``__init__`` imports fairseq, which would count in every measurement.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path
from typing import List, Sequence


def vm_hwm() -> int:
    """This process's peak resident set size, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            value, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(value) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measured_command(argv: Sequence[str], report: Path) -> List[str]:
    """``argv`` (``python -m MODULE …`` with this interpreter, or a Python script and its
    arguments) as a command that also writes its peak RSS to ``report``."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        target, rest = ["-m", argv[2]], argv[3:]
    else:
        target, rest = [argv[0]], argv[1:]
    return [sys.executable, __file__, str(report), *target, *rest]


def main() -> None:
    report, target = Path(sys.argv[1]), sys.argv[2:]
    atexit.register(lambda: report.write_text(str(vm_hwm())))
    # sys.path[0] is this file's directory, whose modules (profile, timing…) would shadow
    # others': make it what python itself would have put there.
    if target[0] == "-m":
        sys.argv, sys.path[0] = [target[1], *target[2:]], os.getcwd()
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv, sys.path[0] = target, os.path.dirname(os.path.abspath(target[0]))
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    main()
