"""Sentence-level text processing of corpora: Moses normalization/tokenization and cleaning.

The Moses processing itself (:func:`preprocess_line`, :data:`TOKENIZER_OPTIONS`) lives in the
runtime, ``fairseq_rope_serve.text``, which translates raw text as the data were prepared.
The functions that the multiprocessing pool runs take and return whole chunks
of lines (``List[str]``) and are module-level, so they pickle; the sacremoses
objects are built once per worker process and cached.
"""

from __future__ import annotations

from typing import List, Sequence

from fairseq_rope_serve.text import preprocess_line


def preprocess_chunk(lines: Sequence[str], lang: str) -> List[str]:
    """:func:`preprocess_line` over a chunk (the unit of work of the worker pool)."""
    return [preprocess_line(line, lang) for line in lines]


def keep_pair(src: str, tgt: str, min_len: int = 1, max_len: int = 250, ratio: float = 1.5) -> bool:
    """The filter of Moses ``clean-corpus-n.perl -ratio RATIO MIN MAX``.

    Both sides must have ``min_len``..``max_len`` whitespace-separated tokens
    and neither may be more than ``ratio`` times longer than the other.
    """
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if not (min_len <= n_src <= max_len and min_len <= n_tgt <= max_len):
        return False
    return n_src <= ratio * n_tgt and n_tgt <= ratio * n_src
