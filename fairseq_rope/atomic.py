"""Atomic file output: readers see the old file or the complete new one, never a part.

Everything is written to a temporary file in the target's directory (so the
final rename stays on one file system) and moved over the target with
``os.replace`` only once the writer has finished; on any error the temporary
file is removed and the target left as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Union

PathLike = Union[str, os.PathLike]


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
