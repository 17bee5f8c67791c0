"""Moses text processing, the one home of what training and serving do to raw text.

:func:`preprocess_line` is what ``fairseq-rope-prepare`` does to every line of a corpus and
what the translate command does to its input; :func:`detokenize` undoes it on translations,
for the translate command and for the sacreBLEU scores of the evaluation.
The sacremoses objects are built once per process (and per worker of the preparation's pool).
"""

from __future__ import annotations

from functools import lru_cache
from typing import List, Sequence, Tuple

import regex
from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

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


@lru_cache(maxsize=None)
def _detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang=lang)


def preprocess_line(line: str, lang: str) -> str:
    """normalize-punctuation.perl → remove-non-printing-char.perl → tokenizer.perl -a."""
    normalizer, tokenizer = _moses(lang)
    line = remove_non_printing(normalizer.normalize(line))
    return tokenizer.tokenize(line, return_str=True, **TOKENIZER_OPTIONS)


def normalize_whitespace(line: str) -> str:
    """Collapse all whitespace to single spaces, as fairseq's line tokenizer sees it."""
    return " ".join(line.split())


def detokenize(lines: Sequence[str], lang: str) -> List[str]:
    """Moses-detokenize whitespace-tokenized lines (also undoes ``@-@`` and XML escapes)."""
    detokenizer = _detokenizer(lang)
    return [detokenizer.detokenize(line.split()) for line in lines]
