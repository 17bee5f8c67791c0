#!/usr/bin/env bash
# Prepare Multi30k English-German or English-French (task 1) for fairseq: the
# pair's six published files (train, val, test_2016_flickr; checked against their
# SHA-256 and line counts), Moses normalization and tokenization in each side's
# language, joint BPE (10k vocabulary by default), fairseq-preprocess
# --joined-dictionary (no cleaning: every pair is a translation); raw/test.TGT is
# kept as the sacreBLEU reference.
#
# usage: scripts/prepare_multi30k.sh [--tgt de|fr] [--raw-dir DIR] [--offline]
#            [--bpe subword-nmt|sentencepiece] [--vocab-size 10000] [--workers N] OUT_DIR
#
# Files missing from --raw-dir (default OUT_DIR/orig) are downloaded from
# github.com/multi30k/dataset (data/task1/raw/). Reruns skip finished steps.
# Python: see scripts/env.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.data.prepare.cli multi30k "$@"
