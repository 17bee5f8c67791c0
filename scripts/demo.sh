#!/usr/bin/env bash
# The whole pipeline on the embedded synthetic En→De corpus, on CPU, in minutes:
# generate the corpus → prepare (Moses tokenization, joint BPE, cleaning,
# fairseq-preprocess) → train configs/rope_demo.yaml (transformer_rope_tiny with the
# paper's optimizer and schedule) → average the last 5 checkpoints → decode with
# beam 4 / lenpen 0.6 → tokenized and detokenized BLEU.
#
#   scripts/demo.sh [WORK_DIR]     (default: demo/)
#
# Every step resumes: a rerun skips what is finished.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${1:-demo}

step() { printf '\n==> %s\n' "$*" >&2; }

step "1/4 synthetic corpus (fairseq_rope/data/demo_corpus.py) -> $work/corpus"
if [[ ! -f $work/corpus/test.de ]]; then
    "$PYTHON" -m fairseq_rope.data.demo_corpus --out-dir "$work/corpus" --train 20000 --valid 500 --test 500
fi

step "2/4 prepare: tokenize, joint BPE, clean, binarize -> $work/data"
"$here/prepare_parallel.sh" --src en --tgt de --vocab-size 2000 \
    --trainpref "$work/corpus/train" --validpref "$work/corpus/valid" \
    --testpref "$work/corpus/test" "$work/data"

# A finished demo (results.json) is left as it is: rerunning train.sh would
# resave checkpoint_last.pt even with nothing left to train.
results=$work/checkpoints/eval/results.json
if [[ -f $results ]]; then
    step "3/4, 4/4 already trained and evaluated: $results"
    exit 0
fi

step "3/4 train configs/rope_demo.yaml -> $work/checkpoints"
"$here/train.sh" rope_demo "$work/data/data-bin" "$work/checkpoints"

step "4/4 average the last 5 checkpoints, decode (beam 4, lenpen 0.6), score"
"$here/evaluate.sh" "$work/checkpoints" "$work/data/data-bin"
