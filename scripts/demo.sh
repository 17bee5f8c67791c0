#!/usr/bin/env bash
# The whole pipeline on the embedded synthetic En→De corpus, on CPU, in minutes:
# generate the corpus → prepare (Moses tokenization, joint BPE, cleaning,
# fairseq-preprocess) → train configs/rope_demo.yaml (transformer_rope_tiny with the
# paper's optimizer and schedule) → average the last 5 checkpoints → decode with
# beam 4 / lenpen 0.6 → tokenized and detokenized BLEU.
#
#   scripts/demo.sh [WORK_DIR]     (default: demo/)
#
# Every step resumes: a rerun skips what is finished. Same as `fairseq-rope-demo`
# (installed package): fairseq_rope/experiments/demo.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.experiments.demo "$@"
