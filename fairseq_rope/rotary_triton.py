"""RoPE's rotation as one Triton kernel: q and k (and, where asked, a copy of v) in one launch.

The kernel reads each (batch, head, position) row of q and k where the projection left it (any
strides with a unit last dimension: a head-split view of the packed q/k/v projection, or a
decoding step's slice of it) and writes it where the attention wants it (any strides: new
(B, H, T, D) tensors, SDPA's layout, or the packed gradient of the projection in the backward).
Per pair it computes, in fp32 registers,

    y₁ = s·(x₁ cos − x₂ sin),   y₂ = s·(x₂ cos + x₁ sin)

with cos and sin read from the fp32 tables of :mod:`fairseq_rope.rotary_tables` (the same values
the PyTorch path multiplies by), ``s`` a scale applied to q only (a decoding step's 1/√d, YaRN's
1/t), and rounds once to the input's dtype. Dimensions past ``rope_dim`` are copied (times s).
The backward is the same kernel with the sine negated (Rᵀ = R⁻¹, Eq. 13), so a training step adds
two launches per self-attention layer: this kernel forward and backward.

Prior art: flash-attn's ``flash_attn/ops/triton/rotary.py`` (both layouts, offsets, conjugate
backward, fp32 math) and Liger's ``ops/rope.py`` (q and k in one kernel).

Import only where Triton is installed: :mod:`fairseq_rope.rotary` decides when (CUDA tensors, and
``FAIRSEQ_ROPE_TRITON`` not ``0``). Under ``TRITON_INTERPRET=1`` (set before this module is
imported) the kernel runs on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Elements of q (and of k) one program rotates: BLOCK_T positions × the head.
_ELEMENTS_PER_PROGRAM = 4096


@triton.jit
def _rotate_rows(
    X, OUT, sx_b, sx_h, sx_t, so_b, so_h, so_t, b, h, t, i, tail, rows, pairs, rest,
    cos, sin, scale,
    HALF: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """One tensor's BLOCK_T rows of one head: the rotated pairs, then the tail past rope_dim."""
    x_row = X + b * sx_b + h * sx_h + t[:, None] * sx_t
    o_row = OUT + b * so_b + h * so_h + t[:, None] * so_t
    if INTERLEAVED:
        # Pairs (2i, 2i+1) are neighbours: one contiguous load of the row, split in registers.
        # Two loads at stride 2 instead ran the kernel at 0.08 of copy speed on an H200.
        j = tl.arange(0, 2 * BLOCK_HALF)
        row_mask = rows[:, None] & (j < 2 * HALF)[None, :]
        x = tl.load(x_row + j[None, :], mask=row_mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_HALF, 2)))
        y1 = (x1 * cos - x2 * sin) * scale
        y2 = (x2 * cos + x1 * sin) * scale
        y = tl.reshape(tl.join(y1, y2), (BLOCK_T, 2 * BLOCK_HALF))
        tl.store(o_row + j[None, :], y.to(OUT.dtype.element_ty), mask=row_mask)
    else:
        x1 = tl.load(x_row + i[None, :], mask=pairs, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (i + HALF)[None, :], mask=pairs, other=0.0).to(tl.float32)
        y1 = (x1 * cos - x2 * sin) * scale
        y2 = (x2 * cos + x1 * sin) * scale
        tl.store(o_row + i[None, :], y1.to(OUT.dtype.element_ty), mask=pairs)
        tl.store(o_row + (i + HALF)[None, :], y2.to(OUT.dtype.element_ty), mask=pairs)
    if HAS_TAIL:
        rest_mask = rows[:, None] & rest[None, :]
        x = tl.load(x_row + tail[None, :], mask=rest_mask, other=0.0).to(tl.float32)
        tl.store(o_row + tail[None, :], (x * scale).to(OUT.dtype.element_ty), mask=rest_mask)


@triton.jit
def _rotary_kernel(
    Q, K, V, OUT_Q, OUT_K, OUT_V, COS, SIN,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    soq_b, soq_h, soq_t, sok_b, sok_h, sok_t, sov_b, sov_h, sov_t,
    sc_b, sc_t, sc_i,
    heads, length, start, q_scale, sign,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_V: tl.constexpr,
    HAS_TAIL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (b·H + h, block of positions): rotate q and k there, copy v if HAS_V.

    The table row of position t is ``start + t`` (the offset of an incremental step), in
    batch row b·sc_b (0 for the shared tables, the sentence's own for a dynamic scaling);
    ``sign`` is −1 for the inverse rotation."""
    pid = tl.program_id(0)
    b = pid // heads
    h = pid % heads
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    i = tl.arange(0, BLOCK_HALF)
    rows = t < length
    pairs = rows[:, None] & (i < HALF)[None, :]
    table = b * sc_b + (start + t[:, None]) * sc_t + i[None, :] * sc_i
    cos = tl.load(COS + table, mask=pairs, other=1.0)
    sin = tl.load(SIN + table, mask=pairs, other=0.0) * sign
    tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)
    rest = tail < HEAD_DIM
    _rotate_rows(Q, OUT_Q, sq_b, sq_h, sq_t, soq_b, soq_h, soq_t, b, h, t, i, tail, rows, pairs, rest,
                 cos, sin, q_scale, HALF, INTERLEAVED, HAS_TAIL, BLOCK_T, BLOCK_HALF)
    _rotate_rows(K, OUT_K, sk_b, sk_h, sk_t, sok_b, sok_h, sok_t, b, h, t, i, tail, rows, pairs, rest,
                 cos, sin, 1.0, HALF, INTERLEAVED, HAS_TAIL, BLOCK_T, BLOCK_HALF)
    if HAS_V:
        d = tl.arange(0, BLOCK_D)
        mask = rows[:, None] & (d < HEAD_DIM)[None, :]
        v = tl.load(V + b * sv_b + h * sv_h + t[:, None] * sv_t + d[None, :], mask=mask)
        tl.store(OUT_V + b * sov_b + h * sov_h + t[:, None] * sov_t + d[None, :], v, mask=mask)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.lru_cache(maxsize=1024)  # a decoding step's launch is all host time: computed once per shape
def block_sizes(length: int, half: int, head_dim: int) -> Tuple[int, int, int, int]:
    """(positions per program, then the pairs', the tail's and the whole head's blocks): powers of
    two, as ``tl.arange`` needs (Triton's interpreter does not check it; the compiler does), about
    :data:`_ELEMENTS_PER_PROGRAM` elements of q per program."""
    block_half = _next_power_of_2(half)
    block_tail = _next_power_of_2(head_dim - 2 * half) if head_dim > 2 * half else 1
    fits = max(1, _ELEMENTS_PER_PROGRAM // (2 * block_half + block_tail))
    block_t = min(_next_power_of_2(length), 1 << (fits.bit_length() - 1))
    return block_t, block_half, block_tail, _next_power_of_2(head_dim)


def rotate(
    q: Tensor, k: Tensor, out_q: Tensor, out_k: Tensor, cos: Tensor, sin: Tensor, start: int,
    interleaved: bool, q_scale: float = 1.0, inverse: bool = False,
    v: Optional[Tensor] = None, out_v: Optional[Tensor] = None,
) -> None:
    """Write R q·q_scale to ``out_q`` and R k to ``out_k`` (Rᵀ when ``inverse``), and v to ``out_v``.

    q, k, v, out_*: (B, H, T, head_dim), any strides with a unit last dimension, all alike in
    shape and dtype. cos, sin: fp32 (T_table, rope_dim/2) shared by every sentence, position t at
    row start + t; or (B, T_table, rope_dim/2), one table per sentence."""
    batch, heads, length, head_dim = q.shape
    half = cos.size(-1)
    v_args: Sequence[Tensor] = (v, out_v) if v is not None else (q, out_q)  # unused without HAS_V
    # Each stride read once: a decoding step's launch is all host time.
    strides = [x.stride() for x in (q, k, v_args[0], out_q, out_k, v_args[1])]
    if any(stride[3] != 1 for stride in strides):
        raise ValueError("the fused rotation needs a unit stride in the head dimension")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"the fused rotation reads fp32 tables, got {cos.dtype}")
    table_strides = cos.stride()
    if sin.stride() != table_strides:
        raise ValueError("cos and sin tables must share their strides")
    if length == 0 or batch * heads == 0:
        return
    block_t, block_half, block_tail, block_d = block_sizes(length, half, head_dim)
    grid = (batch * heads, -(-length // block_t))  # not triton.cdiv: a JIT function, slow to call from Python
    _rotary_kernel[grid](
        q, k, v_args[0], out_q, out_k, v_args[1], cos, sin,
        *(s for stride in strides for s in stride[:3]),
        *((0, *table_strides) if cos.dim() == 2 else table_strides),
        heads, length, start, float(q_scale), -1.0 if inverse else 1.0,
        HEAD_DIM=head_dim, HALF=half, INTERLEAVED=interleaved, HAS_V=v is not None,
        HAS_TAIL=head_dim > 2 * half, BLOCK_T=block_t, BLOCK_HALF=block_half, BLOCK_TAIL=block_tail,
        BLOCK_D=block_d,
    )


def _unit_last(x: Tensor) -> Tensor:
    # SDPA's key gradient can arrive transposed (a strided last dimension): one copy then.
    return x if x.stride(-1) == 1 else x.contiguous()


def _needs_grad(*xs: Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def rotate_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
              q_scale: float = 1.0) -> Tuple[Tensor, Tensor]:
    """R q·q_scale and R k (see :func:`rotate`) as new (B, H, T, D) tensors, differentiable."""
    if _needs_grad(q, k):
        return FusedRotation.apply(q, k, cos, sin, start, interleaved, q_scale)
    return _rotated(q, k, cos, sin, start, interleaved, q_scale)


def rotate_packed(qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                  q_scale: float = 1.0) -> Tuple[Tensor, Tensor, Tensor]:
    """The packed projection (T, B, 3, H, D) as R q·q_scale, R k and v, each a new (B, H, T, D)
    tensor (SDPA's layout), differentiable: one launch forward, one backward."""
    if _needs_grad(qkv):
        return FusedPackedRotation.apply(qkv, cos, sin, start, interleaved, q_scale)
    return _packed(qkv, cos, sin, start, interleaved, q_scale)


def rotate_step(qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    """A decoding step's qkv (B, 3, H, D) as R q·q_scale, R k and v, each (B, H, D) and contiguous:
    the key and value caches then append contiguous tensors. No autograd (decoding)."""
    batch, _, heads, head_dim = qkv.shape
    out = torch.empty((3, batch, heads, 1, head_dim), dtype=qkv.dtype, device=qkv.device)
    out_q, out_k, out_v = out.unbind(0)
    q, k, v = _unit_last(qkv).unsqueeze(3).unbind(1)
    rotate(q, k, out_q, out_k, cos, sin, start, interleaved, q_scale, v=v, out_v=out_v)
    return out.squeeze(3).unbind(0)


def _rotated(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool, q_scale: float,
             inverse: bool = False) -> Tuple[Tensor, Tensor]:
    q, k = _unit_last(q), _unit_last(k)
    out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    out_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    rotate(q, k, out_q, out_k, cos, sin, start, interleaved, q_scale, inverse)
    return out_q, out_k


def _packed(qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
            q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    length, batch, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
    out = torch.empty((3, batch, heads, length, head_dim), dtype=qkv.dtype, device=qkv.device)
    rotate(q, k, out[0], out[1], cos, sin, start, interleaved, q_scale, v=v, out_v=out[2])
    return out.unbind(0)


class FusedRotation(torch.autograd.Function):
    """(q, k) → (R q·q_scale, R k) as new (B, H, T, D) tensors; the backward is the same kernel
    with the sine negated, writing both gradients in one launch."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                q_scale: float) -> Tuple[Tensor, Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.rotation = (start, interleaved, q_scale)
        return _rotated(q, k, cos, sin, start, interleaved, q_scale)

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        cos, sin = ctx.saved_tensors
        start, interleaved, q_scale = ctx.rotation
        grads = _rotated(grad_q, grad_k, cos, sin, start, interleaved, q_scale, inverse=True)
        return (*grads, None, None, None, None, None)


class FusedPackedRotation(torch.autograd.Function):
    """The packed projection (T, B, 3, H, D) → R q·q_scale, R k and a copy of v, each a new
    (B, H, T, D) tensor (SDPA's layout): the head split costs no copy of its own. The backward
    writes the projection's gradient (T, B, 3, H, D) in one launch, so the projection's own
    backward reads one contiguous gradient (no stack, no permute copy)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.rotation = (start, interleaved, q_scale)
        return _packed(qkv, cos, sin, start, interleaved, q_scale)

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor):
        cos, sin = ctx.saved_tensors
        start, interleaved, q_scale = ctx.rotation
        batch, heads, length, head_dim = grad_q.shape
        grad = torch.empty((length, batch, 3, heads, head_dim), dtype=grad_q.dtype, device=grad_q.device)
        out_q, out_k, out_v = grad.permute(2, 1, 3, 0, 4).unbind(0)
        rotate(_unit_last(grad_q), _unit_last(grad_k), out_q, out_k, cos, sin, start, interleaved, q_scale,
               inverse=True, v=_unit_last(grad_v), out_v=out_v)
        return grad, None, None, None, None, None
