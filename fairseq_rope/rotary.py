"""Rotary Position Embedding (RoPE), after Su et al., *RoFormer: Enhanced Transformer with
Rotary Position Embedding* (2021): the rotation and the position encoding that applies it.

Notation follows the paper. A d-dimensional query or key x at position m is
split into d/2 pairs; pair i is rotated in its plane by the angle m·θ_i
(θ_i: Eq. 15, :mod:`fairseq_rope.rotary_tables`), so that
⟨f(q, m), f(k, n)⟩ = Re[Σ_i q_i k_i* e^{i(m-n)θ_i}] depends on the positions
only through m − n (Eq. 16). The rotation matrix R^d_{Θ,m} is block diagonal
and sparse, so it is applied in the element-wise form of Eq. 34:

    R x = x ⊙ cos(mθ) + rotate(x) ⊙ sin(mθ),
    rotate(x_1, x_2, x_3, x_4, …) = (−x_2, x_1, −x_4, x_3, …).

Two memory layouts of the pairs are supported:

* ``interleaved`` — the paper's adjacent pairs (x_1, x_2), (x_3, x_4), …;
* ``half`` — GPT-NeoX "rotate-half": pair i is (x_i, x_{i + d/2}).

They are the same operator up to a fixed permutation of the head dimensions
(:func:`layout_permutation`). With partial rotary only the first ``rope_dim``
dimensions of each head are rotated; the rest pass through unchanged.

Two implementations, chosen per call by :class:`RotaryEmbedding`:

* **fused** (:mod:`fairseq_rope.rotary_triton`): one Triton kernel rotates q and k
  together, forward and backward, straight from the packed projection, in fp32
  registers, rounded once. The default for whole sequences of CUDA tensors in
  fp32/fp16/bf16 when Triton imports; ``FAIRSEQ_ROPE_TRITON=0`` turns it off
  (``interpret``: also for CPU tensors, under Triton's interpreter, which is how the
  tests run it). A kernel that fails to compile or launch warns once and leaves the
  process to PyTorch (:func:`_fall_back`).
* **PyTorch** (this module): the reference, and the path on the CPU. A full pass
  goes through :func:`apply_rotary`: in the interleaved layout one complex multiply
  by the fp32 e^{imθ} (fp16/bf16 pairs rotated in fp32 and rounded once), in the
  half layout four real kernels. A decoding step, on every device, multiplies its q and k
  by per-position multipliers that also carry the 1/√d of q (:meth:`RotaryEmbedding.encode_step`):
  one position's rotation is host time, which a kernel launch only adds to.

For inputs longer than training, the frequencies can be scaled
(:mod:`fairseq_rope.rope_scaling`): a fixed scale changes only the shared
tables' frequencies; a scale that follows each sentence's source length
rotates each sentence with its own.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import Any, FrozenSet, Iterator, Literal, Optional, Tuple

import torch
from torch import Tensor

from fairseq_rope.position_context import PositionContext
from fairseq_rope.position_encoding import PositionEncoding
from fairseq_rope.rope_scaling import RopeScaling
from fairseq_rope.rotary_tables import (  # noqa: F401  (cos_sin, clear_cos_sin_cache, _TABLES: the cache's API)
    _TABLES,
    DEFAULT_THETA,
    angle_dtype,
    cached_angles,
    clear_cos_sin_cache,
    cos_sin,
    cos_sin_table,
    inverse_frequencies,
    member_tables,
    rotation_angles,
    sentence_cos_sin,
    step_multipliers,
)

Layout = Literal["interleaved", "half"]
LAYOUTS: Tuple[str, ...] = ("interleaved", "half")

#: The fused rotation's switch: unset or ``auto`` (CUDA tensors, when Triton imports), ``0``
#: (never: the PyTorch path everywhere), ``interpret`` (CUDA and CPU tensors, the latter under
#: Triton's interpreter: for tests). Read once, at the first rotation.
FUSED_VARIABLE = "FAIRSEQ_ROPE_TRITON"
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_fused: Optional[Tuple[Any, FrozenSet[str]]] = None


def fused_kernels(x: Tensor) -> Any:
    """:mod:`fairseq_rope.rotary_triton` if it rotates ``x`` (its device and dtype, and the
    switch :data:`FUSED_VARIABLE`), else None."""
    global _fused
    if _fused is None:
        _fused = _load_fused(os.environ.get(FUSED_VARIABLE, "auto").strip().lower())
    module, devices = _fused
    return module if x.device.type in devices and x.dtype in FUSED_DTYPES else None


@contextlib.contextmanager
def fused_rotation(setting: str) -> Iterator[None]:
    """The fused rotation switched as ``FAIRSEQ_ROPE_TRITON=setting`` switches it, for the duration
    (benchmarks and tests compare the two paths in one process)."""
    global _fused
    previous = _fused
    _fused = _load_fused(setting.strip().lower())
    try:
        yield
    finally:
        _fused = previous


def _load_fused(setting: str) -> Tuple[Any, FrozenSet[str]]:
    if setting in ("0", "off", "false", "no"):
        return None, frozenset()
    if setting == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, at import
        devices = frozenset(("cuda", "cpu"))
    elif setting in ("", "auto", "1", "on", "true", "yes"):
        devices = frozenset(("cuda",))
        if not torch.cuda.is_available():
            return None, frozenset()  # no import of Triton where it could not run
    else:
        raise ValueError(f"{FUSED_VARIABLE}={setting!r}: use 0 (off), auto (the default) or interpret")
    try:
        from fairseq_rope import rotary_triton
    except ImportError:  # Triton missing: the PyTorch path, which is exact too
        return None, frozenset()
    return rotary_triton, devices


class FusedRotationFailed(RuntimeWarning):
    """The fused rotation could not compile or launch here: the process rotates with PyTorch."""


def _fall_back(error: Exception) -> None:
    """The kernel failed to compile or launch (an old Triton without ``tl.split``, a GPU its compiler
    does not know, a launch error): warn once, naming the cause, and rotate with PyTorch, which is
    exact too, for the rest of the process. Misuse (the kernel's ValueError checks) and running out
    of memory are not the kernel's failure: those propagate."""
    global _fused
    if isinstance(error, (ValueError, torch.OutOfMemoryError)):
        raise error
    _fused = (None, frozenset())
    warnings.warn(
        f"RoPE: the fused Triton rotation failed ({type(error).__name__}: {error}); rotating with PyTorch "
        f"for the rest of this process. Set {FUSED_VARIABLE}=0 to skip the kernel from the start.",
        FusedRotationFailed, stacklevel=3,
    )


def validate_rope_options(
    head_dim: int, rope_dim: int, theta: float, layout: str
) -> None:
    """Raise ``ValueError`` naming the offending option when RoPE cannot be built."""
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions, but the attention head dimension is "
            f"{head_dim} (odd): choose --encoder/--decoder-embed-dim and "
            f"--*-attention-heads so that embed_dim / heads is even"
        )
    if rope_dim <= 0 or rope_dim > head_dim or rope_dim % 2:
        raise ValueError(
            f"--rope-dim must be an even number in [2, head dim = {head_dim}], "
            f"got {rope_dim}"
        )
    if not (theta > 0 and math.isfinite(theta)):
        raise ValueError(f"--rope-theta must be a finite number > 0, got {theta}")
    if layout not in LAYOUTS:
        raise ValueError(
            f"--rope-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
        )


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, layout: Layout, cis: Optional[Tensor] = None
) -> Tensor:
    """Rotate ``x`` by the angles whose cosines and sines are given (Eq. 34).

    The PyTorch path of a full pass: :meth:`RotaryEmbedding.encode_qk` calls it for q
    and k with the cached cos/sin of positions offset, offset+1, …; called directly
    (cos/sin of :func:`rotation_angles` of any positions) it is the pure function.

    x:        (..., T, head_dim), any float dtype and strides.
    cos, sin: broadcastable to (..., T, rope_dim / 2); ``rope_dim = 2 * cos.size(-1)``
              leading dimensions of each head are rotated, the rest pass through.
    cis:      optionally ``cos + i·sin`` (complex), when the caller has it at hand.

    cos and sin are constants (no gradient flows to them); the gradient with
    respect to x is the inverse rotation of the incoming gradient, since
    R^d_{Θ,m} is orthogonal (Eq. 13).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown RoPE layout {layout!r}; expected one of {LAYOUTS}")
    return _rotate_all((x,), cos, sin, cis, layout)[0]


def _rotate_all(
    xs: Tuple[Tensor, ...], cos: Tensor, sin: Tensor, cis: Optional[Tensor], layout: Layout
) -> Tuple[Tensor, ...]:
    """:func:`apply_rotary` of several tensors at the same positions (q and k): one
    autograd node for all of them when a gradient is needed, none otherwise."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _Rotation.apply(cos, sin, cis, layout, False, *xs)
    return tuple(_rotate(x, cos, sin, cis, layout, inverse=False) for x in xs)


class _Rotation(torch.autograd.Function):
    """Eq. 34 applied by :func:`_rotate`; the backward is the inverse rotation (Rᵀ = R⁻¹)."""

    @staticmethod
    def forward(
        ctx, cos: Tensor, sin: Tensor, cis: Optional[Tensor], layout: Layout, inverse: bool, *xs: Tensor
    ) -> Tuple[Tensor, ...]:
        ctx.save_for_backward(cos, sin, cis)
        ctx.layout, ctx.inverse = layout, inverse
        return tuple(_rotate(x, cos, sin, cis, layout, inverse) for x in xs)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        cos, sin, cis = ctx.saved_tensors
        # Through apply() again, so that higher-order gradients work too.
        rotated_back = _Rotation.apply(cos, sin, cis, ctx.layout, not ctx.inverse, *grads)
        return (None, None, None, None, None, *rotated_back)


def _rotate(
    x: Tensor, cos: Tensor, sin: Tensor, cis: Optional[Tensor], layout: Layout, inverse: bool
) -> Tensor:
    """R x (or Rᵀ x when ``inverse``): one complex multiply in the interleaved layout
    (fp16/bf16 through an fp32 copy, rounded once), four in-place real kernels in the
    half layout."""
    rope_dim = 2 * cos.size(-1)
    if x.stride(-1) != 1:
        # One copy is cheaper than element-wise kernels on a strided last dim
        # (SDPA's key gradient arrives transposed).
        x = x.contiguous()
    partial = rope_dim < x.size(-1)
    rotated, passthrough = (x[..., :rope_dim], x[..., rope_dim:]) if partial else (x, None)
    if layout == "interleaved":
        # fp16/bf16 have no complex counterpart: their pairs are multiplied in fp32 and
        # rounded once, which on a GPU also beats four strided real kernels (docs/design.md).
        compute = angle_dtype(x.dtype)
        if cis is None:
            cis = torch.complex(cos.to(compute), sin.to(compute))
        product = _as_complex(rotated.to(compute)) * (cis.conj() if inverse else cis)
        out = torch.view_as_real(product).flatten(-2).to(x.dtype)
    else:
        out = torch.empty_like(rotated)
        (a, b), (out_a, out_b) = rotated.chunk(2, dim=-1), out.chunk(2, dim=-1)
        # out_a = a cos − b sin, out_b = b cos + a sin (sin negated for the inverse).
        torch.mul(a, cos, out=out_a)
        out_a.addcmul_(b, sin, value=1 if inverse else -1)
        torch.mul(b, cos, out=out_b)
        out_b.addcmul_(a, sin, value=-1 if inverse else 1)
    return torch.cat((out, passthrough), dim=-1) if partial else out


def _as_complex(pairs: Tensor) -> Tensor:
    """Adjacent pairs of the last dim as complex numbers: a view where the strides
    allow it (the usual case, asked of torch rather than checked), else a copy."""
    # view, not unflatten: unflatten is a Python method, and this runs at every decoding step.
    try:
        return torch.view_as_complex(pairs.view(*pairs.shape[:-1], -1, 2))
    except RuntimeError:
        # A copy even when contiguous: an odd storage offset cannot be viewed as complex either.
        copy = pairs.clone(memory_format=torch.contiguous_format)
        return torch.view_as_complex(copy.view(*pairs.shape[:-1], -1, 2))


def layout_permutation(rope_dim: int, head_dim: Optional[int] = None) -> Tensor:
    """Index ``p`` such that ``interleaved(x[..., p]) == half(x)[..., p]``.

    Position j of the ``half`` layout holds pair member (j mod d/2, j div d/2);
    ``p`` lists, in interleaved order, which half-layout dimension holds each
    member, so permuting the rows of a q/k projection by ``p`` turns a
    half-layout model into an equivalent interleaved one.
    """
    head_dim = rope_dim if head_dim is None else head_dim
    half = rope_dim // 2
    pairs = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1)
    return torch.cat((pairs.flatten(), torch.arange(rope_dim, head_dim)))


class RotaryEmbedding(PositionEncoding):
    """RoPE as a position encoding for one attention module's queries and keys.

    Holds only hyper-parameters (no parameters or buffers), so ``.half()``,
    ``.to(device)`` and checkpoints never touch it; cos/sin come from the
    shared fp32-computed tables of :mod:`fairseq_rope.rotary_tables`, and what
    one forward pass reads of them is kept in its
    :class:`~fairseq_rope.position_context.PositionContext`, so every layer of
    the pass reuses it. It has no ``forward``: the attention calls
    :meth:`encode_qkv` (the packed projection of a full pass; :meth:`encode_qk`
    for separate q and k) and :meth:`encode_step` (a decoding step), through
    the fused kernel where it applies, else PyTorch.

    ``scaling`` (:class:`~fairseq_rope.rope_scaling.RopeScaling`, None: the
    paper's RoPE) at a fixed scale only changes the tables' frequencies (and,
    for YaRN, multiplies q by 1/t); a dynamic one rotates each sentence at the
    scale of its source length, ``context.source_lengths``.
    """

    def __init__(
        self,
        head_dim: int,
        rope_dim: Optional[int] = None,
        theta: float = DEFAULT_THETA,
        layout: Layout = "interleaved",
        scaling: Optional[RopeScaling] = None,
    ) -> None:
        super().__init__()
        rope_dim = head_dim if rope_dim is None else rope_dim
        validate_rope_options(head_dim, rope_dim, theta, layout)
        if scaling is not None:
            scaling.validate(rope_dim)
        self.head_dim = head_dim
        self.rope_dim = rope_dim
        self.theta = float(theta)
        self.layout: Layout = layout
        self.scaling = scaling
        self.uses_source_lengths = scaling is not None and scaling.dynamic
        # A fixed scaling keys the shared tables; YaRN's temperature 1/t is folded into q.
        self._table_scaling = None if self.uses_source_lengths else scaling
        self._q_factor = 1.0 if scaling is None or scaling.dynamic else float(scaling.logit_factor(scaling.factor))
        self._interleaved = layout == "interleaved"
        # What a context's shared entries depend on besides the pass (every layer alike).
        self._spec = ("rope", rope_dim, self.theta, layout, scaling, head_dim)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return (
            f"head_dim={self.head_dim}, rope_dim={self.rope_dim}, "
            f"theta={self.theta:g}, layout={self.layout}{scaling}"
        )

    def encode_qk(self, q: Tensor, k: Tensor, context: PositionContext) -> Tuple[Tensor, Tensor]:
        """Rotate queries and keys (..., T, head_dim) at positions offset, offset+1, … (Eq. 34);
        with a dynamic scaling, (B, H, T, head_dim) with sentence b at its own scale."""
        kernels = fused_kernels(q) if q.dim() == 4 and q.shape == k.shape else None
        if kernels is not None:
            try:
                cos, sin, start, row_scale = self._fused_angles(q, context, q.size(0), q.size(-2))
                return kernels.rotate_qk(q, k, cos, sin, start, self._interleaved, self._q_factor, row_scale=row_scale)
            except Exception as error:
                _fall_back(error)
        return self._rotate_with_pytorch(q, k, context)

    def _rotate_with_pytorch(self, q: Tensor, k: Tensor, context: PositionContext) -> Tuple[Tensor, Tensor]:
        if self.uses_source_lengths:
            cos, sin, factor = self._sentence_angles(context, q, q.size(-2), q.dtype)
            q, k = _rotate_all((q, k), cos, sin, None, self.layout)
            return (q * factor if factor is not None else q), k
        # One table lookup per pass for every layer, and no module call: a decoding step is
        # all overhead, the tensors being a single position each.
        length, device, dtype = q.size(-2), q.device, q.dtype
        cos, sin, cis = context.shared(
            (self._spec, "angles", length, device, dtype, torch.is_inference_mode_enabled()),
            lambda: cached_angles(length, self.rope_dim, self.theta, device, dtype, context.offset,
                                  self._table_scaling))
        q, k = _rotate_all((q, k), cos, sin, cis, self.layout)
        if self._q_factor != 1.0:
            q = q * self._q_factor  # YaRN: softmax(q·k / (t·√d))
        return q, k

    def encode_qkv(self, qkv: Tensor, context: PositionContext) -> Tuple[Tensor, Tensor, Tensor]:
        """The packed projection (T, B, 3, H, head_dim) as encoded q, k and v, each (B, H, T, head_dim)
        in SDPA's layout, by the fused kernel in one launch (its backward too); where the kernel
        does not apply, the heads are split (views) and rotated by :meth:`encode_qk`."""
        kernels = fused_kernels(qkv)
        if kernels is not None:
            try:
                cos, sin, start, row_scale = self._fused_angles(qkv, context, qkv.size(1), qkv.size(0))
                return kernels.rotate_packed(qkv, cos, sin, start, self._interleaved, self._q_factor,
                                             row_scale=row_scale)
            except Exception as error:
                _fall_back(error)
        return super().encode_qkv(qkv, context)

    def _fused_angles(
        self, x: Tensor, context: PositionContext, batch: int, length: int
    ) -> Tuple[Tensor, Tensor, int, Optional[Tensor]]:
        """The fused kernel's fp32 cos and sin, the table row of the first position, and a per-sentence
        scale of q (dynamic YaRN's 1/t, applied inside the kernel) or None."""
        if self.uses_source_lengths:
            cos, sin, factor = self._sentence_angles(context, x, length, torch.float32, batch)
            # (B, 1, T, d/2): each sentence's own table, from its first position.
            cos, sin = cos[:, 0], sin[:, 0]
            if self._interleaved:
                cos, sin = context.shared((self._spec, "sentence members", length), lambda: member_tables(cos, sin))
            return cos, sin, 0, None if factor is None else factor.view(-1)
        device, dtype = x.device, x.dtype
        table = context.shared(
            (self._spec, "table", device, dtype, length),
            lambda: cos_sin_table(self.rope_dim, self.theta, device, dtype, context.offset + length,
                                  self._table_scaling))
        cos, sin = table.members() if self._interleaved else (table.cos_angle, table.sin_angle)
        return cos, sin, context.offset, None

    def _sentence_angles(
        self, context: PositionContext, x: Tensor, length: int, dtype: torch.dtype, batch: Optional[int] = None
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """:func:`sentence_cos_sin` of the context's source lengths, once per pass."""
        lengths = context.source_lengths
        if lengths is None:
            raise RuntimeError(
                f"--rope-scaling {self.scaling.kind} scales each sentence by its source length, which a "
                "transformer_rope encoder and decoder put in the position context of each forward; this "
                "self-attention ran without one (outside such a model, or recomputed after the forward)"
            )
        expected = x.size(0) if batch is None else batch
        if (batch is None and x.dim() != 4) or lengths.shape != (expected,):
            raise RuntimeError(
                f"{tuple(lengths.shape)} source lengths for queries of shape {tuple(x.shape)}: "
                "expected one per sentence of a (batch, heads, time, head_dim) tensor"
            )
        return context.shared(
            (self._spec, "sentences", length, dtype, torch.is_inference_mode_enabled()),
            lambda: sentence_cos_sin(self.scaling, lengths, length, self.rope_dim, self.theta, dtype, context.offset))

    def encode_step(self, qkv: Tensor, context: PositionContext, q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        """A decoding step's q, k and v, each (B, H, head_dim), from qkv (B, 3, H, head_dim), the
        1/√d scaling of q folded into the rotation: one complex multiply in the interleaved layout
        (Eq. 16's form), three real kernels in the half layout, by multipliers made once per step
        for every layer. Always PyTorch: a step rotates one position, and its cost is host time,
        which the kernel's launch raises (docs/benchmarks/decoding-step-host-cpu.md)."""
        if (qkv.requires_grad and torch.is_grad_enabled()) or self.uses_source_lengths:
            # Through the full pass's rotation (and its backward; or each sentence's own angles).
            q, k = self._rotate_with_pytorch(qkv[:, 0, :, None], qkv[:, 1, :, None], context)
            return q[:, :, 0] * q_scale, k[:, :, 0], qkv[:, 2]
        q_scale = q_scale * self._q_factor  # exact for 1.0: unscaled steps are unchanged
        device, dtype = qkv.device, qkv.dtype
        multipliers = context.shared(
            (self._spec, "step", device, dtype, q_scale),
            lambda: step_multipliers(context.offset, self.rope_dim, self.theta, device, dtype, q_scale,
                                     self.head_dim, self.layout, self._table_scaling))
        qk = qkv[:, :2]
        rotated = self._half_step(qk, multipliers) if self.layout == "half" else self._complex_step(qk, multipliers)
        q, k = rotated.unbind(1)
        return q, k, qkv[:, 2]

    @staticmethod
    def _complex_step(qk: Tensor, multipliers: Tensor) -> Tensor:
        # qk's own table, the one its full passes use: its e^{imθ} is fp32 (fp64) whatever qk's dtype.
        dtype = angle_dtype(qk.dtype)
        if qk.dtype == dtype:
            pairs = _as_complex(qk)
            # Written as (2, B, H, ·) memory: the step's q and k each come out contiguous.
            out = pairs.new_empty((2, pairs.size(0), *pairs.shape[2:])).transpose(0, 1)
            torch.mul(pairs, multipliers, out=out)
            return torch.view_as_real(out).flatten(-2)
        # fp16/bf16 have no complex counterpart: rotated in fp32, rounded once at the
        # end. The copies, of the (2, B, ·) view, leave q and k each contiguous.
        x = qk.transpose(0, 1).to(dtype, memory_format=torch.contiguous_format)
        torch.view_as_complex(x.view(*x.shape[:-1], -1, 2)).transpose(0, 1).mul_(multipliers)
        return x.to(qk.dtype).transpose(0, 1)

    def _half_step(self, qk: Tensor, multipliers: Tuple[Tensor, Tensor]) -> Tensor:
        """x ⊙ C + swap(x) ⊙ S, swap exchanging the halves of the rotated dimensions."""
        cos, sin = multipliers
        x = qk.transpose(0, 1)
        half = self.rope_dim // 2
        if self.rope_dim == self.head_dim:
            swapped = x.roll(half, -1)
        else:
            swapped = torch.cat((x[..., half:self.rope_dim], x[..., :half], x[..., self.rope_dim:]), -1)
        # The swap's copy, of the (2, B, ·) view, is the output: q and k each contiguous.
        out = swapped.transpose(0, 1).mul_(sin)
        return out.addcmul_(qk, cos)
