#!/usr/bin/env python3
"""Host cost of one decoding step, RoPE against stock (see fairseq_rope/benchmark/step_host.py).

    .venv/bin/python scripts/decoding_step_host_cost.py [--size base] [--length 32] [--reps 7] [--out FILE]
"""

import sys

from fairseq_rope.benchmark.step_host import main

if __name__ == "__main__":
    sys.exit(main())
