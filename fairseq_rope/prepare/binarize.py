"""``fairseq-preprocess --joined-dictionary``, run in-process.

In-process rather than as a subprocess: this package already imports fairseq,
and a second interpreter would pay that import (seconds) again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from fairseq_rope.prepare.files import PathLike


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
    from fairseq import options
    from fairseq_cli import preprocess

    argv = [
        "--source-lang", src, "--target-lang", tgt,
        "--trainpref", str(trainpref), "--validpref", str(validpref),
        "--destdir", str(destdir), "--joined-dictionary", "--workers", str(max(1, workers)),
    ]
    if testpref is not None:
        argv += ["--testpref", str(testpref)]
    args = options.get_preprocessing_parser().parse_args(argv)
    # preprocess.main attaches a FileHandler for destdir/preprocess.log on every
    # call; detach it afterwards so repeated in-process runs do not leak files.
    logger = logging.getLogger("fairseq_cli.preprocess")
    before = set(logger.handlers)
    try:
        preprocess.main(args)
    finally:
        for handler in set(logger.handlers) - before:
            logger.removeHandler(handler)
            handler.close()


def dictionary_size(path: PathLike) -> int:
    """Number of symbols of a fairseq dictionary file, fairseq's 4 special symbols included."""
    from fairseq.data import Dictionary

    return len(Dictionary.load(str(Path(path))))
