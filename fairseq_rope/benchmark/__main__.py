import sys

from fairseq_rope.benchmark.cli import main

sys.exit(main(prog="python -m fairseq_rope.benchmark"))
