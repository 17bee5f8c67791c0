#!/usr/bin/env python3
"""Operator profile of a training step and a beam search, RoPE against stock (see fairseq_rope/benchmark/profile.py).

    .venv/bin/python scripts/profile_step.py [--size tiny] [--length 64] [--steps 5] [--top 25]
        [--device cpu|cuda] [--dtype fp32|fp16|bf16] [--out-dir DIR]
"""

import sys

from fairseq_rope.benchmark.profile import main

if __name__ == "__main__":
    sys.exit(main())
