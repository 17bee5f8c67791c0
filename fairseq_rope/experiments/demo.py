"""``make demo``: the whole pipeline on the embedded synthetic En→De corpus, on CPU, in minutes.

generate the corpus → prepare (Moses tokenization, joint BPE, cleaning,
fairseq-preprocess) → train ``configs/rope_demo.yaml`` (transformer_rope_tiny
with the paper's optimizer and schedule) → average the last 5 checkpoints →
decode with beam 4 / lenpen 0.6 → tokenized and detokenized BLEU.

``fairseq-rope-demo [WORK_DIR]`` (default ``demo/``; ``scripts/demo.sh`` is the
same command). Every step resumes: a rerun skips what is finished.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from fairseq_rope.base import report_error
from fairseq_rope.data.demo_corpus import write_corpus
from fairseq_rope.experiments.reproduce import entry_point, run_step
from fairseq_rope.experiments.table import DEMO_CORPUS, DEMO_VOCAB_SIZE, TableError

CONFIG = "rope_demo"


def step(text: str) -> None:
    print(f"\n==> {text}", file=sys.stderr, flush=True)


def run_demo(work: Path) -> None:
    corpus, data, checkpoints = work / "corpus", work / "data", work / "checkpoints"
    step(f"1/4 synthetic corpus (fairseq_rope/data/demo_corpus.py) -> {corpus}")
    if not (corpus / "test.de").is_file():  # written last
        write_corpus(corpus, DEMO_CORPUS["train"], DEMO_CORPUS["valid"], DEMO_CORPUS["test"])

    step(f"2/4 prepare: tokenize, joint BPE, clean, binarize -> {data}")
    run_step([*entry_point("data.prepare.cli"), "parallel", "--src", "en", "--tgt", "de",
              "--vocab-size", DEMO_VOCAB_SIZE, "--trainpref", corpus / "train",
              "--validpref", corpus / "valid", "--testpref", corpus / "test", data])

    # A finished demo is left as it is: resuming fairseq-train would resave
    # checkpoint_last.pt even with nothing left to train.
    results = checkpoints / "eval" / "results.json"
    if results.is_file():
        step(f"3/4, 4/4 already trained and evaluated: {results}")
        return
    step(f"3/4 train configs/{CONFIG}.yaml -> {checkpoints}")
    run_step([*entry_point("experiments.training"), CONFIG, data / "data-bin", checkpoints])
    step("4/4 average the last 5 checkpoints, decode (beam 4, lenpen 0.6), score")
    run_step([*entry_point("evaluation.evaluate"), checkpoints, data / "data-bin"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fairseq-rope-demo", description=__doc__.split("\n")[0])
    parser.add_argument("work_dir", nargs="?", default="demo", type=Path, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        run_demo(args.work_dir)
    except TableError as e:
        return report_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
