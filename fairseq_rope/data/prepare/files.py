"""Line-oriented text I/O shared by the preparation steps.

Lines are split on ``"\\n"`` only, like the Moses perl scripts: Python's
universal-newline mode would also split on a lone ``"\\r"`` (Common Crawl has
some) and silently misalign a parallel corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Iterable, Iterator

from fairseq_rope.base import FairseqRopeError, PathLike, decode_lines


class PrepareError(FairseqRopeError):
    """A problem with the input data or the environment, reported without a traceback."""


def open_text(path: PathLike, mode: str = "r") -> IO[str]:
    """Open a UTF-8 text file whose lines end with ``"\\n"`` only."""
    return open(path, mode, encoding="utf-8", newline="\n")


def read_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of one of our own (valid UTF-8) files, without the newline."""
    with open_text(path) as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def write_lines(path: PathLike, lines: Iterable[str]) -> int:
    """Write ``lines`` (without newlines) to ``path``; return how many were written."""
    n = 0
    with open_text(path, "w") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def count_lines(path: PathLike) -> int:
    """Number of lines in ``path`` (a last line without ``"\\n"`` counts too)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def copy_user_file(src: PathLike, dest: PathLike) -> int:
    """Copy a user-supplied corpus file to ``dest``, checking it on the way.

    It must exist, be non-empty and valid UTF-8 (see :func:`decode_lines`);
    returns its number of lines.
    """
    src = Path(src)
    if not src.exists():
        raise PrepareError(f"{src}: no such file (inputs are PREFIX.LANG for each --*pref and language)")
    try:
        f = open(src, "rb")
    except IsADirectoryError:
        raise PrepareError(f"{src}: is a directory, not a text file of sentences") from None
    except OSError as exc:
        raise PrepareError(f"{src}: cannot read it ({exc.strerror}); check its permissions") from None
    with f:
        n = write_lines(dest, decode_lines(f, str(src), strict=True))
    if n == 0:
        raise PrepareError(f"{src}: file is empty; every split needs at least one sentence pair")
    return n


def check_aligned(src: PathLike, n_src: int, tgt: PathLike, n_tgt: int) -> None:
    """Raise if two sides of a parallel corpus have different line counts."""
    if n_src != n_tgt:
        raise PrepareError(
            f"misaligned parallel files: {src} has {n_src} lines but {tgt} has {n_tgt} lines; "
            "line i of each side must hold the translation of line i of the other"
        )
