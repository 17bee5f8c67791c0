"""RoPE's rotation as one Triton kernel: q and k (and, where asked, a copy of v) in one launch.

The kernel reads each (batch, head, position) row of q and k where the projection left it (any
strides with a unit last dimension: a head-split view of the packed q/k/v projection) and writes it where the attention wants it (any strides: new
(B, H, T, D) tensors, SDPA's layout, or the packed gradient of the projection in the backward).
Per pair it computes, in fp32 registers,

    y₁ = s·(x₁ cos − x₂ sin),   y₂ = s·(x₂ cos + x₁ sin)

with cos and sin read from the fp32 tables of :mod:`fairseq_rope.rotary_tables` (the same values
the PyTorch path multiplies by; in the interleaved layout one entry per member of a pair, read
like a row of q, so that no layout conversion goes through shared memory), ``s`` a scale applied
to q only (YaRN's 1/t, times an optional per-sentence factor: dynamic YaRN's own 1/t), and rounds
once to the input's dtype. Dimensions past ``rope_dim`` are copied (times s). The backward is the same kernel
with the sine negated (Rᵀ = R⁻¹, Eq. 13; the gradient of s·R q is s·Rᵀ g), so a training step adds
two launches per self-attention layer: this kernel forward and backward. Its backward is
``once_differentiable``: a second derivative through it raises instead of silently missing a term.
A decoding step (one position) does not come here: :mod:`fairseq_rope.rotary` rotates it with
PyTorch, whose host cost is below a launch's.

:func:`rotate` checks its arguments' shapes, dtypes and devices (attribute comparisons only: a
launch is host time too) and launches on q's device even where that is not the
current one (Triton launches on the current device).

Prior art: flash-attn's ``flash_attn/ops/triton/rotary.py`` (both layouts, offsets, conjugate
backward, fp32 math) and Liger's ``ops/rope.py`` (q and k in one kernel).

Import only where Triton is installed: :mod:`fairseq_rope.rotary` decides when (CUDA tensors, and
``FAIRSEQ_ROPE_TRITON`` not ``0``). Under ``TRITON_INTERPRET=1`` (set before this module is
imported) the kernel runs on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
from typing import ContextManager, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

#: Elements of q (and of k) one program rotates: BLOCK_T positions × the head.
_ELEMENTS_PER_PROGRAM = 4096


@triton.jit
def _rotate_rows(
    X, OUT, sx_b, sx_h, sx_t, so_b, so_h, so_t, b, h, t, i, tail, rows, pairs, rest,
    cos, sin, scale,
    HALF: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """One tensor's BLOCK_T rows of one head: the rotated pairs, then the tail past rope_dim. cos and
    sin are (BLOCK_T, BLOCK_HALF), one per pair; interleaved, (BLOCK_T, 2·BLOCK_HALF), one per member
    of a pair, sin signed for it (see :func:`_rotary_kernel`)."""
    x_row = X + b * sx_b + h * sx_h + t[:, None] * sx_t
    o_row = OUT + b * so_b + h * so_h + t[:, None] * so_t
    if INTERLEAVED:
        # Pairs (2i, 2i+1) are neighbours: one contiguous load of the row, split in registers.
        # Two loads at stride 2 instead ran the kernel at 0.08 of copy speed on an H200.
        j = tl.arange(0, 2 * BLOCK_HALF)
        row_mask = rows[:, None] & (j < 2 * HALF)[None, :]
        x = tl.load(x_row + j[None, :], mask=row_mask, other=0.0).to(tl.float32)
        # y = x ⊙ cos + swap(x) ⊙ ±sin, swap exchanging the members of each pair. Only x is split and
        # joined (which moves no data between threads); the tables arrive in x's own layout, so no
        # layout conversion goes through shared memory.
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_HALF, 2)))
        swapped = tl.reshape(tl.join(x2, x1), (BLOCK_T, 2 * BLOCK_HALF))
        y = (x * cos + swapped * sin) * scale
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
    # Last, with defaults: launches written for the kernel without them (scripts/) still bind.
    ROW_SCALE=None, sr_b=0, HAS_ROW_SCALE: tl.constexpr = False,
):
    """Program (b·H + h, block of positions): rotate q and k there, copy v if HAS_V.

    The table row of position t is ``start + t`` (the offset of an incremental step), in
    batch row b·sc_b (0 for the shared tables, the sentence's own for a dynamic scaling);
    ``sign`` is −1 for the inverse rotation. q's scale is ``q_scale``, times ROW_SCALE[b] if
    HAS_ROW_SCALE (ROW_SCALE is not read otherwise)."""
    pid = tl.program_id(0)
    b = pid // heads
    h = pid % heads
    scale = q_scale
    if HAS_ROW_SCALE:
        # The sentence's factor joins q_scale in fp32, before q's one rounding to its dtype.
        scale = q_scale * tl.load(ROW_SCALE + b * sr_b)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    i = tl.arange(0, BLOCK_HALF)
    rows = t < length
    pairs = rows[:, None] & (i < HALF)[None, :]
    first = b * sc_b + (start + t[:, None]) * sc_t
    if INTERLEAVED:
        # Member tables: one entry per member of a pair, read as the row of x is (contiguous, in x's
        # own layout), the first member's sin negated: y₁ = x₁ cos − x₂ sin, y₂ = x₂ cos + x₁ sin.
        j = tl.arange(0, 2 * BLOCK_HALF)
        members = rows[:, None] & (j < 2 * HALF)[None, :]
        table = first + j[None, :] * sc_i
        cos = tl.load(COS + table, mask=members, other=1.0)
        sin = tl.load(SIN + table, mask=members, other=0.0) * sign
    else:
        table = first + i[None, :] * sc_i
        cos = tl.load(COS + table, mask=pairs, other=1.0)
        sin = tl.load(SIN + table, mask=pairs, other=0.0) * sign
    tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)
    rest = tail < HEAD_DIM
    _rotate_rows(Q, OUT_Q, sq_b, sq_h, sq_t, soq_b, soq_h, soq_t, b, h, t, i, tail, rows, pairs, rest,
                 cos, sin, scale, HALF, INTERLEAVED, HAS_TAIL, BLOCK_T, BLOCK_HALF)
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


_NO_GUARD: ContextManager[None] = contextlib.nullcontext()  # reusable: nothing to enter


def _device_guard(device: torch.device) -> ContextManager:
    """The context a launch on ``device`` runs in. Triton launches on the current CUDA device, so a
    tensor on another one (a model spread over GPUs) needs ``torch.cuda.device`` around the launch,
    as flash-attn does; the common case (the current device, or the interpreter's CPU) enters
    nothing and costs one comparison."""
    if device.type != "cuda" or device.index == torch.cuda.current_device():
        return _NO_GUARD
    return torch.cuda.device(device.index)


def _check_like_q(names: Sequence[str], tensors: Sequence[Tensor], shape: torch.Size, dtype: torch.dtype,
                  device: torch.device) -> None:
    for name, x in zip(names, tensors):
        if x.shape != shape:
            raise ValueError(f"the fused rotation needs {name} of q's shape {tuple(shape)}, "
                             f"got {tuple(x.shape)}")
        if x.dtype != dtype:
            raise ValueError(f"the fused rotation needs {name} of q's dtype {dtype}, got {x.dtype}")
        if x.device != device:
            raise ValueError(f"the fused rotation needs {name} on q's device {device}, got {x.device}")


_QK_NAMES = ("k", "out_q", "out_k")
_QKV_NAMES = ("k", "out_q", "out_k", "v", "out_v")


def rotate(
    q: Tensor, k: Tensor, out_q: Tensor, out_k: Tensor, cos: Tensor, sin: Tensor, start: int,
    interleaved: bool, q_scale: float = 1.0, inverse: bool = False,
    v: Optional[Tensor] = None, out_v: Optional[Tensor] = None, row_scale: Optional[Tensor] = None,
) -> None:
    """Write R q·q_scale to ``out_q`` and R k to ``out_k`` (Rᵀ when ``inverse``), and v to ``out_v``.

    q, k, v, out_*: (B, H, T, head_dim), any strides with a unit last dimension, all alike in
    shape, dtype and device. cos, sin: fp32 (T_table, W) shared by every sentence, position t at row
    start + t; or (B, T_table, W), one table per sentence; start ≥ 0 and start + T ≤ T_table. W is
    rope_dim/2 in the half layout (one entry per pair) and rope_dim in the interleaved one (one
    per member of a pair, sin negated for the first: :func:`~fairseq_rope.rotary_tables.member_tables`),
    so that each layout reads its tables as it reads q. row_scale: fp32 (B,), or None; if given, sentence b's q is scaled by
    q_scale·row_scale[b] (dynamic YaRN's 1/t), in the same single rounding.

    Raises ValueError where the arguments disagree (checked by attribute comparisons only: a
    decoding step's launch is all host time)."""
    if q.dim() != 4:
        raise ValueError(f"the fused rotation takes (B, H, T, head_dim) tensors, got q of shape "
                         f"{tuple(q.shape)}")
    shape, dtype, device = q.shape, q.dtype, q.device
    batch, heads, length, head_dim = shape
    if v is None:
        if out_v is not None:
            raise ValueError("the fused rotation copies v to out_v: out_v without v")
        _check_like_q(_QK_NAMES, (k, out_q, out_k), shape, dtype, device)
        v_args: Sequence[Tensor] = (q, out_q)  # unused without HAS_V
    else:
        if out_v is None:
            raise ValueError("the fused rotation copies v to out_v: v without out_v")
        _check_like_q(_QKV_NAMES, (k, out_q, out_k, v, out_v), shape, dtype, device)
        v_args = (v, out_v)
    # Each stride read once: a decoding step's launch is all host time.
    strides = [x.stride() for x in (q, k, v_args[0], out_q, out_k, v_args[1])]
    if any(stride[3] != 1 for stride in strides):
        raise ValueError("the fused rotation needs a unit stride in the head dimension")
    table_shape = cos.shape
    if sin.shape != table_shape:
        raise ValueError(f"cos {tuple(table_shape)} and sin {tuple(sin.shape)} tables differ in shape")
    if not (len(table_shape) == 2 or len(table_shape) == 3 and table_shape[0] == batch):
        raise ValueError(f"the fused rotation reads (T_table, W) or ({batch}, T_table, W) "
                         f"tables for a batch of {batch}, got {tuple(table_shape)}")
    half = table_shape[-1]
    if interleaved:
        if half % 2:
            raise ValueError(f"the interleaved layout reads member tables, one entry per member of a pair: "
                             f"an even width, got {half}")
        half //= 2
    if 2 * half > head_dim:
        raise ValueError(f"tables of {half} pairs rotate {2 * half} dimensions, past head_dim {head_dim}")
    if start < 0 or start + length > table_shape[-2]:
        raise ValueError(f"positions {start}…{start + length - 1} are not rows of a table of "
                         f"{table_shape[-2]}")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"the fused rotation reads fp32 tables, got {cos.dtype} and {sin.dtype}")
    if cos.device != device or sin.device != device:
        raise ValueError(f"the fused rotation needs the tables on q's device {device}, "
                         f"got {cos.device} and {sin.device}")
    table_strides = cos.stride()
    if sin.stride() != table_strides:
        raise ValueError("cos and sin tables must share their strides")
    if row_scale is not None:
        if row_scale.shape != (batch,) or row_scale.dtype != torch.float32:
            raise ValueError(f"row_scale is one fp32 factor per sentence, ({batch},), "
                             f"got {tuple(row_scale.shape)} {row_scale.dtype}")
        if row_scale.device != device:
            raise ValueError(f"the fused rotation needs row_scale on q's device {device}, "
                             f"got {row_scale.device}")
    if length == 0 or batch * heads == 0:
        return
    block_t, block_half, block_tail, block_d = block_sizes(length, half, head_dim)
    grid = (batch * heads, -(-length // block_t))  # not triton.cdiv: a JIT function, slow to call from Python
    with _device_guard(device):
        _rotary_kernel[grid](
            q, k, v_args[0], out_q, out_k, v_args[1], cos, sin,
            *(s for stride in strides for s in stride[:3]),
            *((0, *table_strides) if len(table_shape) == 2 else table_strides),
            heads, length, start, float(q_scale), -1.0 if inverse else 1.0,
            HEAD_DIM=head_dim, HALF=half, INTERLEAVED=interleaved, HAS_V=v is not None,
            HAS_TAIL=head_dim > 2 * half, BLOCK_T=block_t, BLOCK_HALF=block_half, BLOCK_TAIL=block_tail,
            BLOCK_D=block_d, ROW_SCALE=row_scale, sr_b=0 if row_scale is None else row_scale.stride(0),
            HAS_ROW_SCALE=row_scale is not None,
        )


def _unit_last(x: Tensor) -> Tensor:
    # SDPA's key gradient can arrive transposed (a strided last dimension): one copy then.
    return x if x.stride(-1) == 1 else x.contiguous()


def _needs_grad(*xs: Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def rotate_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
              q_scale: float = 1.0, row_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """R q·q_scale(·row_scale[b]) and R k (see :func:`rotate`) as new (B, H, T, D) tensors,
    differentiable in q and k (not in the tables or row_scale)."""
    if _needs_grad(q, k):
        return FusedRotation.apply(q, k, cos, sin, start, interleaved, q_scale, row_scale)
    return _rotated(q, k, cos, sin, start, interleaved, q_scale, row_scale)


def rotate_packed(qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                  q_scale: float = 1.0, row_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The packed projection (T, B, 3, H, D) as R q·q_scale(·row_scale[b]), R k and v, each a new
    (B, H, T, D) tensor (SDPA's layout), differentiable in qkv: one launch forward, one backward."""
    if _needs_grad(qkv):
        return FusedPackedRotation.apply(qkv, cos, sin, start, interleaved, q_scale, row_scale)
    return _packed(qkv, cos, sin, start, interleaved, q_scale, row_scale)


def _rotated(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool, q_scale: float,
             row_scale: Optional[Tensor], inverse: bool = False) -> Tuple[Tensor, Tensor]:
    q, k = _unit_last(q), _unit_last(k)
    out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    out_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    rotate(q, k, out_q, out_k, cos, sin, start, interleaved, q_scale, inverse, row_scale=row_scale)
    return out_q, out_k


def _packed(qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
            q_scale: float, row_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    length, batch, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
    out = torch.empty((3, batch, heads, length, head_dim), dtype=qkv.dtype, device=qkv.device)
    rotate(q, k, out[0], out[1], cos, sin, start, interleaved, q_scale, v=v, out_v=out[2],
           row_scale=row_scale)
    return out.unbind(0)


def _no_grad_to_row_scale(row_scale: Optional[Tensor]) -> None:
    # Its gradient would be dropped (the backward returns none): say so rather than train without it.
    if row_scale is not None and row_scale.requires_grad:
        raise ValueError("the fused rotation computes no gradient for row_scale: pass it detached")


class FusedRotation(torch.autograd.Function):
    """(q, k) → (R q·q_scale·row_scale[b], R k) as new (B, H, T, D) tensors; the backward is the
    same kernel with the sine negated and the same scales (the gradient of s·R q is s·Rᵀ g),
    writing both gradients in one launch. Once differentiable: the backward is a kernel autograd
    does not see, so a second derivative through it raises."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                q_scale: float, row_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        _no_grad_to_row_scale(row_scale)
        ctx.save_for_backward(cos, sin, row_scale)
        ctx.rotation = (start, interleaved, q_scale)
        return _rotated(q, k, cos, sin, start, interleaved, q_scale, row_scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        cos, sin, row_scale = ctx.saved_tensors
        start, interleaved, q_scale = ctx.rotation
        grads = _rotated(grad_q, grad_k, cos, sin, start, interleaved, q_scale, row_scale, inverse=True)
        return (*grads, None, None, None, None, None, None)


class FusedPackedRotation(torch.autograd.Function):
    """The packed projection (T, B, 3, H, D) → R q·q_scale·row_scale[b], R k and a copy of v, each a
    new (B, H, T, D) tensor (SDPA's layout): the head split costs no copy of its own. The backward
    writes the projection's gradient (T, B, 3, H, D) in one launch, so the projection's own
    backward reads one contiguous gradient (no stack, no permute copy). Once differentiable, as
    :class:`FusedRotation`."""

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor, start: int, interleaved: bool,
                q_scale: float, row_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        _no_grad_to_row_scale(row_scale)
        ctx.save_for_backward(cos, sin, row_scale)
        ctx.rotation = (start, interleaved, q_scale)
        return _packed(qkv, cos, sin, start, interleaved, q_scale, row_scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor):
        cos, sin, row_scale = ctx.saved_tensors
        start, interleaved, q_scale = ctx.rotation
        batch, heads, length, head_dim = grad_q.shape
        grad = torch.empty((length, batch, 3, heads, head_dim), dtype=grad_q.dtype, device=grad_q.device)
        out_q, out_k, out_v = grad.permute(2, 1, 3, 0, 4).unbind(0)
        rotate(_unit_last(grad_q), _unit_last(grad_k), out_q, out_k, cos, sin, start, interleaved, q_scale,
               inverse=True, v=_unit_last(grad_v), out_v=out_v, row_scale=row_scale)
        return grad, None, None, None, None, None, None
