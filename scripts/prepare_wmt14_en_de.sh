#!/usr/bin/env bash
# Prepare WMT14 English-German for fairseq (Vaswani et al. 2017 / RoFormer setup):
# Europarl v7 + Common Crawl + News Commentary v9 for training, newstest2013
# for validation, newstest2014 (full, 3003 sentences) for test; Moses
# normalization and tokenization, joint BPE, cleaning, fairseq-preprocess.
#
# usage: scripts/prepare_wmt14_en_de.sh [--raw-dir DIR] [--offline]
#            [--bpe subword-nmt|sentencepiece] [--vocab-size 37000] [--workers N] OUT_DIR
#
# Archives missing from --raw-dir (default OUT_DIR/orig) are downloaded from
# statmt.org. Reruns skip finished steps. Python: see scripts/env.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.data.prepare.cli wmt14 "$@"
