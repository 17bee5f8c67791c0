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
# statmt.org. Reruns skip finished steps. Python: $PYTHON, else the repo's
# .venv, else `python`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" && -x "$repo/.venv/bin/python" ]]; then
    PYTHON="$repo/.venv/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_rope.prepare.cli wmt14 "$@"
