#!/usr/bin/env bash
# Prepare any raw parallel corpus for fairseq with the WMT14 recipe: Moses
# normalization and tokenization, joint BPE, cleaning of the training set,
# fairseq-preprocess --joined-dictionary. Input files are PREFIX.SRC / PREFIX.TGT.
#
# usage: scripts/prepare_parallel.sh --src en --tgt de --trainpref P --validpref P
#            [--testpref P] [--bpe subword-nmt|sentencepiece] [--vocab-size 37000]
#            [--workers N] [--no-tokenize] OUT_DIR
#
# Reruns skip finished steps. Python: see scripts/env.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.data.prepare.cli parallel "$@"
