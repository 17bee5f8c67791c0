#!/usr/bin/env python3
"""Inference-time RoPE scaling on a length study's rope runs (see
fairseq_rope/experiments/scaling_study.py).

    scripts/rope_scaling_study.py work/multi30k-length/rope/seed1 work/multi30k-length/rope/seed2 \
        --baselines work/multi30k-length/alibi/seed1 work/multi30k-length/alibi/seed2 \
        docs/results/runs/multi30k-length/sinusoidal/seed1 docs/results/runs/multi30k-length/sinusoidal/seed2

Decodes each run's averaged checkpoint once per scaling (plain; dynamic-linear, dynamic-ntk
and dynamic-yarn, each at its sentence's source-length scale; linear/ntk/yarn at each
--factors value) and writes NAME.json and NAME.md: BLEU, length
ratio and runaways per source-length bucket, and paired bootstrap against plain RoPE past
the training length, into docs/results/rope_scaling_SCALE (--out to change it), which
`scripts/reproduce_table.sh collect --scale SCALE` shows in SCALE.md. A rerun decodes only
what is missing. A baseline is an evaluated run or, where its work directory is gone, its
committed record (BLEU and length per bucket, no runaways per bucket).
"""

import sys

from fairseq_rope.experiments.scaling_study import main

if __name__ == "__main__":
    sys.exit(main())
