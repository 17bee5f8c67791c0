#!/usr/bin/env python3
"""BLEU against training updates of one run, to choose a training budget
(see fairseq_rope/experiments/bleu_curve.py).

    scripts/bleu_curve.py SAVE_DIR DATA_BIN --out docs/results/NAME [--subset valid]
        [--window 5] [--every 1]

Each kept update checkpoint: the average of the last WINDOW checkpoints up to
it decodes SUBSET (beam 4, length penalty 0.6) and is scored like the tables.
Writes NAME.json, NAME.md and NAME.png; a rerun extends the curve.
"""

import sys

from fairseq_rope.experiments.bleu_curve import main

if __name__ == "__main__":
    sys.exit(main())
