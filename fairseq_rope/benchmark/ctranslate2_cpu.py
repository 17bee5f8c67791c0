"""CTranslate2 against fairseq-generate on CPU: speed, memory, BLEU and agreement of the
top hypotheses, for trained models on a test set; writes ``docs/benchmarks/ctranslate2-cpu.md``.

::

    scripts/benchmark_ctranslate2.py --model rope=CHECKPOINT --model sinusoidal=CHECKPOINT \\
        --data DATA [--subset test] [--threads 1 2] [--runs 3] [--limit N] [--work-dir DIR] [--out FILE]

DATA is a ``fairseq-rope-prepare`` directory: ``data-bin/`` (the binarized subset and the
dictionaries), ``bpe/codes`` and ``raw/SUBSET.TGT`` (sacreBLEU's references). Each model is
exported (:func:`fairseq_rope.deploy.export.export_checkpoint`) in float32 and int8, then every
engine decodes the whole subset with the tables' decoding (beam 4, lenpen 0.6, max-len-b 200):

* ``fairseq-generate``: the real command (:func:`fairseq_rope.evaluation.decoding.generate_command`);
* ``ctranslate2 float32`` and ``ctranslate2 int8``: ``python -m fairseq_rope.deploy.generate``,
  the same batches, fairseq-generate's output format.

Each decode is its own process with ``OMP_NUM_THREADS`` (and the engine's thread option) set
to the thread count; the processes run one at a time, ``--runs`` rounds of all of them in a
rotating order (so a slow phase of the machine hits every engine alike). Measured per process:

* decoding time: what the engine reports in fairseq-generate's summary line
  (``Translated N sentences (T tokens) in S s``): the search alone, without start-up, model
  loading, reading and writing; sentences/s and target tokens/s (EOS included) from it,
  median over the rounds; speed ratios paired per round (:func:`~fairseq_rope.benchmark.timing.paired_speedup`);
* the whole process's wall time, and its peak resident memory (``VmHWM``, reported by the
  process itself: :mod:`fairseq_rope.benchmark.peak_rss` says why not ``ru_maxrss``). Both
  processes import torch and fairseq (the CTranslate2 one to read the
  binarized data), so the difference is the engines' own. :mod:`fairseq_rope.benchmark.memory`
  counts torch's tensors, which CTranslate2's do not belong to: it gives the weights of the
  fairseq model (:func:`~fairseq_rope.benchmark.memory.tensor_bytes`), set beside the size of
  each exported ``model.bin``;
* BLEU under both conventions by the project's scoring (:mod:`fairseq_rope.evaluation.scoring`)
  and the share of top hypotheses identical to fairseq-generate's (same model, same threads).

Targets (issue 27): CTranslate2 float32 ≥ 99.5 % identical top hypotheses and BLEU within 0.05;
float32 ≥ 2× fairseq-generate's sentences/s, int8 ≥ 3× with BLEU within 0.5; inside
CTranslate2 RoPE ÷ sinusoidal sentences/s ≥ 0.97. Each is marked met or not, per model and
thread count. ``--limit N`` decodes the first N sentences only: for checking the script, not
for the report (its numbers say nothing).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, report_error
from fairseq_rope.benchmark import machine
from fairseq_rope.benchmark.peak_rss import measured_command
from fairseq_rope.benchmark.timing import paired_speedup, summarize
from fairseq_rope.evaluation.report import markdown_table

FAIRSEQ, FLOAT32, INT8 = "fairseq-generate", "ctranslate2 float32", "ctranslate2 int8"
ENGINES = (FAIRSEQ, FLOAT32, INT8)
QUANTIZATION = {FLOAT32: None, INT8: "int8"}
DEFAULT_OUT = machine.REPORTS_DIR / "ctranslate2-cpu.md"
#: fairseq-generate's summary line (and deploy.generate's, word for word).
SUMMARY = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in [\d.]+s \(([\d.]+) sentences/s")
MIB = 2 ** 20

#: Issue 27's targets.
AGREEMENT_TARGET = 0.995
FLOAT32_BLEU_TOLERANCE = 0.05
FLOAT32_SPEEDUP_TARGET = 2.0
INT8_SPEEDUP_TARGET = 3.0
INT8_BLEU_TOLERANCE = 0.5
ROPE_SINUSOIDAL_TARGET = 0.97


@dataclass
class Run:
    """One decode of the subset by one engine in its own process."""

    model: str
    engine: str
    threads: int
    round: int
    decode_seconds: float
    sentences: int
    process_seconds: float
    peak_rss_bytes: int
    output: str


# ---------------------------------------------------------------- inputs


def limited_data(data: Path, subset: str, limit: int, work: Path) -> Tuple[Path, Path]:
    """A data-bin and raw references holding only the first ``limit`` sentences of ``subset``."""
    from fairseq.data import Dictionary, data_utils, indexed_dataset

    source, target = _languages(data / "data-bin", subset)
    data_bin = work / "data" / "data-bin"
    data_bin.mkdir(parents=True, exist_ok=True)
    for lang in (source, target):
        shutil.copy(data / "data-bin" / f"dict.{lang}.txt", data_bin)
        prefix = f"{subset}.{source}-{target}.{lang}"
        dataset = data_utils.load_indexed_dataset(str(data / "data-bin" / prefix), None)
        vocabulary = len(Dictionary.load(str(data / "data-bin" / f"dict.{lang}.txt")))
        builder = indexed_dataset.make_builder(str(data_bin / f"{prefix}.bin"), impl="mmap", vocab_size=vocabulary)
        for i in range(min(limit, len(dataset))):
            builder.add_item(dataset[i])
        builder.finalize(str(data_bin / f"{prefix}.idx"))
    raw = work / "data" / "raw" / f"{subset}.{target}"
    raw.parent.mkdir(parents=True, exist_ok=True)
    base.write_lines(raw, base.read_lines(data / "raw" / f"{subset}.{target}")[:limit])
    return data_bin, raw


def _languages(data_bin: Path, subset: str) -> Tuple[str, str]:
    from fairseq_rope.evaluation.scoring import infer_language_pair

    return infer_language_pair(data_bin, subset)


def export_models(models: Dict[str, Path], data: Path, data_bin: Path, work: Path) -> Dict[Tuple[str, str], Path]:
    """(model, engine) → exported model directory, for both CTranslate2 engines."""
    from fairseq_rope.deploy.export import export_checkpoint

    dirs = {}
    for name, checkpoint in models.items():
        for engine, quantization in QUANTIZATION.items():
            out = work / "models" / f"{name}-{quantization or 'float32'}"
            export_checkpoint(checkpoint, out, data_bin=data_bin, bpe_codes=data / "bpe" / "codes",
                              quantization=quantization, force=True)
            dirs[name, engine] = out
    return dirs


def fairseq_weight_bytes(checkpoint: Path) -> int:
    """Bytes of the fairseq model's parameters and buffers (ties counted once)."""
    import torch

    from fairseq_rope.benchmark.memory import tensor_bytes
    from fairseq_rope.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint)["model"]
    return tensor_bytes(t for t in state.values() if isinstance(t, torch.Tensor))


# ---------------------------------------------------------------- one decode


def command(engine: str, model: str, checkpoints: Dict[str, Path], model_dirs, data_bin: Path, subset: str,
            threads: int) -> List[str]:
    from fairseq_rope.deploy.generate import generate_command as ct2_command
    from fairseq_rope.evaluation.decoding import generate_command

    if engine == FAIRSEQ:
        argv = generate_command(checkpoints[model], data_bin, subset)
        return [*base.fairseq_command(argv[0]), *argv[1:]]
    return ct2_command(model_dirs[model, engine], data_bin, subset, threads=threads)


def run_once(argv: Sequence[str], threads: int, output: Path, log: Path) -> Tuple[float, int, float, int]:
    """Run one decode process; (decode seconds, sentences, process seconds, peak RSS bytes)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    report = log.with_suffix(".peak_rss")
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    with open(output, "wb") as out, open(log, "wb") as err:
        returncode = subprocess.run(measured_command(argv, report), stdout=out, stderr=err, env=env).returncode
    seconds = time.perf_counter() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    if returncode != 0 or not report.is_file():
        raise FairseqRopeError(f"{' '.join(argv[:4])}... failed (log: {log}):\n{text[-2000:]}")
    match = SUMMARY.search(text)
    if match is None:
        raise FairseqRopeError(f"no 'Translated N sentences' summary in {log}")
    sentences = int(match.group(1).replace(",", ""))
    return sentences / float(match.group(3)), sentences, seconds, int(report.read_text())


# ---------------------------------------------------------------- quality


def quality(output: Path, data_bin: Path, subset: str, raw_reference: Path, out_dir: Path) -> Dict[str, Any]:
    """BLEU of a generate output under both conventions, and its hypotheses, by the project's scoring."""
    from fairseq_rope.evaluation import scoring

    source, target = _languages(data_bin, subset)
    translations = scoring.read_generate_output(output)
    results = scoring.evaluate_translations(
        translations, out_dir, target, raw_reference=raw_reference,
        expected_sentences=scoring.subset_size(data_bin, subset, source, target))
    return {"bleu_tokenized": results["bleu_tokenized"], "sacrebleu": results["sacrebleu"],
            "hypotheses": [t.hypothesis for t in translations],
            "target_tokens": sum(t.subwords + 1 for t in translations if t.subwords is not None)}


def agreement(hypotheses: Sequence[str], reference: Sequence[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, reference)) / len(reference)


# ---------------------------------------------------------------- the benchmark


def benchmark(checkpoints: Dict[str, Path], data: Path, subset: str, threads: Sequence[int], runs: int,
              work: Path, limit: Optional[int] = None, log=print) -> Dict[str, Any]:
    """Every measurement of the report (see the module docstring), as one JSON-able dict."""
    if limit is not None:
        data_bin, raw_reference = limited_data(data, subset, limit, work)
    else:
        data_bin = data / "data-bin"
        raw_reference = data / "raw" / f"{subset}.{_languages(data_bin, subset)[1]}"
    log(f"exporting {', '.join(checkpoints)} to float32 and int8 in {work / 'models'}")
    model_dirs = export_models(checkpoints, data, data_bin, work)
    configs = [(model, engine, n) for n in threads for model in checkpoints for engine in ENGINES]
    runs_done: List[Run] = []
    for round_ in range(runs):
        shift = round_ % len(configs)
        for model, engine, n in configs[shift:] + configs[:shift]:
            name = f"{model}-{engine.replace(' ', '-')}-t{n}-r{round_}"
            output, log_file = work / "outputs" / f"{name}.txt", work / "outputs" / f"{name}.log"
            output.parent.mkdir(parents=True, exist_ok=True)
            argv = command(engine, model, checkpoints, model_dirs, data_bin, subset, n)
            decode, sentences, process, rss = run_once(argv, n, output, log_file)
            runs_done.append(Run(model, engine, n, round_, decode, sentences, process, rss, str(output)))
            log(f"round {round_ + 1}/{runs}: {model} {engine} {n} thread(s): {sentences / decode:.2f} sentences/s, "
                f"peak RSS {rss / MIB:.0f} MiB")
    scores = {}
    for run in runs_done:
        if run.round == 0:
            scores[run.model, run.engine, run.threads] = quality(
                Path(run.output), data_bin, subset, raw_reference,
                work / "scores" / Path(run.output).stem)
    return {
        "machine": {**machine.describe(_cpu()), "ctranslate2": _ct2_version()},
        "subset": subset, "sentences": runs_done[0].sentences, "limit": limit, "threads": list(threads),
        "runs": [asdict(r) for r in runs_done],
        "weights_bytes": {**{f"{m}/{FAIRSEQ}": fairseq_weight_bytes(c) for m, c in checkpoints.items()},
                          **{f"{m}/{e}": (d / "model.bin").stat().st_size for (m, e), d in model_dirs.items()}},
        "scores": {f"{m}/{e}/{n}": s for (m, e, n), s in scores.items()},
    }


def _cpu():
    import torch

    return torch.device("cpu")


def _ct2_version() -> str:
    from fairseq_rope.deploy import require_ctranslate2

    return require_ctranslate2().__version__


# ---------------------------------------------------------------- the report


def summary(results: Dict[str, Any]) -> Dict[str, Any]:
    """Per (model, engine, threads): median rates, paired ratios, memory, scores; and the targets."""
    runs = results["runs"]
    table: Dict[str, Dict[str, Any]] = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        for n in results["threads"]:
            fairseq = _samples(runs, model, FAIRSEQ, n)
            reference = results["scores"][f"{model}/{FAIRSEQ}/{n}"]
            for engine in ENGINES:
                samples = _samples(runs, model, engine, n)
                score = results["scores"][f"{model}/{engine}/{n}"]
                mine = [r for r in runs if (r["model"], r["engine"], r["threads"]) == (model, engine, n)]
                sentences = mine[0]["sentences"]
                table[f"{model}/{engine}/{n}"] = {
                    "model": model, "engine": engine, "threads": n,
                    "sentences_per_s": sentences / statistics.median(samples),
                    "tokens_per_s": score["target_tokens"] / statistics.median(samples),
                    "speedup": paired_speedup(_stats(samples), _stats(fairseq)).median,
                    "process_seconds": statistics.median(r["process_seconds"] for r in mine),
                    "peak_rss_bytes": max(r["peak_rss_bytes"] for r in mine),
                    "weights_bytes": results["weights_bytes"][f"{model}/{engine}"],
                    "bleu_tokenized": score["bleu_tokenized"], "sacrebleu": score["sacrebleu"],
                    "agreement": agreement(score["hypotheses"], reference["hypotheses"]),
                    "delta_bleu": _delta(score, reference),
                }
    return {"table": table, "targets": targets(results, table)}


def _samples(runs, model: str, engine: str, threads: int) -> List[float]:
    rows = sorted((r for r in runs if (r["model"], r["engine"], r["threads"]) == (model, engine, threads)),
                  key=lambda r: r["round"])
    return [r["decode_seconds"] for r in rows]


def _stats(samples: Sequence[float]) -> Dict[str, Any]:
    return summarize(list(samples)).as_dict()


def _delta(score: Dict[str, Any], reference: Dict[str, Any]) -> float:
    """The larger |BLEU difference| of the two conventions (sacreBLEU if available)."""
    deltas = [abs(score["bleu_tokenized"] - reference["bleu_tokenized"])]
    if score["sacrebleu"] is not None and reference["sacrebleu"] is not None:
        deltas.append(abs(score["sacrebleu"] - reference["sacrebleu"]))
    return max(deltas)


def targets(results: Dict[str, Any], table: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each target per model and thread count: what was measured, and whether it is met."""
    out = []
    models = list(dict.fromkeys(r["model"] for r in results["runs"]))
    for n in results["threads"]:
        for model in models:
            f32, i8 = table[f"{model}/{FLOAT32}/{n}"], table[f"{model}/{INT8}/{n}"]
            out += [
                _target(f"{model}, {n} thread(s): float32 identical top hypotheses ≥ {AGREEMENT_TARGET:.1%}",
                        f"{f32['agreement']:.2%}", f32["agreement"] >= AGREEMENT_TARGET),
                _target(f"{model}, {n} thread(s): float32 BLEU within {FLOAT32_BLEU_TOLERANCE}",
                        f"±{f32['delta_bleu']:.2f}", f32["delta_bleu"] <= FLOAT32_BLEU_TOLERANCE),
                _target(f"{model}, {n} thread(s): float32 ≥ {FLOAT32_SPEEDUP_TARGET:g}× fairseq-generate",
                        f"{f32['speedup']:.2f}×", f32["speedup"] >= FLOAT32_SPEEDUP_TARGET),
                _target(f"{model}, {n} thread(s): int8 ≥ {INT8_SPEEDUP_TARGET:g}× fairseq-generate",
                        f"{i8['speedup']:.2f}×", i8["speedup"] >= INT8_SPEEDUP_TARGET),
                _target(f"{model}, {n} thread(s): int8 BLEU within {INT8_BLEU_TOLERANCE}",
                        f"±{i8['delta_bleu']:.2f}", i8["delta_bleu"] <= INT8_BLEU_TOLERANCE),
            ]
        if {"rope", "sinusoidal"} <= set(models):
            for engine in (FLOAT32, INT8):
                ratio = paired_speedup(_stats(_samples(results["runs"], "rope", engine, n)),
                                       _stats(_samples(results["runs"], "sinusoidal", engine, n))).median
                out.append(_target(f"{engine}, {n} thread(s): RoPE ÷ sinusoidal sentences/s ≥ "
                                   f"{ROPE_SINUSOIDAL_TARGET}", f"{ratio:.3f}", ratio >= ROPE_SINUSOIDAL_TARGET))
    return out


def _target(name: str, measured: str, met: bool) -> Dict[str, Any]:
    return {"target": name, "measured": measured, "met": met}


#: Where the runs are read by hand (why a target is not met).
READING = "Why a target is not met, run by run: `docs/benchmarks/README.md`, section CTranslate2."


def report(results: Dict[str, Any], script: str, argv: Optional[Sequence[str]]) -> List[str]:
    summarized = summary(results)
    described = results["machine"]
    header = ["model", "engine", "threads", "sentences/s", "tokens/s", "× fairseq-generate", "process s",
              "peak RSS MiB", "weights MiB", "BLEU (tok.)", "sacreBLEU", "identical to fairseq"]
    rows = [[row["model"], row["engine"], str(row["threads"]), f"{row['sentences_per_s']:.2f}",
             f"{row['tokens_per_s']:.1f}", f"{row['speedup']:.2f}", f"{row['process_seconds']:.1f}",
             f"{row['peak_rss_bytes'] / MIB:.0f}", f"{row['weights_bytes'] / MIB:.1f}",
             f"{row['bleu_tokenized']:.2f}", "—" if row["sacrebleu"] is None else f"{row['sacrebleu']:.2f}",
             f"{row['agreement']:.2%}"] for row in summarized["table"].values()]
    limited = results["limit"] is not None
    lines = [
        "# CTranslate2 against fairseq-generate on CPU",
        "",
        f"Written by `{base.command_line(script, argv)}` on {described['date']} (commit "
        f"{described['git_commit']}; {described['cpu']}, {described['cpu_cores_usable']} usable cores; "
        f"torch {described['torch']}, fairseq {described['fairseq']}, CTranslate2 {described['ctranslate2']}).",
        "",
        f"{results['sentences']} sentences of `{results['subset']}`"
        + (f" (the first {results['limit']} only: a check of the script, the numbers mean nothing)" if limited else "")
        + f", beam 4, length penalty 0.6, max-len-b 200; {len({r['round'] for r in results['runs']})} rounds. "
        "Each decode is its own process with OMP_NUM_THREADS set; sentences/s and tokens/s are from the "
        "engine's own decoding time (fairseq-generate's summary line), medians over the rounds; "
        "× fairseq-generate is paired per round; process s is the whole process (start-up, loading, "
        "decoding, writing); peak RSS the process's; weights: fairseq's tensors, CTranslate2's model.bin. "
        "Method: `fairseq_rope/benchmark/ctranslate2_cpu.py`.",
        "",
        *markdown_table(header, rows),
        "",
        "## Targets",
        "",
        *markdown_table(["target", "measured", "met"],
                        [[t["target"], t["measured"], "met" if t["met"] else "**not met**"]
                         for t in summarized["targets"]]),
        "",
        READING,
        "",
    ]
    return lines


# ---------------------------------------------------------------- command line


def _model(text: str) -> Tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=CHECKPOINT, got {text!r}")
    return name, Path(path)


def parse_args(argv: Sequence[str], prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=(
        "CTranslate2 (float32, int8) against fairseq-generate on CPU: speed, peak memory, BLEU and "
        "agreement of the top hypotheses; writes docs/benchmarks/ctranslate2-cpu.md (and .json)."))
    parser.add_argument("--model", type=_model, action="append", required=True, metavar="NAME=CHECKPOINT",
                        help="an averaged checkpoint; name the RoPE one 'rope' and the sinusoidal one "
                        "'sinusoidal' for their speed ratio")
    parser.add_argument("--data", type=Path, required=True,
                        help="a fairseq-rope-prepare directory (data-bin/, bpe/codes, raw/)")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3, help="rounds (median of at least 3 for the report)")
    parser.add_argument("--limit", type=int, help="the first N sentences only (checks the script)")
    parser.add_argument("--work-dir", type=Path, help="exports and outputs (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    args = parser.parse_args(argv)
    if args.runs < 1 or min(args.threads) < 1:
        parser.error("--runs and --threads must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/benchmark_ctranslate2.py") -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    checkpoints = dict(args.model)
    try:
        for path in [*checkpoints.values(), args.data / "data-bin", args.data / "bpe" / "codes"]:
            if not path.exists():
                raise FairseqRopeError(f"{path}: no such file or directory")
        if args.work_dir:
            args.work_dir.mkdir(parents=True, exist_ok=True)
        with (nullcontext(str(args.work_dir)) if args.work_dir
              else tempfile.TemporaryDirectory(prefix="ct2-bench-")) as work:
            results = benchmark(checkpoints, args.data, args.subset, args.threads, args.runs, Path(work),
                                args.limit, log=lambda m: print(m, file=sys.stderr))
            lines = report(results, prog, argv)
    except FairseqRopeError as e:
        return report_error(e)
    # Without the hypotheses (a megabyte for 1000 sentences × 12 decodes): the agreement is in
    # the summary, and the outputs are in --work-dir.
    scores = {key: {k: v for k, v in score.items() if k != "hypotheses"} for key, score in results["scores"].items()}
    base.write_json(args.out.with_suffix(".json"), {**results, "scores": scores, "summary": summary(results)})
    machine.publish(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
