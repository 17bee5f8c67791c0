"""``fairseq-preprocess --joined-dictionary``, run as fairseq's own CLI.

A subprocess rather than ``preprocess.main`` in-process: fairseq-preprocess
configures logging (its ``preprocess.log``) at import, which an embedding
process that already configured logging silently overrides.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

from fairseq_rope.base import PathLike
from fairseq_rope.data.prepare.files import PrepareError


def binarize(
    src: str,
    tgt: str,
    destdir: PathLike,
    trainpref: PathLike,
    validpref: PathLike,
    testpref: Optional[PathLike] = None,
    workers: int = 1,
) -> None:
    """Build the joined dictionary on the training text and binarize every split into ``destdir``."""
    argv = [
        sys.executable, "-m", "fairseq_cli.preprocess",
        "--source-lang", src, "--target-lang", tgt,
        "--trainpref", str(trainpref), "--validpref", str(validpref),
        "--destdir", str(destdir), "--joined-dictionary", "--workers", str(max(1, workers)),
    ]
    if testpref is not None:
        argv += ["--testpref", str(testpref)]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise PrepareError(f"fairseq-preprocess failed:\n{result.stderr[-3000:]}")


def dictionary_size(path: PathLike) -> int:
    """Number of symbols of a fairseq dictionary file, fairseq's 4 special symbols included."""
    from fairseq.data import Dictionary

    return len(Dictionary.load(str(Path(path))))
