"""What a fairseq-preprocess directory (a data-bin) says about itself: its language pair.

Scoring, the CTranslate2 export, the length studies and the table harness all ask it; it
lives here, below them, so that none of them imports another for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Tuple

from fairseq_rope.base import FairseqRopeError, PathLike


class DataBinError(FairseqRopeError, ValueError):
    """A data-bin that does not say what it holds."""


def infer_language_pair(data_bin: PathLike, subset: str) -> Tuple[str, str]:
    """(source, target) languages of ``subset`` in a fairseq-preprocess directory, from the names
    of its binarized files (``SUBSET.SRC-TGT.LANG.idx``); DataBinError unless exactly one pair."""
    pairs = set()
    for path in Path(data_bin).glob(f"{subset}.*-*.*.idx"):
        m = re.fullmatch(rf"{re.escape(subset)}\.([^.-]+)-([^.-]+)\.[^.]+\.idx", path.name)
        if m:
            pairs.add((m.group(1), m.group(2)))
    if len(pairs) != 1:
        found = ", ".join("-".join(p) for p in sorted(pairs)) or "none"
        raise DataBinError(f"cannot infer the language pair of subset {subset!r} in {data_bin} "
                           f"(pairs found: {found})")
    return pairs.pop()
