"""Where a beam search's time goes, module by module, RoPE against stock.

The whole-model decoding benchmark (:mod:`fairseq_rope.benchmark.models`)
says how fast each row decodes; this says where the difference sits. Every row
is built as the benchmark builds it and decodes the same sources (beam 4,
lenpen 0.6, output length forced); the forward of each module of interest is
wrapped with a wall-clock timer, so each decode also yields the time spent in
the encoder, the decoder, and per decoder layer in self-attention,
cross-attention, the two feed-forward projections, plus the output projection
and the position embeddings. What the decoder spends outside those modules is
embeddings, layer norms, residuals and Python; what a decode spends outside
encoder and decoder is fairseq's ``SequenceGenerator`` (search, reordering).

One extra row, ``rope+stock-attn``, is the RoPE model with fairseq's stock
self-attention module (same weights) put in place of the plugin's: not a model
anyone should use (it has no positions at all) but the control that prices the
plugin's self-attention module in place, everything else equal.

``scripts/decode_phases.py [--size tiny] [--length 32] [--reps 15] [--threads 2]``
prints the table and writes ``docs/benchmarks/decode-phases-SIZE.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence

import torch
from fairseq.modules import MultiheadAttention

from fairseq_rope.benchmark import machine, models
from fairseq_rope.benchmark.timing import interleaved
from fairseq_rope.evaluation.report import markdown_table

CONTROL = "rope+stock-attn"
ROWS = ("sinusoidal", "learned", "rope", CONTROL)
#: Timed modules, in report order; "decoder" includes every per-layer module.
PHASES = ("encoder", "decoder", "self-attention", "cross-attention", "feed-forward", "output projection",
          "position embeddings")
SENTENCES = 16


def _timed(module: torch.nn.Module, phase: str, totals: Dict[str, float]) -> None:
    """Add the wall time of every ``module.forward`` call to ``totals[phase]``."""
    forward = module.forward

    def timed_forward(*args, **kwargs):
        start = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - start

    module.forward = timed_forward


def with_stock_self_attention(model: torch.nn.Module) -> None:
    """Replace every decoder self-attention with fairseq's module holding the same weights."""
    for layer in model.decoder.layers:
        ours = layer.self_attn
        stock = MultiheadAttention(ours.embed_dim, ours.num_heads, dropout=ours.dropout_module.p,
                                   self_attention=True)
        stock.load_state_dict(ours.state_dict())
        layer.self_attn = stock.to(next(ours.parameters()).dtype).eval()


def instrument(model: torch.nn.Module, totals: Dict[str, float]) -> None:
    _timed(model.encoder, "encoder", totals)
    _timed(model.decoder, "decoder", totals)
    for layer in model.decoder.layers:
        _timed(layer.self_attn, "self-attention", totals)
        _timed(layer.encoder_attn, "cross-attention", totals)
        _timed(layer.fc1, "feed-forward", totals)
        _timed(layer.fc2, "feed-forward", totals)
    _timed(model.decoder.output_projection, "output projection", totals)
    if model.decoder.embed_positions is not None:
        _timed(model.decoder.embed_positions, "position embeddings", totals)


def measure(size: str, length: int, reps: int, seed: int = 1) -> Dict[str, Dict[str, float]]:
    """Per row: median total seconds per decode, and mean seconds per decode in each phase."""
    device = torch.device("cpu")
    totals: Dict[str, Dict[str, float]] = {name: defaultdict(float) for name in ROWS}
    calls: Dict[str, Callable[[], object]] = {}
    for name in ROWS:
        trainer, task = models.diagnostic_trainer(size, "rope" if name == CONTROL else name, seed, "decode-phases-")
        model = trainer.model.eval()
        if name == CONTROL:
            with_stock_self_attention(model)
        instrument(model, totals[name])
        sample = models.decode_sample(models.synthetic_batch(task, length, SENTENCES, seed), device)
        generator = models.forced_length_generator(task, model, length)

        def decode(task=task, generator=generator, model=model, sample=sample, phases=totals[name]):
            start = time.perf_counter()
            task.inference_step(generator, [model], sample)
            phases["decode"] += time.perf_counter() - start

        calls[name] = decode
    with models.quiet():
        for call in calls.values():  # warm up outside the totals
            call()
        for phases in totals.values():
            phases.clear()
        stats = interleaved(calls, reps, device, warmup=0)
    return {name: {"median": stats[name].median, **{p: totals[name][p] / reps for p in ("decode", *PHASES)}}
            for name in ROWS}


def report(results: Dict[str, Dict[str, float]]) -> List[str]:
    """Markdown: ms per decode (median, and ÷ sinusoidal), then the mean ms per decode by phase."""
    header = ["row", "decode, median", "÷ sinusoidal (time)", "decode, mean", *PHASES,
              "decoder, other: embeddings, layer norms, residuals", "generator: search, reordering"]
    stock = results["sinusoidal"]["median"]
    lines = []
    for name, phases in results.items():
        inside = sum(phases[p] for p in PHASES if p not in ("encoder", "decoder"))
        generator = phases["decode"] - phases["encoder"] - phases["decoder"]
        lines.append([name, f"{phases['median'] * 1e3:.1f}", f"{phases['median'] / stock:.3f}",
                      f"{phases['decode'] * 1e3:.1f}",
                      *(f"{phases[p] * 1e3:.2f}" if phases[p] else "—" for p in PHASES),
                      f"{(phases['decoder'] - inside) * 1e3:.2f}", f"{generator * 1e3:.1f}"])
    return markdown_table(header, lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/decode_phases.py", description=__doc__.split("\n")[0])
    machine.add_size_and_out(parser, "decode-phases")
    parser.add_argument("--length", type=int, default=32, help="output length, forced (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = measure(args.size, args.length, args.reps)
    machine.publish_sized_report(
        args, "decode-phases", "scripts/decode_phases.py", argv, "Where a beam search's time goes",
        f"{SENTENCES} sentences, beam 4, output length forced to {args.length}, {args.reps} interleaved "
        "repetitions; ms per decode: the median and the mean, and per phase the mean wall time spent inside "
        "each module's forward (decoder includes its layers' modules; the timers add a few µs per call "
        "to every row alike). "
        f"`{CONTROL}`: the RoPE model with fairseq's self-attention module in place of the plugin's "
        "(same weights, no positions): the control for the plugin's module in place "
        "(fairseq_rope/benchmark/phases.py).",
        report(results),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
