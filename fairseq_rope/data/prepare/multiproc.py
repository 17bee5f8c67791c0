"""Chunked, order-preserving multiprocessing over the lines of a file.

A file is cut into chunks of ``chunk_lines`` lines that worker processes handle
independently; results come back in input order, so the output is the same
for any number of workers (and any chunk size, as long as the function works
line by line).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from itertools import islice
from pathlib import Path
from typing import Callable, Deque, Iterator, List, Sequence, TypeVar

from tqdm import tqdm

from fairseq_rope.base import PathLike
from fairseq_rope.data.prepare.files import count_lines, open_text, read_lines

T = TypeVar("T")
ChunkFn = Callable[[Sequence[str]], T]

DEFAULT_CHUNK_LINES = 10_000


def pool_context() -> multiprocessing.context.BaseContext:
    # fork: workers inherit the already imported modules (importing this
    # package pulls in fairseq and torch, seconds per spawned process).
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def _chunks(path: PathLike, chunk_lines: int) -> Iterator[List[str]]:
    lines = read_lines(path)
    while chunk := list(islice(lines, chunk_lines)):
        yield chunk


def imap_chunks(
    fn: ChunkFn[T],
    path: PathLike,
    *,
    workers: int,
    chunk_lines: int = DEFAULT_CHUNK_LINES,
    desc: str = "",
) -> Iterator[T]:
    """Yield ``fn(chunk)`` for consecutive chunks of the lines of ``path``, in order.

    ``fn`` must be picklable (a module-level function or a ``functools.partial``
    of one). At most ``2 * workers`` chunks are in flight, which bounds memory.
    """
    total = count_lines(path)
    with tqdm(total=total, desc=desc or Path(path).name, unit=" lines", unit_scale=True) as bar:
        if workers <= 1:
            for chunk in _chunks(path, chunk_lines):
                yield fn(chunk)
                bar.update(len(chunk))
            return
        with pool_context().Pool(workers) as pool:
            pending: Deque = deque()
            for chunk in _chunks(path, chunk_lines):
                pending.append((len(chunk), pool.apply_async(fn, (chunk,))))
                if len(pending) >= 2 * workers:
                    n, result = pending.popleft()
                    yield result.get()
                    bar.update(n)
            while pending:
                n, result = pending.popleft()
                yield result.get()
                bar.update(n)


def map_lines(
    fn: ChunkFn[List[str]],
    src: PathLike,
    dest: PathLike,
    *,
    workers: int,
    chunk_lines: int = DEFAULT_CHUNK_LINES,
    desc: str = "",
) -> int:
    """Write ``fn`` applied chunk-wise to the lines of ``src`` to ``dest``; return the line count.

    ``fn`` must return one output line per input line: the pipeline relies on
    line ``i`` of every file of a split being the same sentence pair.
    """
    n = 0
    with open_text(dest, "w") as out:
        for lines in imap_chunks(_Checked(fn), src, workers=workers, chunk_lines=chunk_lines, desc=desc):
            out.writelines(line + "\n" for line in lines)
            n += len(lines)
    return n


class _Checked:
    """Wrap a chunk function and fail loudly if it does not map lines one to one."""

    def __init__(self, fn: ChunkFn[List[str]]) -> None:
        self.fn = fn

    def __call__(self, chunk: Sequence[str]) -> List[str]:
        out = self.fn(chunk)
        if len(out) != len(chunk) or any("\n" in line for line in out):
            raise RuntimeError(f"{self.fn!r} broke the line alignment of a chunk")
        return out
