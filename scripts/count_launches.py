#!/usr/bin/env python3
"""Kernel launches per training step and per beam search, RoPE against stock (see fairseq_rope/benchmark/launches.py).

    .venv/bin/python scripts/count_launches.py [--size tiny|base] [--device cpu|cuda] [--dtype fp32|fp16|bf16]
        [--length 16] [--sentences 4] [--out FILE]
"""

import sys

from fairseq_rope.benchmark.launch_counts import main

if __name__ == "__main__":
    sys.exit(main())
