"""Host cost of one decoding step, RoPE against stock (``scripts/decoding_step_host_cost.py``).

A beam-search step on a GPU is host time: the kernels of one step at base size take a few µs each,
while Python and the dispatcher spend tens of µs per operator before the GPU sees it. This times
the decoder's incremental forward alone (no search), ``sentences × beam`` hypotheses over a
cached source, one step after another from an empty cache, for the stock ``sinusoidal`` row and
``rope`` (whose step rotates with PyTorch on every device: ``RotaryEmbedding.encode_step``), in
inference mode as fairseq's generator runs it. Per step: the wall time, the operators dispatched,
their self CPU time and what is left, Python between operators (the ``torch.profiler`` split of
:mod:`fairseq_rope.benchmark.profile`, whose rows take turns). On the CPU with one thread and few
hypotheses the operators' arithmetic is small and what differs between the rows is host work:
operators and Python, which is what a GPU step costs on the host too.
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_rope.benchmark import machine, models
from fairseq_rope.benchmark.profile import OperatorTimes, profile_interleaved
from fairseq_rope.benchmark.timing import Stats, interleaved, paired_speedup
from fairseq_rope.evaluation.report import markdown_table

ROWS = ("sinusoidal", "rope")


def decoding_steps(trainer, task, length: int, sentences: int, beam: int, seed: int) -> Callable[[], None]:
    """``length`` incremental decoder steps of ``sentences × beam`` hypotheses from an empty cache."""
    model = trainer.model.eval()
    batch = models.synthetic_batch(task, length, sentences, seed)
    rows = torch.arange(sentences).repeat_interleave(beam)
    src_tokens = batch["net_input"]["src_tokens"][rows]
    prev = batch["target"][rows]
    with torch.no_grad():
        encoder_out = model.encoder(src_tokens, src_tokens.ne(task.source_dictionary.pad()).sum(1))

    def call() -> None:
        state: Dict = {}
        with torch.no_grad():
            for t in range(length):
                model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)

    return call


Measured = Tuple[Dict[str, Stats], Dict[str, Tuple[OperatorTimes, float]]]


def measure(size: str, length: int, sentences: int, beam: int, reps: int, seed: int = 1) -> Measured:
    """Wall time unprofiled (the rows taking turns, ``reps`` repetitions), then the profiled split."""
    calls = {}
    for name in ROWS:
        trainer, task = models.diagnostic_trainer(size, name, seed, "step-host-")
        calls[name] = decoding_steps(trainer, task, length, sentences, beam, seed)
    with models.quiet():
        return interleaved(calls, reps, torch.device("cpu")), profile_interleaved(calls, reps)


def report(results: Measured, length: int) -> List[str]:
    """One line per row: the unprofiled wall time per step and its paired ratio to stock (the figure),
    then the profiler's split of a profiled step into operators and the Python between them."""
    walls, profiled = results
    stock = walls[ROWS[0]].as_dict()
    lines = []
    for name in ROWS:
        wall, ratio = walls[name], paired_speedup(stock, walls[name].as_dict())  # stock's speed over the row's
        ops, profiled_wall = profiled[name]
        operator_time = sum(seconds for seconds, _, _ in ops.values())
        count = sum(calls for _, calls, _ in ops.values())
        lines.append([name, f"{wall.median / length * 1e6:.0f}", f"{ratio.median:.3f} [{ratio.q1:.3f}, {ratio.q3:.3f}]",
                      f"{profiled_wall / length * 1e6:.0f}", f"{count / length:.0f}",
                      f"{operator_time / length * 1e6:.0f}", f"{(profiled_wall - operator_time) / length * 1e6:.0f}"])
    return markdown_table(["row", "µs per step (wall)", "÷ stock (paired, median [quartiles])",
                           "µs per step (profiled)", "operators per step", "operators' self CPU µs per step",
                           "Python between operators, µs per step"], lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/decoding_step_host_cost.py", description=__doc__.split("\n")[0])
    machine.add_size_and_out(parser, "decoding-step-host")
    parser.add_argument("--length", type=int, default=32, help="decoder steps per repetition (default: %(default)s)")
    parser.add_argument("--sentences", type=int, default=1, help="(default: %(default)s)")
    parser.add_argument("--beam", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--reps", type=int, default=7, help="profiled repetitions per row (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = measure(args.size, args.length, args.sentences, args.beam, args.reps)
    machine.publish_sized_report(
        args, "decoding-step-host", "scripts/decoding_step_host_cost.py", argv,
        "Host cost of a decoding step, CPU",
        f"{args.sentences} sentence(s) × beam {args.beam}, {args.length} incremental decoder steps from an "
        f"empty cache per repetition, {args.reps} repetitions per row taking turns unprofiled (the wall time; "
        "÷ stock: the row's time over stock's in each repetition, so below 1 is cheaper), then as many "
        f"profiled, {args.threads} torch thread(s), fp32, inference mode (fairseq_rope/benchmark/step_host.py). "
        "The profiler adds a fixed cost per operator to the profiled time; compare its columns between rows.",
        report(results, args.length),
    )
    return 0
