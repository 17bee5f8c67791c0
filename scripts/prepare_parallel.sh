#!/usr/bin/env bash
# Prepare any raw parallel corpus for fairseq with the WMT14 recipe: Moses
# normalization and tokenization, joint BPE, cleaning of the training set,
# fairseq-preprocess --joined-dictionary. Input files are PREFIX.SRC / PREFIX.TGT.
#
# usage: scripts/prepare_parallel.sh --src en --tgt de --trainpref P --validpref P
#            [--testpref P] [--bpe subword-nmt|sentencepiece] [--vocab-size 37000]
#            [--workers N] [--no-tokenize] OUT_DIR
#
# Reruns skip finished steps. Python: $PYTHON, else the repo's .venv, else `python`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" && -x "$repo/.venv/bin/python" ]]; then
    PYTHON="$repo/.venv/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_rope.prepare.cli parallel "$@"
