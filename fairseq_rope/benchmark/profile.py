"""Operator profile of a training step and of a beam search, RoPE against stock.

Where :mod:`~fairseq_rope.benchmark.phases` splits a decode by module, this
splits a training step (forward, backward, Adam) and a decode by torch
operator: ``torch.profiler``'s self CPU time and call count per operator, per
step, for the stock ``sinusoidal`` row and ``rope``, built and fed as the
benchmark builds and feeds them. Operators only one row runs are where the
encodings differ (sinusoidal: the position table lookup and add; RoPE: the
complex multiply of the rotation and its inverse in the backward); the rest
shows whether RoPE's layers do more or less of the shared work. Self CPU time
counts operators only: Python between them is the difference of wall time
and operator time, reported too.

``scripts/profile_step.py [--size tiny] [--length 64] [--steps 5] [--top 25]``
writes ``docs/benchmarks/profile-SIZE.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

from fairseq_rope.benchmark import machine, models
from fairseq_rope.benchmark.timing import interleaved
from fairseq_rope.evaluation.report import markdown_table

ROWS = ("sinusoidal", "rope")
DECODE_SENTENCES = 16

#: Per operator: (self CPU seconds, calls), per step.
OperatorTimes = Dict[str, Tuple[float, float]]


def profile_interleaved(calls: Dict[str, Callable[[], object]], steps: int) -> Dict[str, Tuple[OperatorTimes, float]]:
    """Per candidate: operator self CPU time and calls per step, and wall time per step.

    Each step of each candidate is profiled on its own, the candidates taking
    turns (:func:`~fairseq_rope.benchmark.timing.interleaved`), so a slow phase
    of the machine falls on every row alike rather than on whichever ran last."""
    sums: Dict[str, Dict[str, List[float]]] = {name: {} for name in calls}
    walls = {name: 0.0 for name in calls}

    def profiled(name: str) -> Callable[[], None]:
        def call() -> None:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                calls[name]()
                walls[name] += time.perf_counter() - start
            for event in prof.key_averages():
                if event.key.startswith("aten::"):
                    seconds_calls = sums[name].setdefault(event.key, [0.0, 0.0])
                    seconds_calls[0] += event.self_cpu_time_total * 1e-6
                    seconds_calls[1] += event.count
        return call

    for call in calls.values():
        call()  # warm, unprofiled: first-call allocations and table builds stay out
    interleaved({name: profiled(name) for name in calls}, steps, torch.device("cpu"), warmup=0)
    return {name: ({op: (t / steps, n / steps) for op, (t, n) in sums[name].items()}, walls[name] / steps)
            for name in calls}


def measure(size: str, length: int, steps: int, seed: int = 1) -> Dict[str, Dict[str, Tuple[OperatorTimes, float]]]:
    """{"train" | "decode": {row: (operator times, wall seconds per step)}}."""
    device = torch.device("cpu")
    train: Dict[str, Callable[[], object]] = {}
    decode: Dict[str, Callable[[], object]] = {}
    for name in ROWS:
        trainer, task = models.diagnostic_trainer(size, name, seed, "profile-")
        batch = models.synthetic_batch(task, length, max(1, 2048 // length), seed)
        generator = models.forced_length_generator(task, trainer.model, length)
        sample = models.decode_sample(models.synthetic_batch(task, length, DECODE_SENTENCES, seed), device)
        train[name] = lambda trainer=trainer, batch=batch: trainer.train_step([batch])

        def decode_call(trainer=trainer, task=task, generator=generator, sample=sample):
            trainer.model.eval()
            try:
                return task.inference_step(generator, [trainer.model], sample)
            finally:
                trainer.model.train()

        decode[name] = decode_call
    with models.quiet():
        return {"train": profile_interleaved(train, steps), "decode": profile_interleaved(decode, steps)}


def report(results: Dict[str, Tuple[OperatorTimes, float]], top: int) -> List[str]:
    """The ``top`` operators by the larger of the two rows' time, then totals."""
    (stock_ops, stock_wall), (rope_ops, rope_wall) = (results[name] for name in ROWS)
    names = sorted(set(stock_ops) | set(rope_ops),
                   key=lambda op: -max(stock_ops.get(op, (0, 0))[0], rope_ops.get(op, (0, 0))[0]))

    def cell(ops: OperatorTimes, op: str) -> str:
        seconds, calls = ops.get(op, (0.0, 0.0))
        return f"{seconds * 1e3:.2f} ({calls:g})" if calls else "—"

    lines = [[f"`{op}`", cell(stock_ops, op), cell(rope_ops, op)] for op in names[:top]]
    rest = names[top:]
    lines.append([f"{len(rest)} other operators", *(f"{sum(ops.get(op, (0, 0))[0] for op in rest) * 1e3:.2f}"
                                                  for ops in (stock_ops, rope_ops))])
    op_totals = [sum(seconds for seconds, _ in ops.values()) for ops in (stock_ops, rope_ops)]
    lines.append(["**all operators**", *(f"**{t * 1e3:.2f}**" for t in op_totals)])
    lines.append(["**wall time** (profiled)", f"**{stock_wall * 1e3:.2f}**", f"**{rope_wall * 1e3:.2f}**"])
    lines.append(["wall − operators: Python, between operators",
                  *(f"{(wall - t) * 1e3:.2f}" for wall, t in zip((stock_wall, rope_wall), op_totals))])
    return markdown_table(["operator", "sinusoidal: ms per step (calls)", "rope: ms per step (calls)"], lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/profile_step.py", description=__doc__.split("\n")[0])
    machine.add_size_and_out(parser, "profile")
    parser.add_argument("--length", type=int, default=64, help="sentence length in tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per row (default: %(default)s)")
    parser.add_argument("--top", type=int, default=25, help="operators listed (default: %(default)s)")
    args = parser.parse_args(argv)
    results = measure(args.size, args.length, args.steps)
    machine.publish_sized_report(
        args, "profile", "scripts/profile_step.py", argv, "Operator profile",
        f"`torch.profiler` self CPU time per step and calls per step, mean over {args.steps} steps "
        "per row after one unprofiled step, the rows taking turns step by step "
        "(fairseq_rope/benchmark/profile.py). The profiler adds a fixed cost "
        "per operator to the wall time; compare rows, not these times with the benchmark's.",
        [
            f"## Training step (Trainer.train_step: forward, backward, Adam; {max(1, 2048 // args.length)} "
            f"sentences × {args.length} tokens)",
            "",
            *report(results["train"], args.top),
            "",
            f"## Beam search (beam 4, {DECODE_SENTENCES} sentences, output length forced to {args.length})",
            "",
            *report(results["decode"], args.top),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
