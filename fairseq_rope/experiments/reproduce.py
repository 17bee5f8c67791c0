"""One command per row of the RoFormer table, and ``collect`` to make the table.

``scripts/reproduce_table.sh ROW [--scale S] [--seed N] [-- EXTRA]`` runs one
row at one scale (see :mod:`fairseq_rope.experiments.table` for rows, scales and the work
directory layout), each step resumable:

1. prepare the scale's data unless done: the demo corpus (or the
   length-extrapolation corpus) through ``scripts/prepare_parallel.sh``, or
   WMT14 through ``scripts/prepare_wmt14_en_de.sh``;
2. train ``configs/<row>_<size>.yaml`` with ``scripts/train.sh`` and
   ``--seed N`` (EXTRA fairseq-train arguments last); a rerun resumes an
   unfinished run and leaves one that reached ``--max-update`` as it is;
3. average the last 5 checkpoints, decode and score with ``scripts/evaluate.sh``
   (skipped when training was and results exist); for ``demo-length`` also
   BLEU per source-length bucket;
4. write ``eval/run.json`` beside ``results.json``
   (:mod:`fairseq_rope.experiments.summary`): the run's row, scale, seed, config,
   arch, parameter count, training speed and wall time, number of updates, BLEU
   and validation-loss curve — what ``collect`` tabulates (at a converged scale, also
   ``eval-budget/run.json`` as soon as the equal budget is scored, before training goes on).

``scripts/reproduce_table.sh collect [--scale S]`` is :mod:`fairseq_rope.experiments.collect`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_rope import base
from fairseq_rope.base import report_error, split_passthrough
from fairseq_rope.data.data_bin import infer_language_pair
from fairseq_rope.data.demo_corpus import write_corpus
from fairseq_rope.data.prepare.multi30k import DEFAULT_VOCAB_SIZE as MULTI30K_VOCAB_SIZE
from fairseq_rope.evaluation.bleu_by_length import length_report
from fairseq_rope.experiments import collect
from fairseq_rope.experiments.config import load_experiment, resolve_config
from fairseq_rope.experiments.convergence import Rule, StopAtConvergence, convergence_record, describe
from fairseq_rope.experiments.device import CHOICES as DEVICE_CHOICES, CPU, Device
from fairseq_rope.experiments.length_corpus import longest_training_pair, write_length_corpus, write_short_pairs
from fairseq_rope.experiments.summary import summarize_budget, summarize_run
from fairseq_rope.experiments.table import (
    ABLATIONS,
    BUDGET_EVAL_DIR,
    DEFAULT_RESULTS_DIR,
    DEFAULT_WORK_DIR,
    DEMO_CORPUS,
    DEMO_VOCAB_SIZE,
    EVAL_DIR,
    ROWS,
    SCALES,
    Row,
    Scale,
    TableError,
    config_name,
    data_dir,
    get_row,
    get_scale,
    rows_at,
    run_dir,
    scale_dir,
    summary_path,
)
from fairseq_rope.experiments.train_log import read_train_log

# Set by reproduce_table.sh itself: an extra argument must not redirect them.
RESERVED_EXTRA = ("--seed", "--save-dir", "--user-dir", "--cpu")

WMT14_LENGTH_HELP = """\
Length extrapolation: --scale demo-length trains a row on synthetic sentences of
at most 14 words and tests on 6 buckets of 7 words up to 42 (150 sentences
each); run.json gets BLEU per bucket and collect a length table and plot.
The WMT14 analogue is not automated: keep the training pairs of at most 50 BPE
tokens on both sides (filter WORK_DIR/wmt14/data/bpe/train.clean.{en,de} and
binarize them with fairseq-preprocess --joined-dictionary --srcdict
DATA_BIN/dict.en.txt so the vocabulary stays the same), train each row on that
data-bin with the same config, evaluate on the full newstest2014 and run
  scripts/bleu_by_length.py RUN_DIR/eval --edges 10,20,30,40,50,60,80
(length in Moses-tokenized source words). Do not use --max-source-positions 50
instead: it also caps the test sentences fairseq decodes and shrinks the learned
row's table. The learned row keeps its 1024 positions, of which those past the
longest training sentence stay untrained."""


# --- Steps


def prepare_data(scale: Scale, work_dir: Path, raw_dir: Optional[str] = None) -> Path:
    """Prepare the scale's data unless done (every step resumes); return its data-bin."""
    out = data_dir(work_dir, scale)
    if scale.data in ("wmt14", "multi30k") and scale.max_train_words is None:
        # data-bin/ appears atomically as the last step. Once it is there, do not
        # rerun the preparation without --raw-dir: it would look for the release
        # files in OUT/orig and download them if they were read from elsewhere.
        if (out / "data-bin").is_dir() and raw_dir is None:
            print(f"{scale.data} data already prepared in {out}", file=sys.stderr)
        else:
            pair = ["--tgt", scale.tgt] if scale.data == "multi30k" else []
            run_step([*entry_point("data.prepare.cli"), scale.data, *pair,
                      *(["--raw-dir", raw_dir] if raw_dir else []), out])
        return out / "data-bin"
    corpus = scale_dir(work_dir, scale) / "corpus"
    vocab_size, clean = DEMO_VOCAB_SIZE, True
    if scale.data == "multi30k":  # a length study: the short pairs of the full corpus
        full = prepare_data(get_scale(scale.data), work_dir, raw_dir).parent / "raw"
        write_short_pairs(full, corpus, scale.max_train_words)
        vocab_size, clean = MULTI30K_VOCAB_SIZE, False
    elif scale.length_study is not None:
        write_length_corpus(corpus, scale.length_study)
    elif not (corpus / "test.de").is_file():  # write_corpus writes test.de last
        write_corpus(corpus, DEMO_CORPUS["train"], DEMO_CORPUS["valid"], DEMO_CORPUS["test"])
    run_step([*entry_point("data.prepare.cli"), "parallel", "--src", "en", "--tgt", "de",
          "--vocab-size", str(vocab_size), *([] if clean else ["--no-clean"]),
          "--trainpref", corpus / "train", "--validpref", corpus / "valid",
          "--testpref", corpus / "test", out])
    return out / "data-bin"


def train(config: Path, data_bin: Path, save_dir: Path, seed: int, extra: Sequence[str],
          device: Device = CPU) -> Optional[float]:
    """``scripts/train.sh``, resuming ``save_dir``; returns its wall time in seconds.

    A run whose log already reaches ``--max-update``, or whose validations
    already meet its convergence rule (``--patience``, see
    :mod:`fairseq_rope.experiments.convergence`), is left alone (returns None):
    fairseq-train resuming it would still take one more update and write
    another checkpoint, changing the run a rerun should only re-report.
    """
    rule = Rule.from_argv(train_argv(config, extra))
    if (save_dir / "train.log").is_file():
        log = read_train_log(save_dir)
        done = log.num_updates
        if rule.max_update > 0 and done is not None and done >= rule.max_update:
            print(f"{save_dir}: already trained ({done} updates, --max-update {rule.max_update})",
                  file=sys.stderr)
            return None
        stop = StopAtConvergence(train_argv(config, extra), log)  # what train.sh would say
        converged = stop.converged()
        if converged is not None:
            print(f"{save_dir}: already {describe(converged, stop.rule)}", file=sys.stderr)
            return None
    start = time.monotonic()
    run_step([*entry_point("experiments.training"), config, data_bin, save_dir, "--seed", str(seed), *extra],
             device)
    return time.monotonic() - start


def evaluate(save_dir: Path, data_bin: Path, upper_bound: Optional[int] = None,
             eval_dir: str = EVAL_DIR, device: Device = CPU) -> None:
    """``scripts/evaluate.sh``: average the last 5 checkpoints (up to ``upper_bound``), decode,
    score into ``save_dir/eval_dir``.

    ``--force``: called only when training just changed the checkpoints or no
    evaluation finished, so existing results are stale by construction.
    """
    bound = [] if upper_bound is None else ["--upper-bound", str(upper_bound)]
    run_step([*entry_point("evaluation.evaluate"), save_dir, data_bin, "--eval-dir", eval_dir, *bound, "--force"],
             device)


def convergence_of(save_dir: Path, config: Path, extra: Sequence[str]) -> Dict[str, Any]:
    """Where the run's convergence rule stops it, from its log (TableError if it has not converged:
    a run of a converged scale stopped by something else, such as a time limit, resumes)."""
    argv = train_argv(config, extra)
    curve = read_train_log(save_dir).valid_bleu
    record = convergence_record(argv, curve)
    if record is None:
        rule = Rule.from_argv(argv)
        raise TableError(f"{save_dir} has not converged by its rule (patience {rule.patience}, cap "
                         f"{rule.max_update}; last validation at update {max(curve, default=0)}): "
                         "rerun to resume it")
    return record


def train_argv(config: Path, extra: Sequence[str]) -> List[str]:
    """The config's fairseq-train options followed by ``extra`` (which override them)."""
    return [*load_experiment(config).argv(), *extra]


def entry_point(module: str) -> List[str]:
    """The command running one of the package's entry points with this interpreter."""
    return [sys.executable, "-m", f"fairseq_rope.{module}"]


def run_step(command: Sequence[Any], device: Device = CPU) -> None:
    """Run one step of a row in a subprocess that sees ``device`` only."""
    command = [str(c) for c in command]
    print(f"\n==> [{device}] {' '.join(shlex.quote(c) for c in command)}", file=sys.stderr, flush=True)
    if subprocess.run(command, env=device.environment()).returncode != 0:
        raise TableError(f"{' '.join(command[1:3])} failed (its output is above)")


def reproduce_command(
    row: Row, scale: Scale, seed: int, extra: Sequence[str] = (), work_dir: Optional[Path] = None,
    device: Device = CPU,
) -> str:
    """The reproduce_table.sh command line of a run (``--work-dir`` only when not the default;
    ``--device`` only for a GPU: the default runs on the CPU where torch sees none)."""
    words = ["scripts/reproduce_table.sh", row.name, "--scale", scale.name, "--seed", str(seed)]
    if work_dir is not None and Path(work_dir).resolve() != DEFAULT_WORK_DIR.resolve():
        words += ["--work-dir", str(work_dir)]
    if device.kind != "cpu":
        words += ["--device", str(device)]
    if extra:
        words += ["--", *extra]
    return " ".join(shlex.quote(w) for w in words)


def length_results(scale: Scale, save_dir: Path, data_bin: Path, eval_dir: str = EVAL_DIR) -> Dict[str, Any]:
    """BLEU per source-length bucket (raw English words) of the evaluated test set."""
    assert scale.bucket_edges
    report = length_report(save_dir / eval_dir / "generate-test.txt", scale.bucket_edges,
                           source_file=data_bin.parent / "raw" / "test.en")
    base.write_json(save_dir / eval_dir / "bleu_by_length.json", report)
    return {**report, "max_train_len": scale.max_train_len,
            "longest_training_pair_tokens": longest_training_pair(data_bin)}


def reproduce_row(
    row: Row, scale: Scale, seed: int, work_dir: Path, extra: Sequence[str] = (),
    raw_dir: Optional[str] = None, device: Optional[Device] = None,
) -> Dict[str, Any]:
    """Prepare, train, evaluate and summarize one run on ``device`` (default: the first GPU if
    torch sees one, else the CPU); returns its run.json.

    At a converged scale the run first trains to the scale's equal budget, whose
    last 5 checkpoints are averaged and scored into ``eval-budget/`` (with its summary there,
    :func:`summarize_budget`) before training goes on (and deletes them), then to its
    convergence rule; ``eval/``
    then holds the average of the last 5 checkpoints up to the update where the
    rule stops it. Both come from one trajectory: a run resumes bit-identically.
    """
    bad = [arg for arg in extra if arg.split("=", 1)[0] in RESERVED_EXTRA]
    if bad:
        raise TableError(f"{bad[0]} cannot be an extra fairseq-train argument: "
                         "reproduce_table.sh sets it (use --seed / --work-dir / --device)")
    if raw_dir is not None and scale.data not in ("wmt14", "multi30k"):
        raise TableError(f"--raw-dir is for the wmt14 and multi30k scales; scale {scale.name} "
                         "generates its corpus")
    device = Device.resolve() if device is None else device
    config = resolve_config(config_name(row, scale))
    data_bin = prepare_data(scale, work_dir, raw_dir)
    check_language_pair(scale, data_bin)
    save_dir = run_dir(work_dir, scale, row, seed)
    command = reproduce_command(row, scale, seed, extra, work_dir, device)
    trained, convergence, budget_length = [], None, None
    if scale.equal_budget is not None:
        budget = scale.equal_budget
        trained.append(train(config, data_bin, save_dir, seed, [*extra, "--max-update", str(budget)], device))
        if trained[-1] is not None or not (save_dir / BUDGET_EVAL_DIR / "results.json").is_file():
            evaluate(save_dir, data_bin, upper_bound=budget, eval_dir=BUDGET_EVAL_DIR, device=device)
        budget_length = length_results(scale, save_dir, data_bin, BUDGET_EVAL_DIR) if scale.bucket_edges else None
        summarize_budget(row, scale, seed, save_dir, config, command, extra, budget_length)
    trained.append(train(config, data_bin, save_dir, seed, extra, device))
    if scale.equal_budget is not None:
        convergence = convergence_of(save_dir, config, extra)
    seconds = None if all(t is None for t in trained) else sum(t or 0.0 for t in trained)
    if seconds is not None or not (save_dir / EVAL_DIR / "results.json").is_file():
        evaluate(save_dir, data_bin, upper_bound=convergence["update"] if convergence else None, device=device)
    length = length_results(scale, save_dir, data_bin) if scale.bucket_edges else None
    return summarize_run(row, scale, seed, save_dir, config, command, extra, seconds, length,
                         convergence=convergence, budget_length=budget_length)


def check_language_pair(scale: Scale, data_bin: Path) -> None:
    """The prepared test set is the scale's pair, which its run.json records (a work directory
    prepared for another pair would otherwise be trained on and recorded under this scale)."""
    pair = "-".join(infer_language_pair(data_bin, "test"))
    if pair != scale.language_pair:
        raise TableError(f"{data_bin} holds {pair} data, but scale {scale.name} is {scale.language_pair}")


# --- Command line


def _run_parser() -> argparse.ArgumentParser:
    ablations = ", ".join(f"{name} (at {', '.join(row.scales)})" for name, row in ABLATIONS.items())
    parser = argparse.ArgumentParser(
        prog="scripts/reproduce_table.sh",
        usage="%(prog)s ROW [--scale SCALE] [--seed N] [--device DEVICE] [--work-dir DIR] [--raw-dir DIR] "
              "[-- extra fairseq-train args]\n       %(prog)s collect [--scale SCALE] "
              "[--work-dir DIR] [--out-dir DIR]\n       %(prog)s prepare [--scale SCALE] [--work-dir DIR] "
              "[--raw-dir DIR]",
        description="Run one row of the RoFormer table (prepare data, train, average, decode, "
        "score, write RUN_DIR/eval/run.json), or `collect` the finished runs of a scale into "
        "docs/results/SCALE.md with plots.",
        epilog=f"rows: {', '.join(ROWS)}; ablations: {ablations}. scales: {', '.join(SCALES)}. "
        "A run lives in WORK_DIR/SCALE/ROW/seedN; rerunning resumes it.\n\n" + WMT14_LENGTH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("row", metavar="ROW", help=f"one of {', '.join(ROWS)}, or an ablation at its scales")
    _add_common(parser)
    parser.add_argument("--seed", type=int, default=1, help="training seed (default: 1)")
    parser.add_argument("--device", default="auto",
                        help=f"{DEVICE_CHOICES}: where the run trains and decodes (default: auto, the "
                        "first GPU torch sees, else the CPU); training and decoding see this device only")
    _add_raw_dir(parser)
    return parser


def _collect_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/reproduce_table.sh collect",
        description="Gather every finished run of a scale into a markdown table and plots.",
    )
    _add_common(parser)
    parser.add_argument("--out-dir", default=str(DEFAULT_RESULTS_DIR),
                        help="where SCALE.md and the plots go (default: docs/results)")
    return parser


def _prepare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/reproduce_table.sh prepare",
        description="Prepare a scale's data only (before starting several rows at once, which "
        "would otherwise each prepare it); prints its data-bin.",
    )
    _add_common(parser)
    _add_raw_dir(parser)
    return parser


def _add_raw_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw-dir", help="wmt14: directory with the WMT14 archives; the multi30k "
                        "scales: directory with the Multi30k release files of the scale's pair "
                        "(default: download them)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", default="demo", help=f"one of {', '.join(SCALES)} (default: demo)")
    parser.add_argument("--work-dir", default=str(DEFAULT_WORK_DIR),
                        help="where data and runs live (default: work/ in the repository)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    try:
        if own[:1] == ["collect"]:
            if extra:
                raise TableError("collect takes no extra fairseq-train arguments")
            args = _collect_parser().parse_args(own[1:])
            paths = collect.collect(get_scale(args.scale), Path(args.work_dir), Path(args.out_dir))
            print("\n".join(map(str, paths)))
            return 0
        if own[:1] == ["prepare"]:
            if extra:
                raise TableError("prepare takes no extra fairseq-train arguments")
            args = _prepare_parser().parse_args(own[1:])
            print(prepare_data(get_scale(args.scale), Path(args.work_dir).resolve(), args.raw_dir))
            return 0
        args = _run_parser().parse_args(own)
        scale = get_scale(args.scale)
        if args.row not in rows_at(scale):
            raise TableError(f"unknown row {args.row!r} at scale {scale.name}; valid rows: "
                             f"{', '.join(rows_at(scale))} (or `collect` to make the table)")
        row = get_row(args.row, scale)
        summary = reproduce_row(row, scale, args.seed, Path(args.work_dir).resolve(), extra, args.raw_dir,
                                Device.resolve(args.device))
    except TableError as e:
        return report_error(e, 2)
    print(f"{summary_path(run_dir(args.work_dir, scale, row, args.seed))}: "
          f"BLEU {summary['bleu_tokenized']:.2f} (tokenized, compound-split), "
          f"sacreBLEU {_format_optional(summary['sacrebleu'])}")
    return 0


def _format_optional(value: Optional[float]) -> str:
    return "unavailable" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
