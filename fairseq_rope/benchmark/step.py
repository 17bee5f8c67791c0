"""One self-attention layer through a beam search, RoPE against fairseq's stock module.

What decoding costs per layer, without the rest of the model: 64 hypotheses
(16 sentences × beam 4) decode ``steps`` positions from an empty cache, one new
query each, the cache reordered before every step as fairseq's
``SequenceGenerator`` reorders it (a fixed random beam order per step), under
``torch.no_grad`` as the generator runs. The same weights in
:class:`~fairseq_rope.attention.PositionalMultiheadAttention` (with
:class:`~fairseq_rope.rotary.RotaryEmbedding`) and in fairseq's
:class:`~fairseq.modules.MultiheadAttention`. A single layer is RoPE's worst
case: the per-step lookups that the layers of a model share are made by every
step here.

``scripts/attention_step.py [--dims 64x2,512x8] [--steps 16,64] [--reps 30]``
prints a table and writes it to ``docs/benchmarks/attention-step.md`` (with the
command, machine and date).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from fairseq.modules import MultiheadAttention

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.benchmark import machine
from fairseq_rope.benchmark.report import fmt_spread, fmt_time
from fairseq_rope.benchmark.timing import Stats, interleaved
from fairseq_rope.evaluation.report import markdown_table
from fairseq_rope.rotary import RotaryEmbedding

HYPOTHESES = 64  # 16 sentences x beam 4


def beam_search_call(attn: MultiheadAttention, embed_dim: int, steps: int, seed: int = 0) -> Callable[[], Tensor]:
    """``steps`` decoding steps of ``attn`` from an empty cache, reordered before each
    step; returns the outputs (steps, hypotheses, embed_dim)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(steps, 1, HYPOTHESES, embed_dim, generator=gen)
    orders = [torch.randint(0, HYPOTHESES, (HYPOTHESES,), generator=gen) for _ in range(steps)]

    def call() -> Tensor:
        state: Dict = {}
        outputs = []
        with torch.no_grad():
            for t in range(steps):
                if t:
                    attn.reorder_incremental_state(state, orders[t])
                x = inputs[t]
                outputs.append(attn(x, x, x, incremental_state=state, need_weights=False)[0])
        return torch.cat(outputs)

    return call


def measure(embed_dim: int, heads: int, steps: int, reps: int) -> Dict[str, Stats]:
    """Time of one beam search of ``steps`` steps per module, interleaved repetitions."""
    torch.manual_seed(0)
    stock = MultiheadAttention(embed_dim, heads, self_attention=True).eval()
    rope = PositionalMultiheadAttention(embed_dim, heads, RotaryEmbedding(embed_dim // heads)).eval()
    rope.load_state_dict(stock.state_dict())
    calls = {"stock": beam_search_call(stock, embed_dim, steps), "rope": beam_search_call(rope, embed_dim, steps)}
    return interleaved(calls, reps, torch.device("cpu"), warmup=3)


def parse_dims(text: str) -> List[Tuple[int, int]]:
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",")]  # type: ignore[misc]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/attention_step.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=parse_dims, default=parse_dims("64x2,512x8"),
                        help="EMBEDxHEADS list (default: tiny and base: %(default)s)")
    parser.add_argument("--steps", default="16,64", help="decoding steps per beam search (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=machine.REPORTS_DIR / "attention-step.md")
    args = parser.parse_args(argv)
    rows = []
    for embed_dim, heads in args.dims:
        for steps in (int(n) for n in args.steps.split(",")):
            stats = measure(embed_dim, heads, steps, args.reps)
            ratio = stats["rope"].median / stats["stock"].median
            per_step = lambda seconds, steps=steps: seconds / steps  # noqa: E731
            rows.append([f"{embed_dim}×{heads}", str(steps),
                         *(fmt_spread(stats[n].as_dict(), per_step, fmt_time) for n in ("stock", "rope")),
                         f"{ratio:.3f}"])
    lines = [
        "# One self-attention layer through a beam search: RoPE ÷ stock",
        "",
        machine.provenance("scripts/attention_step.py", argv) + " "
        f"{HYPOTHESES} hypotheses decode `steps` positions from an empty cache, reordered before every "
        "step as beam search reorders it, under `torch.no_grad`; time per step, medians over "
        f"{args.reps} interleaved repetitions, interquartile range in brackets "
        "(fairseq_rope/benchmark/step.py). One layer alone is RoPE's worst case: every step makes the "
        "position lookups that a model's layers share.",
        "",
        *markdown_table(["d×heads", "steps", "stock, per step", "rope, per step", "rope ÷ stock (time)"], rows),
        "",
    ]
    machine.publish(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
