"""Applying and removing a learned subword segmentation (learning it is fairseq-rope's
``fairseq_rope.data.prepare.bpe``).

subword-nmt output marks word-internal units with ``@@`` (:func:`remove_bpe` undoes it as
fairseq's ``--remove-bpe`` does); SentencePiece output is pieces with ``▁`` word-start marks
(``pip install 'fairseq-rope-serve[sentencepiece]'``; imported only when used).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import List, Sequence, Tuple

from subword_nmt.apply_bpe import BPE

from fairseq_rope_serve.text import normalize_whitespace


# Keyed on the file's stat too: a step redone in the same process (tests, or
# the workers forked from it) must not reuse a model learned before.
@lru_cache(maxsize=None)
def _load_subword_nmt(codes: str, stamp: Tuple[int, int]) -> BPE:
    with open(codes, encoding="utf-8", newline="\n") as f:
        return BPE(f, separator="@@")


@lru_cache(maxsize=None)
def _load_sentencepiece(model: str, stamp: Tuple[int, int]):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=model)


def _stamp(path: str) -> Tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def apply_subword_nmt(lines: Sequence[str], codes: str) -> List[str]:
    """Segment a chunk of tokenized lines with the BPE codes file ``codes``."""
    bpe = _load_subword_nmt(codes, _stamp(codes))
    return [bpe.segment(normalize_whitespace(line)) for line in lines]


def apply_sentencepiece(lines: Sequence[str], model: str) -> List[str]:
    """Segment a chunk of lines into space-separated pieces of the model ``model``.

    Pieces go through their ids, so characters outside the model become
    ``<unk>``, which fairseq maps to its own unknown symbol, rather than
    dictionary entries of their own.
    """
    sp = _load_sentencepiece(model, _stamp(model))
    encoded = sp.encode([normalize_whitespace(line) for line in lines])
    return [" ".join(sp.id_to_piece(i) for i in ids) for ids in encoded]


def remove_bpe(tokens: Sequence[str], separator: str = "@@") -> str:
    """subword-nmt tokens joined into words, as fairseq's ``--remove-bpe`` (its
    ``post_process(text, separator + " ")``) does: each ``separator`` ending a token, with the
    space after it, removed; one ending the sentence too."""
    return (" ".join(tokens) + " ").replace(separator + " ", "").rstrip()
