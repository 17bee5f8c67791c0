#!/usr/bin/env python3
"""Runaway hypotheses of evaluated runs (see fairseq_rope/experiments/runaways.py).

    scripts/runaway_study.py RUN_DIR [RUN_DIR...] --out docs/results/NAME
    scripts/runaway_study.py --out docs/results/NAME     # rewrite NAME.md from NAME.json

For each run: hypotheses longer than 1.5x their reference or stopped by the
length limit, where their loops start against the longest training target,
forced decoding of the references (search or model error), and the counts
with --max-len-a 1.2 --max-len-b 10 and length penalties 0.2 and 1.0.
Writes NAME.json and NAME.md; runs studied earlier (in NAME.json) are kept, so
a report accumulates runs whose checkpoints are gone.
"""

import sys

from fairseq_rope.experiments.runaways import main

if __name__ == "__main__":
    sys.exit(main())
