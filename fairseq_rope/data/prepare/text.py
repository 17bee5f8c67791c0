"""Sentence-level text processing: Moses normalization/tokenization and cleaning.

The functions that the multiprocessing pool runs take and return whole chunks
of lines (``List[str]``) and are module-level, so they pickle; the sacremoses
objects are built once per worker process and cached.
"""

from __future__ import annotations

from functools import lru_cache
from typing import List, Sequence, Tuple

import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

# remove-non-printing-char.perl does ``s/\p{C}/ /g`` on each chomped line: every
# control, format, surrogate, private-use or unassigned character (tab
# included) becomes a space. The stdlib ``re`` has no \p{...}; ``regex`` (a
# sacremoses dependency) does.
_NON_PRINTING = regex.compile(r"\p{C}")

#: Options of the Moses tokenizer, fixed for the whole pipeline. ``escape=False``
#: keeps ``&``, ``<``, ``'``, ``"`` as they are instead of ``&amp;`` etc. (the
#: perl default): references and detokenization stay simple and tokenized BLEU
#: compares like with like, since every split goes through the same call.
TOKENIZER_OPTIONS = {"aggressive_dash_splits": True, "escape": False}


def remove_non_printing(line: str) -> str:
    """Replace each Unicode ``C*`` character by a space, like remove-non-printing-char.perl."""
    return _NON_PRINTING.sub(" ", line)


@lru_cache(maxsize=None)
def _moses(lang: str) -> Tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def preprocess_line(line: str, lang: str) -> str:
    """normalize-punctuation.perl → remove-non-printing-char.perl → tokenizer.perl -a."""
    normalizer, tokenizer = _moses(lang)
    line = remove_non_printing(normalizer.normalize(line))
    return tokenizer.tokenize(line, return_str=True, **TOKENIZER_OPTIONS)


def preprocess_chunk(lines: Sequence[str], lang: str) -> List[str]:
    """:func:`preprocess_line` over a chunk (the unit of work of the worker pool)."""
    return [preprocess_line(line, lang) for line in lines]


def normalize_whitespace(line: str) -> str:
    """Collapse all whitespace to single spaces, as fairseq's line tokenizer sees it."""
    return " ".join(line.split())


def keep_pair(src: str, tgt: str, min_len: int = 1, max_len: int = 250, ratio: float = 1.5) -> bool:
    """The filter of Moses ``clean-corpus-n.perl -ratio RATIO MIN MAX``.

    Both sides must have ``min_len``..``max_len`` whitespace-separated tokens
    and neither may be more than ``ratio`` times longer than the other.
    """
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if not (min_len <= n_src <= max_len and min_len <= n_tgt <= max_len):
        return False
    return n_src <= ratio * n_tgt and n_tgt <= ratio * n_src
