"""Op level: applying a position encoding to q and k of shape (batch, heads, T, head_dim).

Candidates, all timed on the same q and k (forward only, no autograd):

* ``rope`` — the plugin's path, exactly what the attention calls:
  ``RotaryEmbedding(head_dim).encode_qk(q, k, context)`` (default layout, the paper's
  interleaved pairs), with one :class:`PositionContext` for every call, as the layers of a pass
  share theirs (its cos/sin looked up by the first call);
* ``rope_half`` — the same with ``layout="half"`` (GPT-NeoX pairs);
* ``naive`` — the textbook rotate-half reference: ``x*cos + rotate_half(x)*sin``
  for q and k, ``rotate_half`` by ``torch.cat``, cos/sin precomputed at full
  head_dim (T, head_dim) outside the timed region, as GPT-NeoX caches them;
* ``fairseq`` — fairseq's ``RotaryPositionalEmbedding`` forward (its cos/sin
  cache lookup) plus its ``apply_rotary_pos_emb``, in fairseq's own (T, B, H, D)
  layout (q and k are made contiguous in that layout outside the timed region);
  the module is cast to the dtype as ``model.half()`` would cast it;
* ``sinusoidal`` — what the additive encoding costs at this tensor size: adding
  fairseq's sinusoidal table (T, head_dim), precomputed, to q and to k;
* ``copy`` — the memory-bandwidth bound: ``copy_`` of q and k into preallocated tensors.

Byte accounting: every candidate reads q and k and writes two tensors of the
same size, so bytes moved = 4 × numel(q) × element size (the cos/sin or
sinusoidal tables, at most T × head_dim, are not counted). bytes/s = that / time.
Tokens/s counts batch × T positions per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
from fairseq.modules.rotary_positional_embedding import (
    RotaryPositionalEmbedding,
    apply_rotary_pos_emb,
)
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
from torch import Tensor

from fairseq_rope.benchmark.timing import interleaved
from fairseq_rope.position_context import PositionContext
from fairseq_rope.rotary import RotaryEmbedding, inverse_frequencies, layout_permutation

OP_CANDIDATES: Tuple[str, ...] = ("rope", "rope_half", "naive", "fairseq", "sinusoidal", "copy")


@dataclass(frozen=True)
class OpShape:
    batch: int
    heads: int
    length: int
    head_dim: int

    @property
    def numel(self) -> int:
        return self.batch * self.heads * self.length * self.head_dim


def rotate_half(x: Tensor) -> Tensor:
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def naive_cos_sin(length: int, head_dim: int, device: torch.device, dtype: torch.dtype):
    """(T, head_dim) cos/sin, each frequency repeated for both halves."""
    inv_freq = inverse_frequencies(head_dim, device=device)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq
    full = torch.cat((angles, angles), dim=-1)
    return full.cos().to(dtype), full.sin().to(dtype)


def naive_apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + rotate_half(x) * sin


def op_candidates(q: Tensor, k: Tensor) -> Tuple[Dict[str, Callable[[], Any]], Dict[str, Any]]:
    """The timed closures over q and k (B, H, T, D), and references for the checks."""
    _, _, length, head_dim = q.shape
    rope = RotaryEmbedding(head_dim)
    rope_half = RotaryEmbedding(head_dim, layout="half")
    context, half_context = PositionContext(0), PositionContext(0)  # one per candidate, as one pass
    cos, sin = naive_cos_sin(length, head_dim, q.device, q.dtype)
    fs_rope = RotaryPositionalEmbedding(head_dim).to(device=q.device, dtype=q.dtype)
    q_tbhd, k_tbhd = (x.permute(2, 0, 1, 3).contiguous() for x in (q, k))
    table = SinusoidalPositionalEmbedding.get_embedding(length, head_dim).to(q.device, q.dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)

    def naive() -> Tuple[Tensor, Tensor]:
        return naive_apply(q, cos, sin), naive_apply(k, cos, sin)

    def fairseq() -> Tuple[Tensor, Tensor]:
        fs_cos, fs_sin = fs_rope(q_tbhd, seq_len=length)
        return apply_rotary_pos_emb(q_tbhd, k_tbhd, fs_cos, fs_sin)

    def copy() -> Tuple[Tensor, Tensor]:
        return q_out.copy_(q), k_out.copy_(k)

    candidates: Dict[str, Callable[[], Any]] = {
        "rope": lambda: rope.encode_qk(q, k, context),
        "rope_half": lambda: rope_half.encode_qk(q, k, half_context),
        "naive": naive,
        "fairseq": fairseq,
        "sinusoidal": lambda: (q + table, k + table),
        "copy": copy,
    }
    return candidates, {"cos": cos, "sin": sin}


def check_candidates(
    candidates: Dict[str, Callable[[], Any]], q: Tensor, k: Tensor, cos: Tensor, sin: Tensor
) -> Dict[str, float]:
    """Max |difference| of each rotary candidate from the naive reference: they must
    compute the same operator, or the timings would compare different work."""
    perm = layout_permutation(q.size(-1)).to(q.device)
    inv = perm.argsort()
    out: Dict[str, float] = {}
    for name in ("rope", "rope_half", "fairseq"):
        got = candidates[name]()
        if name == "fairseq":
            got = tuple(x.permute(1, 2, 0, 3) for x in got)
        if name == "rope":
            # interleaved(x[..., p]) == half(x)[..., p] (rotary.layout_permutation)
            refs = tuple(naive_apply(x[..., inv], cos, sin)[..., perm] for x in (q, k))
        else:
            refs = (naive_apply(q, cos, sin), naive_apply(k, cos, sin))
        out[name] = max((g.float() - r.float()).abs().max().item() for g, r in zip(got, refs))
    return out


def bench_ops(
    shape: OpShape, dtype: torch.dtype, device: torch.device, reps: int, min_sample_s: float,
    seed: int = 0,
) -> Dict[str, Any]:
    """Time every candidate at one shape; per-call stats, tokens/s, bytes/s and ratios."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dims = (shape.batch, shape.heads, shape.length, shape.head_dim)
    q, k = (torch.randn(dims, generator=gen).to(device, dtype) for _ in range(2))
    with torch.no_grad():
        candidates, refs = op_candidates(q, k)
        max_abs_err = check_candidates(candidates, q, k, refs["cos"], refs["sin"])
        stats = interleaved(candidates, reps, device, warmup=2, min_sample_s=min_sample_s)
    bytes_moved = 4 * shape.numel * q.element_size()
    tokens = shape.batch * shape.length
    result: Dict[str, Any] = {
        "length": shape.length, "batch": shape.batch, "heads": shape.heads,
        "head_dim": shape.head_dim, "bytes_moved": bytes_moved,
        "max_abs_error_vs_naive": max_abs_err, "candidates": {},
    }
    for name, s in stats.items():
        result["candidates"][name] = {
            **s.as_dict(), "tokens_per_s": tokens / s.median, "bytes_per_s": bytes_moved / s.median,
        }
    t = {name: s.median for name, s in stats.items()}
    result["ratios"] = {
        "rope_over_naive": t["rope"] / t["naive"],
        "rope_half_over_naive": t["rope_half"] / t["naive"],
        "rope_over_fairseq": t["rope"] / t["fairseq"],
        "rope_over_sinusoidal": t["rope"] / t["sinusoidal"],
        "rope_bytes_per_s_over_copy": t["copy"] / t["rope"],
    }
    return result
