#!/usr/bin/env bash
# Evaluate a training run the paper's way: average the last N checkpoints,
# decode with beam 4 / length penalty 0.6, report tokenized compound-split BLEU
# and sacreBLEU.
#
#   scripts/evaluate.sh SAVE_DIR DATA_BIN [--raw-ref FILE] [--subset test]
#       [--num-checkpoints 5] [--detok-lang LANG] [--max-tokens 8192] [--force]
#       [-- extra fairseq-generate args...]
#
# Same as `fairseq-rope-evaluate` (installed package); details:
# fairseq_rope/evaluation/evaluate.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.evaluation.evaluate "$@"
