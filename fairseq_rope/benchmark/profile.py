"""Operator profile of a training step and of a beam search, RoPE against stock.

This splits a training step (forward, backward, Adam) and a decode by torch
operator: ``torch.profiler``'s self CPU time and call count per operator, per
step, for the stock ``sinusoidal`` row and ``rope``, built and fed as the
benchmark builds and feeds them, in fp32, fp16 or bf16. On a GPU it also gives
each operator's self CUDA time (the kernels it launched): where a step is
CPU-bound there (fairseq's is on an H100 at a few thousand tokens), the self
CPU times and the call counts are what set its speed. Operators only one row
runs are where the encodings differ (sinusoidal: the position table lookup
and add; RoPE: the complex multiply of the rotation and its inverse in the
backward); the rest shows whether RoPE's layers do more or less of the shared
work. Self CPU time counts operators only: Python between them is the
difference of wall time and operator time, reported too.

``scripts/profile_step.py [--size tiny] [--length 64] [--steps 5] [--top 25]
[--device cpu|cuda] [--dtype fp32|fp16|bf16] [--out-dir DIR]`` writes
``docs/benchmarks/profile-SIZE.md`` (fp32 on the CPU), else
``docs/benchmarks/profile-SIZE-DEVICE-DTYPE.md`` (DEVICE: ``cpu`` or the GPU's name).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

from fairseq_rope.benchmark import machine, models
from fairseq_rope.benchmark.timing import interleaved, synchronize
from fairseq_rope.evaluation.report import markdown_table

ROWS = ("sinusoidal", "rope")
DECODE_SENTENCES = 16

#: Per operator: (self CPU seconds, calls, self device seconds), per step; the device's
#: time is that of the kernels the operator launched itself (0 on the CPU).
OperatorTimes = Dict[str, Tuple[float, float, float]]


def profile_interleaved(
    calls: Dict[str, Callable[[], object]], steps: int, device: torch.device = torch.device("cpu"),
) -> Dict[str, Tuple[OperatorTimes, float]]:
    """Per candidate: operator self CPU time, calls and self device time per step, and wall
    time per step (to the end of the step's kernels on a GPU).

    Each step of each candidate is profiled on its own, the candidates taking
    turns (:func:`~fairseq_rope.benchmark.timing.interleaved`), so a slow phase
    of the machine falls on every row alike rather than on whichever ran last."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sums: Dict[str, Dict[str, List[float]]] = {name: {} for name in calls}
    walls = {name: 0.0 for name in calls}

    def profiled(name: str) -> Callable[[], None]:
        def call() -> None:
            synchronize(device)
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                calls[name]()
                synchronize(device)
                walls[name] += time.perf_counter() - start
            for event in prof.key_averages():
                if event.key.startswith("aten::"):
                    totals = sums[name].setdefault(event.key, [0.0, 0.0, 0.0])
                    totals[0] += event.self_cpu_time_total * 1e-6
                    totals[1] += event.count
                    totals[2] += event.self_device_time_total * 1e-6
        return call

    for call in calls.values():
        call()  # warm, unprofiled: first-call allocations and table builds stay out
    interleaved({name: profiled(name) for name in calls}, steps, device, warmup=0)
    return {name: ({op: (cpu / steps, n / steps, dev / steps) for op, (cpu, n, dev) in sums[name].items()},
                   walls[name] / steps)
            for name in calls}


def measure(
    size: str, length: int, steps: int, seed: int = 1,
    device: torch.device = torch.device("cpu"), dtype: str = "fp32",
) -> Dict[str, Dict[str, Tuple[OperatorTimes, float]]]:
    """{"train" | "decode": {row: (operator times, wall seconds per step)}}."""
    train: Dict[str, Callable[[], object]] = {}
    decode: Dict[str, Callable[[], object]] = {}
    for name in ROWS:
        trainer, task = models.diagnostic_trainer(size, name, seed, "profile-", device, dtype)
        batch = models.synthetic_batch(task, length, max(1, 2048 // length), seed)
        generator = models.forced_length_generator(task, trainer.model, length)
        sample = models.decode_sample(models.synthetic_batch(task, length, DECODE_SENTENCES, seed), device)
        train[name] = lambda trainer=trainer, batch=batch: trainer.train_step([batch])
        decode[name] = models.beam_search_call(trainer, task, generator, sample)
    with models.quiet():
        return {phase: profile_interleaved(calls, steps, device)
                for phase, calls in (("train", train), ("decode", decode))}


def report(results: Dict[str, Tuple[OperatorTimes, float]], top: int, on_device: bool) -> List[str]:
    """The ``top`` operators by the larger of the two rows' self CPU time, then totals; then
    every operator the rows call a different number of times (the dispatches one row adds)."""
    (stock_ops, stock_wall), (rope_ops, rope_wall) = (results[name] for name in ROWS)
    nothing = (0.0, 0.0, 0.0)

    def cpu(ops: OperatorTimes, op: str) -> float:
        return ops.get(op, nothing)[0]

    def cell(ops: OperatorTimes, op: str) -> str:
        seconds, calls, _ = ops.get(op, nothing)
        return f"{seconds * 1e3:.2f} ({calls:g})" if calls else "—"

    def row(op: str) -> List[str]:
        cells = [cell(stock_ops, op), cell(rope_ops, op)]
        if on_device:
            cells += ms([ops.get(op, nothing)[2] for ops in (stock_ops, rope_ops)])
        return [f"`{op}`", *cells]

    def totals(column: int, ops_of: Sequence[str]) -> List[float]:
        return [sum(ops.get(op, nothing)[column] for op in ops_of) for ops in (stock_ops, rope_ops)]

    def ms(values: Sequence[float], bold: bool = False) -> List[str]:
        return [f"**{v * 1e3:.2f}**" if bold else f"{v * 1e3:.2f}" for v in values]

    names = sorted(set(stock_ops) | set(rope_ops), key=lambda op: -max(cpu(stock_ops, op), cpu(rope_ops, op)))
    rest = names[top:]
    no_device = ["", ""] if on_device else []  # the device columns of the wall-time rows
    op_totals = totals(0, names)
    lines = [row(op) for op in names[:top]]
    lines.append([f"{len(rest)} other operators", *ms(totals(0, rest)),
                  *(ms(totals(2, rest)) if on_device else [])])
    lines.append(["**all operators**", *ms(op_totals, bold=True),
                  *(ms(totals(2, names), bold=True) if on_device else [])])
    lines.append(["**wall time** (profiled)", *ms((stock_wall, rope_wall), bold=True), *no_device])
    lines.append(["wall − operators: Python, between operators",
                  *ms([wall - t for wall, t in zip((stock_wall, rope_wall), op_totals)]), *no_device])
    header = ["operator", "sinusoidal: CPU ms per step (calls)", "rope: CPU ms per step (calls)"]
    if on_device:
        header += ["sinusoidal: device ms per step", "rope: device ms per step"]
    differing = sorted((op for op in names if stock_ops.get(op, nothing)[1] != rope_ops.get(op, nothing)[1]),
                       key=lambda op: -abs(cpu(rope_ops, op) - cpu(stock_ops, op)))
    return [
        *markdown_table(header, lines),
        "",
        f"Operators called a different number of times per step ({len(differing)}), by the "
        "difference of their self CPU time:",
        "",
        *markdown_table(header, [row(op) for op in differing]),
    ]


def out_path(args: argparse.Namespace, device: torch.device) -> Path:
    """``--out``, else in ``--out-dir`` (default docs/benchmarks): profile-SIZE.md for fp32 on
    the CPU (the reference profile), profile-SIZE-DEVICE-DTYPE.md for any other device or dtype."""
    if args.out:
        return args.out
    suffix = "" if (device.type, args.dtype) == ("cpu", "fp32") else f"-{machine.device_slug(device)}-{args.dtype}"
    return (args.out_dir or machine.REPORTS_DIR) / f"profile-{args.size}{suffix}.md"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/profile_step.py", description=__doc__.split("\n")[0])
    machine.add_size_and_out(parser, "profile")
    parser.add_argument("--length", type=int, default=64, help="sentence length in tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per row (default: %(default)s)")
    parser.add_argument("--top", type=int, default=25, help="operators listed (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 … (default: %(default)s)")
    parser.add_argument("--dtype", choices=tuple(models.DTYPE_FLAGS), default="fp32",
                        help="fairseq's --fp16 / --bf16, or neither (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="directory for the report under its default name (default: docs/benchmarks)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.out = out_path(args, device)
    results = measure(args.size, args.length, args.steps, device=device, dtype=args.dtype)
    on_device = device.type != "cpu"
    where = machine.describe(device)
    machine.publish_sized_report(
        args, "profile", "scripts/profile_step.py", argv,
        f"Operator profile, {where.get('gpu', 'CPU')}, {args.dtype}",
        (f"GPU: {where['gpu']} (torch {where['torch']}, CUDA {where['cuda']}). " if on_device else "")
        + f"`torch.profiler` self CPU time per step and calls per step"
        + (", and the self device time of the kernels each operator launched" if on_device else "")
        + f", mean over {args.steps} steps per row after one unprofiled step, the rows taking turns "
        "step by step (fairseq_rope/benchmark/profile.py). The profiler adds a fixed cost "
        "per operator to the wall time; compare rows, not these times with the benchmark's.",
        [
            f"## Training step (Trainer.train_step: forward, backward, Adam; {max(1, 2048 // args.length)} "
            f"sentences × {args.length} tokens)",
            "",
            *report(results["train"], args.top, on_device),
            "",
            f"## Beam search (beam 4, {DECODE_SENTENCES} sentences, output length forced to {args.length})",
            "",
            *report(results["decode"], args.top, on_device),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
