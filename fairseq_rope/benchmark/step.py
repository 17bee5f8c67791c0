"""One self-attention decoding step, RoPE against fairseq's stock module.

What a beam-search step costs per layer, without the rest of the model: 64
hypotheses, one new query each, ``cached`` positions in the key cache, the
same weights in :class:`~fairseq_rope.attention.PositionalMultiheadAttention`
(with :class:`~fairseq_rope.rotary.RotaryEmbedding`) and in fairseq's
:class:`~fairseq.modules.MultiheadAttention`, under ``torch.no_grad`` as
fairseq's generator runs. Both start every call from the same cache, copied,
so the cache does not grow between repetitions.

``scripts/attention_step.py [--dims 64x2,512x8] [--cached 16,64] [--reps 300]``
prints a table and writes it to ``docs/benchmarks/attention-step.md`` (with the
command, machine and date).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.modules import MultiheadAttention

from fairseq_rope import base
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.benchmark import machine
from fairseq_rope.benchmark.report import fmt_spread, fmt_time
from fairseq_rope.benchmark.timing import Stats, interleaved
from fairseq_rope.evaluation.report import markdown_table
from fairseq_rope.rotary import RotaryEmbedding

HYPOTHESES = 64  # 16 sentences x beam 4


def step_call(attn: MultiheadAttention, embed_dim: int, cached: int) -> Callable[[], object]:
    """A decoding step of ``attn`` from a cache of ``cached`` positions."""
    state: Dict = {}
    with torch.no_grad():
        for _ in range(cached):
            x = torch.randn(1, HYPOTHESES, embed_dim)
            attn(x, x, x, incremental_state=state, need_weights=False)
    query = torch.randn(1, HYPOTHESES, embed_dim)

    def call() -> object:
        fresh = {key: dict(buffer) for key, buffer in state.items()}
        with torch.no_grad():
            return attn(query, query, query, incremental_state=fresh, need_weights=False)

    return call


def measure(embed_dim: int, heads: int, cached: int, reps: int) -> Dict[str, Stats]:
    torch.manual_seed(0)
    stock = MultiheadAttention(embed_dim, heads, self_attention=True).eval()
    rope = PositionalMultiheadAttention(embed_dim, heads, RotaryEmbedding(embed_dim // heads)).eval()
    rope.load_state_dict(stock.state_dict())
    calls = {"stock": step_call(stock, embed_dim, cached), "rope": step_call(rope, embed_dim, cached)}
    return interleaved(calls, reps, torch.device("cpu"), warmup=20)


def parse_dims(text: str) -> List[Tuple[int, int]]:
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",")]  # type: ignore[misc]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/attention_step.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=parse_dims, default=parse_dims("64x2,512x8"),
                        help="EMBEDxHEADS list (default: tiny and base: %(default)s)")
    parser.add_argument("--cached", default="16,64", help="cached positions (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=base.project_dir() / "docs" / "benchmarks" / "attention-step.md")
    args = parser.parse_args(argv)
    rows = []
    for embed_dim, heads in args.dims:
        for cached in (int(n) for n in args.cached.split(",")):
            stats = measure(embed_dim, heads, cached, args.reps)
            ratio = stats["rope"].median / stats["stock"].median
            rows.append([f"{embed_dim}×{heads}", str(cached),
                         *(fmt_spread(stats[n].as_dict(), lambda s: s, fmt_time) for n in ("stock", "rope")),
                         f"{ratio:.3f}"])
    described = machine.describe(torch.device("cpu"))
    text = "\n".join([
        "# One self-attention decoding step: RoPE ÷ stock",
        "",
        f"Written by `{base.command_line('scripts/attention_step.py', argv)}` on {described['date']} "
        f"(commit {described['git_commit']}; {described['cpu']}, {torch.get_num_threads()} threads). "
        f"{HYPOTHESES} hypotheses, one new position each, under `torch.no_grad`; medians over {args.reps} "
        "interleaved repetitions, interquartile range in brackets (fairseq_rope/benchmark/step.py).",
        "",
        *markdown_table(["d×heads", "cached", "stock", "rope", "rope ÷ stock (time)"], rows),
        "",
    ])
    base.write_text(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
