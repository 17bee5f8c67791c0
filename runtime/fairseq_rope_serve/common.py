"""What the runtime shares with fairseq-rope, which imports it from here: the error base
reported without a traceback, and lines of bytes decoded as UTF-8 text."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, List, Union

PathLike = Union[str, os.PathLike]


class FairseqRopeError(Exception):
    """Base of every error fairseq-rope (and this runtime) raises on purpose: bad input or
    environment, reported to the user without a traceback by the entry points."""


class DeployError(FairseqRopeError, ValueError):
    """A model, model directory or option that cannot be exported or served."""


class LineDecodingError(FairseqRopeError, ValueError):
    """A text file that is not UTF-8."""


def report_error(error: BaseException, status: int = 1) -> int:
    """Show an expected error as one ``error:`` line (no traceback); the exit status to return."""
    print(f"error: {error}", file=sys.stderr)
    return status


def decode_lines(raw: Iterable[bytes], name: str, strict: bool = True) -> Iterator[str]:
    """Decode byte lines (as split on ``b"\\n"``) to text lines without line endings.

    A trailing ``"\\r"`` (CRLF files) is dropped. With ``strict``, a non-UTF-8
    line is a :class:`LineDecodingError` naming ``name`` and the line number; without,
    bad bytes become U+FFFD and one warning summarises them.
    """
    bad: List[int] = []
    for lineno, line in enumerate(raw, start=1):
        line = line.rstrip(b"\n")
        if line.endswith(b"\r"):
            line = line[:-1]
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise LineDecodingError(
                    f"{name}: line {lineno} is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                    "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            bad.append(lineno)
            yield line.decode("utf-8", errors="replace")
    if bad:
        print(f"warning: {name}: {len(bad)} line(s) with invalid UTF-8, bad bytes replaced by U+FFFD "
              f"(first: line {bad[0]})")


def split_lines(text: str) -> List[str]:
    """``text`` as the translate command reads it: split on ``"\\n"`` only, a trailing ``"\\r"``
    dropped from each line (as :func:`decode_lines`)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
