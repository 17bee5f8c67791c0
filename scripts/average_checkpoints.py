#!/usr/bin/env python3
"""Average the last N fairseq checkpoints of a directory (see fairseq_rope/evaluation/averaging.py).

    scripts/average_checkpoints.py --inputs SAVE_DIR --output SAVE_DIR/checkpoint_avg_last5.pt \
        --num-update-checkpoints 5 [--checkpoint-upper-bound 100000]

``--num-epoch-checkpoints N`` averages epoch checkpoints instead; ``--num-checkpoints N``
takes update checkpoints if there are any, else epoch checkpoints.
"""

import sys

from fairseq_rope.evaluation.averaging import main

if __name__ == "__main__":
    sys.exit(main())
