"""What every layer of fairseq-rope shares: the error base, paths, atomic writes,
line decoding, command-line helpers, the provenance of measurements (CPU,
commit) and the tables' decoding settings. It imports nothing from the package; the error
base, line decoding and the decoding settings come from the runtime
(``fairseq_rope_serve``), which reports errors the same way and serves with the same decoding.

Atomic output: readers see the old file or the complete new one, never a part.
Everything is written to a temporary file in the target's directory (so the
final rename stays on one file system) and moved over the target with
``os.replace`` only once the writer has finished; on any error the temporary
file is removed and the target left as it was.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

from fairseq_rope_serve.common import (  # noqa: F401 (the package imports them from here)
    FairseqRopeError,
    LineDecodingError,
    PathLike,
    decode_lines,
    report_error,
)

#: The paper's decoding, every table's: fairseq-generate's (:mod:`fairseq_rope.evaluation.decoding`)
#: and CTranslate2's defaults. Its home is the runtime, which serves exports with it.
from fairseq_rope_serve.decoding import TABLE_DECODING  # noqa: E402,F401


# The plugin package: what fairseq's ``--user-dir`` takes.
PLUGIN_DIR = Path(__file__).resolve().parent


def project_dir() -> Path:
    """Where ``work/`` and ``docs/`` live: the checkout this package runs from, or, for an
    installed package, the working directory."""
    checkout = PLUGIN_DIR.parent
    is_checkout = (checkout / "pyproject.toml").is_file() and (checkout / "scripts").is_dir()
    return checkout if is_checkout else Path.cwd()


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; it replaces ``path`` when the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make results private
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def atomic_directory(path: PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; it replaces ``path`` (a directory or file,
    if any) when the block succeeds. On an error the temporary directory is removed and
    ``path`` left as it was. The old ``path`` is moved aside, the new one moved in, then the
    old removed: two renames on one file system, restored if the second fails."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would make the result private
        old = None
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old")) / "old"
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            if old is not None:
                os.rename(old, target)
                _remove(old.parent)
            raise
        if old is not None:
            _remove(old.parent)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def write_text(path: PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_lines(path: PathLike, lines: Iterable[str]) -> None:
    """Write ``lines`` (without newlines), one per line, to ``path`` atomically."""
    write_text(path, "".join(line + "\n" for line in lines))


def write_json(path: PathLike, data: Any) -> None:
    """Write ``data`` as indented UTF-8 JSON to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# --- Lines


def read_lines(path: PathLike) -> List[str]:
    """Lines split on "\\n" only; a non-UTF-8 line is a :class:`LineDecodingError` naming file and line."""
    with open(path, "rb") as f:
        return list(decode_lines(f, str(path)))


# --- Command lines


def split_passthrough(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Split ``argv`` at the first ``--``: (own arguments, arguments passed through)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def fairseq_command(name: str) -> List[str]:
    """How to run fairseq's console script ``name`` (fairseq-train, fairseq-generate…) with
    this interpreter: the script beside it, or, in an environment without fairseq's scripts
    (fairseq reused from another one), the module behind it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-m", "fairseq_cli." + name.split("-", 1)[1].replace("-", "_")]


def portable(text: str, root: PathLike) -> str:
    """``text`` with absolute paths under ``root`` written relative to it (``root`` itself as
    ``.``): a committed result names the command that made it, not the machine's directories."""
    prefix = re.escape(str(Path(root).resolve()).rstrip("/"))
    return re.sub(prefix + r"(?:/|(?=[\s'\":]|$))", lambda m: "" if m.group(0).endswith("/") else ".", text)


def command_line(script: str, argv: Optional[Sequence[str]] = None) -> str:
    """How an entry point was invoked, for the reports it writes (``argv`` None: the process's),
    with paths under the working directory relative to it."""
    invoked = " ".join(shlex.quote(a) for a in [script, *(sys.argv[1:] if argv is None else argv)])
    return portable(invoked, os.getcwd())


# --- Provenance: what a result was measured on and with


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def git_commit() -> Optional[str]:
    """The commit of the checkout the plugin runs from, with " (modified)" when its tracked
    files differ from it; None outside a git checkout (an installed wheel)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=PLUGIN_DIR, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        modified = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit} (modified)" if commit and modified else commit or None
