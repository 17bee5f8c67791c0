#!/usr/bin/env python3
"""Speed and memory of RoPE vs fairseq's stock Transformer (see fairseq_rope/benchmark/).

    .venv/bin/python scripts/benchmark.py                    # Transformer-base, all lengths → docs/benchmarks/
    .venv/bin/python scripts/benchmark.py --size tiny --reps 5
    .venv/bin/python scripts/benchmark.py --smoke --out-dir /tmp/bench   # structure check, seconds

Writes OUT_DIR/NAME.json, NAME.md and NAME_{ops,train,decode}.png (NAME: the device).
"""

import sys

from fairseq_rope.benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())
