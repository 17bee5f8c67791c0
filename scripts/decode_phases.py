#!/usr/bin/env python3
"""Where a beam search's time goes, module by module (see fairseq_rope/benchmark/phases.py).

    .venv/bin/python scripts/decode_phases.py [--size tiny] [--length 32] [--reps 15] [--threads 2]
"""

import sys

from fairseq_rope.benchmark.phases import main

if __name__ == "__main__":
    sys.exit(main())
