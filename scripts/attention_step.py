#!/usr/bin/env python3
"""One self-attention layer through a beam search, RoPE against fairseq's stock module (see fairseq_rope/benchmark/step.py).

    .venv/bin/python scripts/attention_step.py [--dims 64x2,512x8] [--steps 16,64] [--reps 30]
"""

import sys

from fairseq_rope.benchmark.step import main

if __name__ == "__main__":
    sys.exit(main())
