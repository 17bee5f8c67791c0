"""Command line of the benchmark suite (``scripts/benchmark.py``, ``python -m fairseq_rope.benchmark``)."""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_rope.benchmark import machine, models, ops, report, timing
from fairseq_rope.benchmark.report import ROPE, STOCK, fmt_rate, fmt_time

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_OUT_DIR = machine.REPORTS_DIR


@dataclass(frozen=True)
class Preset:
    """Sizes of one run. ``heads``/``head_dim`` of the op level are the arch's own."""

    size: str
    vocab: int
    heads: int
    head_dim: int
    op_tokens: int
    train_tokens: int
    decode_sentences: int
    op_lengths: Tuple[int, ...]
    train_lengths: Tuple[int, ...]
    decode_lengths: Tuple[int, ...]
    reps: int
    warmup: int
    min_sample_ms: float
    model_sample_ms: float = 0.0  # model level: steps per sample, as many as last this long


OP_LENGTHS = (32, 64, 128, 256, 512, 1024)
PRESETS: Dict[str, Preset] = {
    # Transformer-base (512 / 8 heads), the WMT14 recipe's 4096 tokens per batch and 37k vocabulary.
    # On a GPU a step is ~50 ms and the machine's phases move medians by a few %: samples of
    # >= 250 ms (several steps) and 15 interleaved repetitions, so that the learned control can
    # read 1.00 ± 0.01 (paired ratios, repetition by repetition).
    "base": Preset("base", models.VOCAB["base"], 8, 64, 4096, 4096, 32, OP_LENGTHS, (32, 64, 128, 256),
                   (32, 64), reps=15, warmup=3, min_sample_ms=20.0, model_sample_ms=250.0),
    # transformer_tiny: 64 dims / 2 heads.
    "tiny": Preset("tiny", models.VOCAB["tiny"], 2, 32, 2048, 2048, 16, OP_LENGTHS, (32, 64, 128, 256),
                   (16, 32, 64), reps=10, warmup=2, min_sample_ms=20.0),
    # Structure only: every code path once or twice, in seconds; the numbers mean nothing.
    "smoke": Preset("tiny", 64, 2, 32, 256, 128, 2, (32, 64), (8, 16), (8,),
                    reps=2, warmup=1, min_sample_ms=0.0),
}


def _lengths(text: str) -> Tuple[int, ...]:
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths >= 2, got {text!r}")
    return values


def _dtypes(text: str) -> Tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [v for v in values if v not in DTYPES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"dtypes must be among {', '.join(DTYPES)}, got {text!r}")
    return values


ALL_ROWS = ("sinusoidal", "learned", "rpe", "rope", "rope_pytorch")
#: Without --rows: rope_pytorch only when asked for (it differs from rope only on a GPU).
DEFAULT_ROWS = ALL_ROWS[:4]


def _rows(text: str) -> Tuple[str, ...]:
    values = {x.strip() for x in text.split(",") if x.strip()} | {STOCK, ROPE}
    unknown = values - set(ALL_ROWS)
    if unknown:
        raise argparse.ArgumentTypeError(f"rows must be among {', '.join(ALL_ROWS)}, got {text!r}")
    return tuple(r for r in ALL_ROWS if r in values)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(
        "Side-by-side speed and memory of RoPE vs fairseq's stock Transformer (and the "
        "learned and RPE rows), op level and model level; writes OUT_DIR/NAME.json, .md and plots."))
    p.add_argument("--size", choices=("base", "tiny"), default="base",
                   help="Transformer-base archs (default) or the *_tiny archs for quick runs")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, 2 reps, a few lengths: checks the script, not the speed "
                   "(requires --out-dir)")
    p.add_argument("--out-dir", type=Path, help=f"default {DEFAULT_OUT_DIR}")
    p.add_argument("--name", help="output file stem (default: device, e.g. cpu, cpu-tiny, "
                   "nvidia-h100-80gb-hbm3)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if present, else cpu)")
    p.add_argument("--dtypes", type=_dtypes,
                   help="comma-separated among fp32,fp16,bf16 (default: fp32 on CPU, all three on CUDA)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's default)")
    p.add_argument("--reps", type=int, help="timed repetitions per candidate")
    p.add_argument("--warmup", type=int, help="untimed calls per candidate before timing")
    p.add_argument("--op-lengths", type=_lengths, help="comma-separated, op level")
    p.add_argument("--train-lengths", type=_lengths, help="comma-separated, training")
    p.add_argument("--decode-lengths", type=_lengths, help="comma-separated, decoding")
    p.add_argument("--op-tokens", type=int, help="batch × T at the op level")
    p.add_argument("--train-tokens", "--max-tokens", type=int, dest="train_tokens",
                   help="target tokens per training batch (fairseq's --max-tokens: 4096 per GPU in the "
                   "WMT14 recipe, 16384 realistic on an H100)")
    p.add_argument("--decode-sentences", type=int, help="sentences per decoding batch")
    p.add_argument("--vocab", type=int, help="symbols of the synthetic joined dictionary")
    p.add_argument("--dropout", type=float, default=0.1, help="all rows (the archs' default 0.1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rows", type=_rows, help=f"comma-separated among {','.join(ALL_ROWS)} (default: "
                   f"{','.join(DEFAULT_ROWS)}; {STOCK} and {ROPE} always; rope_pytorch: {ROPE} "
                   "with FAIRSEQ_ROPE_TRITON=0)")
    p.add_argument("--model-sample-ms", type=float, help="model level: each sample as many steps as last this long")
    p.add_argument("--max-seconds", type=float,
                   help="time box: measurements not started by then are skipped, and what was measured "
                   "is written (the GPU suite's benchmark step)")
    p.add_argument("--skip-ops", action="store_true")
    p.add_argument("--skip-models", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    return p


def resolve(args: argparse.Namespace) -> Preset:
    """The preset of --size/--smoke with the explicit options applied."""
    preset = PRESETS["smoke" if args.smoke else args.size]
    overrides = {field: getattr(args, field) for field in (
        "reps", "warmup", "op_lengths", "train_lengths", "decode_lengths", "op_tokens",
        "train_tokens", "decode_sentences", "vocab", "model_sample_ms") if getattr(args, field) is not None}
    return replace(preset, **overrides)


def main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/benchmark.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.smoke and args.out_dir is None:
        parser.error("--smoke needs --out-dir (smoke numbers do not belong in docs/benchmarks)")
    preset = resolve(args)
    if preset.reps < 1 or preset.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    dtypes = args.dtypes or (("fp32", "fp16", "bf16") if device.type == "cuda" else ("fp32",))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    suffix = "-smoke" if args.smoke else ("-tiny" if args.size == "tiny" else "")
    name = args.name or machine.device_slug(device) + suffix
    out_dir = args.out_dir or DEFAULT_OUT_DIR

    results: Dict[str, Any] = {
        "schema": 1, "name": name, "command": shlex.join([prog, *argv]),
        "machine": machine.describe(device),
        "settings": {**asdict(preset), "smoke": args.smoke, "dtypes": list(dtypes),
                     "dropout": args.dropout, "seed": args.seed, "stock_row": STOCK},
        "ops": {}, "models": {},
    }
    print(f"# {name}: {results['machine']['cpu']}, {torch.get_num_threads()} threads, "
          f"device {device}, dtypes {', '.join(dtypes)}", flush=True)
    clock = Deadline(args.max_seconds)
    rows = args.rows or DEFAULT_ROWS
    results["settings"]["rows"] = list(rows)
    if not args.skip_ops:
        for dtype in dtypes:
            if clock.passed(f"op level, {dtype}"):
                break
            results["ops"][dtype] = run_ops(preset, device, dtype, args.seed)
    if not args.skip_models:
        with tempfile.TemporaryDirectory(prefix="fairseq-rope-bench-") as tmp:
            data_dir = models.write_dictionary(Path(tmp), preset.vocab)
            for dtype in dtypes:
                if clock.passed(f"model level, {dtype}"):
                    break
                results["models"][dtype] = run_models(
                    preset, data_dir, device, dtype, args.dropout, args.seed, not args.skip_decode, rows, clock)
    results["skipped"] = clock.skipped
    paths = report.write_outputs(results, out_dir)
    print("\n# targets")
    for t in results["targets"]:
        median, worst = (report.optional_ratio(t[k]) for k in ("median", "worst"))
        print(f"{t['dtype']:>5}  {t['target']:<45} {t['goal']:<40} median {median:>6}  worst {worst:>6}"
              f"  {t['status']}")
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


class Deadline:
    """--max-seconds: whether a measurement may still start; what was skipped, for the report."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds
        self.skipped: List[str] = []

    def passed(self, what: str) -> bool:
        if self.end is None or time.monotonic() < self.end:
            return False
        self.skipped.append(what)
        print(f"time box reached: {what} skipped", flush=True)
        return True


def run_ops(preset: Preset, device: torch.device, dtype: str, seed: int) -> List[Dict[str, Any]]:
    entries = []
    print(f"\n## op level, {dtype}: time per call (positions/s); ratios", flush=True)
    for length in preset.op_lengths:
        shape = ops.OpShape(max(1, preset.op_tokens // length), preset.heads, length, preset.head_dim)
        e = ops.bench_ops(shape, DTYPES[dtype], device, preset.reps,
                          preset.min_sample_ms / 1e3, seed + length)
        entries.append(e)
        cells = "  ".join(f"{n} {fmt_time(c['median'])}" for n, c in e["candidates"].items())
        r = e["ratios"]
        print(f"T={length:<5} B={shape.batch:<4} {cells}  | rope÷naive {r['rope_over_naive']:.2f}"
              f"  rope÷copy bandwidth {r['rope_bytes_per_s_over_copy']:.2f}", flush=True)
    return entries


def _ratios(rows: Dict[str, Dict[str, Any]], rate: str) -> Dict[str, Dict[str, Any]]:
    """Each row over stock: ``rate`` (tokens or sentences per second) as the median of the
    per-repetition ratios, with their quartiles (:func:`timing.paired_speedup`), and peak memory."""
    ratios = {}
    for n in rows:
        if n != STOCK:
            speedup = timing.paired_speedup(rows[n], rows[STOCK])
            ratios[f"{n}_over_stock"] = {rate: speedup.median, f"{rate}_quartiles": [speedup.q1, speedup.q3],
                                         "peak_bytes": rows[n]["peak_bytes"] / rows[STOCK]["peak_bytes"]}
    return ratios


def run_models(preset: Preset, data_dir: Path, device: torch.device, dtype: str,
               dropout: float, seed: int, decode: bool, names: Sequence[str] = DEFAULT_ROWS,
               clock: Optional[Deadline] = None) -> Dict[str, Any]:
    clock = clock or Deadline(None)
    rows = [row for row in models.rows_for(preset.size) if row.name in names]
    trainers, tasks, info = {}, {}, {}
    rotations = {row.name: row.rotation for row in rows}
    for row in rows:
        argv = models.train_argv(data_dir, row, device, dtype, dropout, preset.train_tokens, seed)
        trainers[row.name], tasks[row.name] = models.build_trainer(argv, seed)
        info[row.name] = {"arch": row.arch, "flags": list(row.flags), "rotation": row.rotation,
                          "params": models.parameter_count(trainers[row.name]),
                          "fairseq_train_args": argv[1:]}  # without the temporary data dir
    out: Dict[str, Any] = {"rows": info, "train": [], "decode": []}
    print(f"\n## training, {dtype}: target tokens/s; peak MiB; ratios ÷ {STOCK}", flush=True)
    sample_s = preset.model_sample_ms / 1e3 if device.type == "cuda" else 0.0
    for length in preset.train_lengths:
        if clock.passed(f"training, {dtype}, T={length}"):
            continue
        sentences = max(1, preset.train_tokens // length)
        batch = models.synthetic_batch(tasks[ROPE], length, sentences, seed + length)
        measured = models.bench_training(trainers, batch, device, preset.reps, preset.warmup, sample_s,
                                         rotations)
        entry = {"length": length, "sentences": sentences, "target_tokens": int(batch["ntokens"]),
                 "rows": measured, "ratios": _ratios(measured, "tokens_per_s")}
        out["train"].append(entry)
        _print_models(entry, "tokens_per_s")
    if decode:
        print(f"\n## beam-4 decoding, {dtype}: sentences/s; peak MiB; ratios ÷ {STOCK}", flush=True)
        for length in preset.decode_lengths:
            if clock.passed(f"decoding, {dtype}, T={length}"):
                continue
            batch = models.synthetic_batch(tasks[ROPE], length, preset.decode_sentences,
                                           seed + 7 * length)
            measured = models.bench_decoding(trainers, tasks, batch, length, device,
                                             preset.reps, preset.warmup, min_sample_s=sample_s,
                                             rotations=rotations)
            entry = {"length": length, "sentences": preset.decode_sentences, "rows": measured,
                     "ratios": _ratios(measured, "sentences_per_s")}
            out["decode"].append(entry)
            _print_models(entry, "sentences_per_s")
    del trainers, tasks
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _print_models(entry: Dict[str, Any], key: str) -> None:
    launches = "launches_per_step" if key == "tokens_per_s" else "launches"
    cells = "  ".join(f"{n} {fmt_rate(r[key])}/s {r['peak_bytes'] / 2**20:.0f}MiB {r[launches]}L"
                      for n, r in entry["rows"].items())
    ratios = "  ".join(f"{n.replace('_over_stock', '')} {r[key]:.3f}/{r['peak_bytes']:.3f}"
                       for n, r in entry["ratios"].items())
    print(f"T={entry['length']:<5} {entry['sentences']:>4} sent.  {cells}  | {ratios}", flush=True)
