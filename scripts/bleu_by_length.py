#!/usr/bin/env python3
"""BLEU (tokenized, compound-split) per source-length bucket (see fairseq_rope/evaluation/bleu_by_length.py).

    scripts/bleu_by_length.py GENERATE_OUTPUT|EVAL_DIR [--edges 10,20,30,40,50,60]
        [--source-file FILE] [--subset test] [--output FILE]

EVAL_DIR is scripts/evaluate.sh's SAVE_DIR/eval (its generate-SUBSET.txt is read).
Length is in words of fairseq-generate's S- lines (Moses-tokenized, BPE removed)
unless --source-file names a source file aligned with the test set, e.g. the raw
DATA/raw/test.en. Prints the table and writes it as JSON (default:
bleu_by_length.json beside the generate output).
"""

import sys

from fairseq_rope.evaluation.bleu_by_length import main

if __name__ == "__main__":
    sys.exit(main())
