#!/usr/bin/env python3
"""CTranslate2 (float32, int8) against fairseq-generate on CPU: speed, memory, BLEU, agreement
(see fairseq_rope/benchmark/ctranslate2_cpu.py); writes docs/benchmarks/ctranslate2-cpu.md.

    .venv/bin/python scripts/benchmark_ctranslate2.py --model rope=CHECKPOINT --model sinusoidal=CHECKPOINT \
        --data DATA [--threads 1 2] [--runs 3] [--limit N] [--out FILE]
"""

import sys

from fairseq_rope.benchmark.ctranslate2_cpu import main

if __name__ == "__main__":
    sys.exit(main())
