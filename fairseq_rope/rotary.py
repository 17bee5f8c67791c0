"""Rotary Position Embedding (RoPE) math, after Su et al., *RoFormer: Enhanced
Transformer with Rotary Position Embedding* (2021).

Notation follows the paper. A d-dimensional query or key x at position m is
split into d/2 pairs; pair i is rotated in its plane by the angle m·θ_i with

    θ_i = base^(-2(i-1)/d),  i = 1 … d/2                           (Eq. 15)

so that ⟨f(q, m), f(k, n)⟩ = Re[Σ_i q_i k_i* e^{i(m-n)θ_i}] depends on the
positions only through m − n (Eq. 16). The rotation matrix R^d_{Θ,m} is block
diagonal and sparse, so it is applied in the element-wise form of Eq. 34:

    R x = x ⊙ cos(mθ) + rotate(x) ⊙ sin(mθ),
    rotate(x_1, x_2, x_3, x_4, …) = (−x_2, x_1, −x_4, x_3, …).

Two memory layouts of the pairs are supported:

* ``interleaved`` — the paper's adjacent pairs (x_1, x_2), (x_3, x_4), …;
* ``half`` — GPT-NeoX "rotate-half": pair i is (x_i, x_{i + d/2}).

They are the same operator up to a fixed permutation of the head dimensions
(:func:`layout_permutation`). With partial rotary only the first ``rope_dim``
dimensions of each head are rotated; the rest pass through unchanged.

Angles are always computed in fp32 (fp64 for fp64 inputs), whatever the dtype
of q and k: in fp16 the position 20000 is not even representable to the unit,
let alone its product with θ_1. Only the final cos/sin are cast to q's dtype.
In the interleaved layout fp16 and bf16 pairs are rotated in fp32 too, by the
fp32 e^{imθ}, and rounded once: as a decoding step rotates them.

For inputs longer than training, the frequencies can be scaled
(:mod:`fairseq_rope.rope_scaling`): a fixed scale changes only the shared
tables' frequencies; a scale that follows each sentence's source length
rotates each sentence with its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Dict, List, Literal, Optional, Tuple

import torch
from torch import Tensor

from fairseq_rope.position_encoding import PositionEncoding
from fairseq_rope.rope_scaling import RopeScaling

Layout = Literal["interleaved", "half"]
LAYOUTS: Tuple[str, ...] = ("interleaved", "half")
DEFAULT_THETA = 10000.0


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


def angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of the angles for inputs of ``dtype``: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def inverse_frequencies(
    rope_dim: int,
    theta: float = DEFAULT_THETA,
    device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """θ_i = base^(−2(i−1)/d) for i = 1 … d/2 (Eq. 15), shape (d/2,)."""
    exponents = torch.arange(0, rope_dim, 2, dtype=torch.float64, device=device)
    return (float(theta) ** (-exponents / rope_dim)).to(dtype)


def scaled_frequencies(
    rope_dim: int,
    theta: float,
    scaling: Optional[RopeScaling],
    device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """θ_i (Eq. 15), or their scaling at its fixed scale S: computed in fp64, then cast."""
    if scaling is None:
        return inverse_frequencies(rope_dim, theta, device, dtype)
    return scaling.frequencies(inverse_frequencies(rope_dim, theta, device, torch.float64), scaling.factor).to(dtype)


def rotation_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """The angles m·θ_i in inv_freq's precision, shape ``positions.shape + (d/2,)``."""
    return positions.to(inv_freq.dtype).unsqueeze(-1) * inv_freq


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, layout: Layout, cis: Optional[Tensor] = None
) -> Tensor:
    """Rotate ``x`` by the angles whose cosines and sines are given (Eq. 34).

    The one rotation path: :meth:`RotaryEmbedding.encode_qk` calls it for q and
    k with the cached cos/sin of positions offset, offset+1, …; called directly
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


class _CosSinTable:
    """cos/sin of m·θ_i for m in [0, capacity), in one device and dtype."""

    def __init__(self, inv_freq: Tensor, dtype: torch.dtype, capacity: int) -> None:
        positions = torch.arange(capacity, device=inv_freq.device)
        angles = rotation_angles(positions, inv_freq)
        cos, sin = angles.cos(), angles.sin()
        self.cos = cos.to(dtype)
        self.sin = sin.to(dtype)
        # e^{i mθ} in the angles' precision, for the interleaved layout's complex
        # multiply (see _rotate): every pair in one pass (Eq. 16's form, e^{imθ} · (x1 + i x2)).
        self.cis = torch.complex(cos, sin)
        self._inv_freq = inv_freq
        self._steps: Dict[Tuple[float, int, str], Tuple[Any, ...]] = {}

    def step_multipliers(self, q_scale: float, head_dim: int, layout: Layout) -> Tuple[Any, ...]:
        """What a decoding step multiplies its q and k (B, 2, H, head_dim) by, for each
        position m (indexed by m: a step finds its own by tuple indexing, without a
        tensor op), q's row scaled by ``q_scale``:

        * ``interleaved`` (complex tables only): [q_scale · e^{imθ}, e^{imθ}] as a
          (2, 1, head_dim/2) complex view, the pairs past rope_dim multiplied by
          [q_scale, 1];
        * ``half``: (C, S), each (2, 1, head_dim) in the table's dtype, such that
          R x = x ⊙ C + swap(x) ⊙ S, swap exchanging the members of each pair
          (past rope_dim C = 1, S = 0).
        """
        key = (q_scale, head_dim, layout)
        steps = self._steps.get(key)
        if steps is None:
            with torch.inference_mode(False):  # shared, like the table itself
                build = self._complex_steps if layout == "interleaved" else self._half_steps
                steps = build(q_scale, head_dim)
            self._steps[key] = steps
        return steps

    def _complex_steps(self, q_scale: float, head_dim: int) -> Tuple[Tensor, ...]:
        passthrough = self.cis.new_ones(self.capacity, head_dim // 2 - self.cis.size(-1))
        cis = torch.cat((self.cis, passthrough), -1)
        return torch.stack((cis * q_scale, cis), dim=1).unsqueeze(2).unbind(0)

    def _half_steps(self, q_scale: float, head_dim: int) -> Tuple[Tuple[Tensor, Tensor], ...]:
        # From the angles, not from the cast cos/sin: C and S are rounded to the
        # dtype once, after the product with q_scale.
        angles = rotation_angles(torch.arange(self.capacity, device=self._inv_freq.device), self._inv_freq)
        cos, sin = angles.cos(), angles.sin()
        passthrough = head_dim - 2 * cos.size(-1)
        cos = torch.cat((cos, cos, cos.new_ones(self.capacity, passthrough)), -1)
        sin = torch.cat((-sin, sin, sin.new_zeros(self.capacity, passthrough)), -1)
        cos, sin = (torch.stack((t * q_scale, t), dim=1).unsqueeze(2).to(self.cos.dtype) for t in (cos, sin))
        return tuple(zip(cos.unbind(0), sin.unbind(0)))

    @property
    def capacity(self) -> int:
        return self.cos.size(0)


#: Most cos/sin tables :func:`cos_sin` keeps: one per (rope_dim, theta, scaling,
#: device, dtype) in use. A model needs one or two (its rope_dim and dtype on its device);
#: beyond this bound the least recently used table is dropped and, if needed
#: again, rebuilt identically.
COS_SIN_CACHE_SIZE = 16

# Tables are shared by every layer (and model) with the same (rope_dim, theta) and
# fixed scaling (None: unscaled), per device and dtype; they hold no parameters and
# never enter a state dict. Least recently used first.
TableKey = Tuple[int, float, torch.device, torch.dtype, Optional[RopeScaling]]
_TABLES: "OrderedDict[TableKey, _CosSinTable]" = OrderedDict()


# The last lookup and its slices. Every layer of an encoder or decoder asks for the
# same positions in one forward pass (in a decoding step: one position), so all
# but the first layer are served here without touching the table cache.
_LAST_LOOKUP: List[Any] = [None, None]


def clear_cos_sin_cache() -> None:
    """Drop every cached cos/sin table (and the device memory it holds)."""
    _TABLES.clear()
    _LAST_LOOKUP[:] = [None, None]
    _LAST_STEP[:] = [None, ()]
    _LAST_SENTENCES[:] = [None, None]


def cos_sin(
    length: int,
    rope_dim: int,
    theta: float,
    device: torch.device,
    dtype: torch.dtype,
    offset: int = 0,
    scaling: Optional[RopeScaling] = None,
) -> Tuple[Tensor, Tensor]:
    """cos and sin of the angles for positions offset … offset+length−1, at the
    frequencies of a fixed ``scaling`` if given.

    Served from a cache that grows (to the next power of two) on demand, so
    there is no maximum length; angles are computed in fp32 and only the final
    values are cast to ``dtype``. The cache holds at most
    :data:`COS_SIN_CACHE_SIZE` tables (least recently used dropped first);
    :func:`clear_cos_sin_cache` empties it.
    """
    cos, sin, _ = _cached_angles(length, rope_dim, theta, device, dtype, offset, scaling)
    return cos, sin


def _cached_angles(
    length: int, rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, offset: int,
    scaling: Optional[RopeScaling] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`cos_sin` and cos + i·sin in the angles' precision (fp32, or fp64)."""
    # Slices taken under inference mode are not for autograd: a separate entry.
    lookup = (length, offset, rope_dim, theta, device, dtype, torch.is_inference_mode_enabled(), scaling)
    if _LAST_LOOKUP[0] == lookup:
        return _LAST_LOOKUP[1]
    needed = offset + length
    table = _table(rope_dim, theta, device, dtype, needed, scaling)
    angles = (table.cos[offset:needed], table.sin[offset:needed], table.cis[offset:needed])
    _LAST_LOOKUP[:] = [lookup, angles]
    return angles


def _table(
    rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, needed: int,
    scaling: Optional[RopeScaling] = None,
) -> "_CosSinTable":
    """The shared table of (rope_dim, θ, a fixed scaling or None) on ``device`` in ``dtype``,
    holding at least ``needed`` positions; built or grown on demand, least recently used dropped."""
    key = (rope_dim, float(theta), device if isinstance(device, torch.device) else torch.device(device), dtype,
           scaling)
    table = _TABLES.get(key)
    if table is None or table.capacity < needed:
        capacity = max(256, 1 << (needed - 1).bit_length())
        # Built as normal tensors even when the first caller decodes under
        # torch.inference_mode(): an inference tensor in the shared table would
        # make every later training step fail ("Inference tensors cannot be
        # saved for backward"), the backward saving cos/sin.
        with torch.inference_mode(False):
            inv_freq = scaled_frequencies(rope_dim, theta, scaling, device, angle_dtype(dtype))
            table = _CosSinTable(inv_freq, dtype, capacity)
        _TABLES[key] = table
        while len(_TABLES) > COS_SIN_CACHE_SIZE:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return table


# The step multipliers of the last table asked for (see _step_multipliers). The key
# does not depend on the position, so every layer and step of a beam search hits it.
_LAST_STEP: List[Any] = [None, ()]


def _step_multipliers(
    offset: int, rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, q_scale: float,
    head_dim: int, layout: Layout, scaling: Optional[RopeScaling] = None,
) -> Any:
    """Position ``offset``'s entry of :meth:`_CosSinTable.step_multipliers`."""
    lookup = (rope_dim, theta, device, dtype, q_scale, head_dim, layout, scaling)
    steps = _LAST_STEP[1]
    if offset >= len(steps) or _LAST_STEP[0] != lookup:
        table = _table(rope_dim, theta, device, dtype, offset + 1, scaling)
        steps = table.step_multipliers(q_scale, head_dim, layout)
        _LAST_STEP[:] = [lookup, steps]
    return steps[offset]


# The last per-sentence lookup (see sentence_cos_sin). Every layer of an encoder or
# decoder rotates the same sentences at the same positions in one forward pass, and
# is given the same source-length tensor: the first layer computes, the others reuse.
_LAST_SENTENCES: List[Any] = [None, None]


def sentence_cos_sin(
    scaling: RopeScaling, source_lengths: Tensor, length: int, rope_dim: int, theta: float,
    dtype: torch.dtype, offset: int = 0,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """cos and sin, (B, 1, length, rope_dim/2), of positions offset … offset+length−1 for each
    sentence at its own scale s = ``scaling.scale(source_lengths)``; and YaRN's logit factor 1/t
    per sentence, (B, 1, 1, 1), or None. Angles in fp32 (fp64 for fp64), like the tables."""
    lookup = (length, offset, rope_dim, theta, dtype, torch.is_inference_mode_enabled(), scaling)
    last = _LAST_SENTENCES[0]
    if last is not None and last[0] is source_lengths and last[1] == lookup:
        return _LAST_SENTENCES[1]
    device = source_lengths.device
    scale = scaling.scale(source_lengths)[:, None]  # (B, 1), fp64
    inv_freq = scaling.frequencies(inverse_frequencies(rope_dim, theta, device, torch.float64), scale)
    positions = torch.arange(offset, offset + length, device=device)
    angles = rotation_angles(positions, inv_freq.to(angle_dtype(dtype))[:, None])  # (B, T, d/2)
    factor = None
    if scaling.method == "yarn":
        factor = scaling.logit_factor(scale).to(dtype)[:, :, None, None]
    result = (angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None], factor)
    _LAST_SENTENCES[:] = [(source_lengths, lookup), result]
    return result


class RotaryEmbedding(PositionEncoding):
    """RoPE as a position encoding for one attention module's queries and keys.

    Holds only hyper-parameters (no parameters or buffers), so ``.half()``,
    ``.to(device)`` and checkpoints never touch it; cos/sin come from the
    shared fp32-computed cache of :func:`cos_sin`. It has no ``forward``: the
    attention calls :meth:`encode_qk`, the only way it rotates (through
    :func:`apply_rotary`).

    ``scaling`` (:class:`~fairseq_rope.rope_scaling.RopeScaling`, None: the
    paper's RoPE) at a fixed scale only changes the tables' frequencies (and,
    for YaRN, multiplies q by 1/t); a dynamic one rotates each sentence at the
    scale of its source length, which the model tells it before each forward
    (:meth:`set_source_lengths`).
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
        self.source_lengths: Optional[Tensor] = None

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return (
            f"head_dim={self.head_dim}, rope_dim={self.rope_dim}, "
            f"theta={self.theta:g}, layout={self.layout}{scaling}"
        )

    def set_source_lengths(self, lengths: Optional[Tensor]) -> None:
        self.source_lengths = lengths

    def encode_qk(self, q: Tensor, k: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
        """Rotate queries and keys (..., T, head_dim) at positions offset, offset+1, … (Eq. 34);
        with a dynamic scaling, (B, H, T, head_dim) with sentence b at its own scale."""
        if self.uses_source_lengths:
            return self._encode_sentences(q, k, offset)
        # One table lookup for both, and no module call: a decoding step is
        # all overhead, the tensors being a single position each.
        cos, sin, cis = _cached_angles(
            q.size(-2), self.rope_dim, self.theta, q.device, q.dtype, offset, self._table_scaling
        )
        q, k = _rotate_all((q, k), cos, sin, cis, self.layout)
        if self._q_factor != 1.0:
            q = q * self._q_factor  # YaRN: softmax(q·k / (t·√d))
        return q, k

    def _encode_sentences(self, q: Tensor, k: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
        lengths = self.source_lengths
        if lengths is None:
            raise RuntimeError(
                f"--rope-scaling {self.scaling.kind} scales each sentence by its source length, which a "
                "transformer_rope encoder and decoder give their self-attention before each forward "
                "(set_source_lengths); none was given"
            )
        if q.dim() != 4 or lengths.shape != q.shape[:1]:
            raise RuntimeError(
                f"{tuple(lengths.shape)} source lengths for queries of shape {tuple(q.shape)}: "
                "expected one per sentence of a (batch, heads, time, head_dim) tensor"
            )
        cos, sin, factor = sentence_cos_sin(
            self.scaling, lengths, q.size(-2), self.rope_dim, self.theta, q.dtype, offset
        )
        q, k = _rotate_all((q, k), cos, sin, None, self.layout)
        if factor is not None:
            q = q * factor
        return q, k

    def encode_step(self, qk: Tensor, offset: int, q_scale: float) -> Tensor:
        """A decoding step's q and k (B, 2, H, head_dim) rotated, the 1/√d scaling of
        q folded into the per-position multipliers: one complex multiply in the
        interleaved layout (Eq. 16's form), three real kernels in the half layout."""
        if (qk.requires_grad and torch.is_grad_enabled()) or self.uses_source_lengths:
            # Through encode_qk (and its backward; or each sentence's own angles).
            return super().encode_step(qk, offset, q_scale)
        q_scale = q_scale * self._q_factor  # exact for 1.0: unscaled steps are unchanged
        if self.layout == "half":
            return self._half_step(qk, offset, q_scale)
        # qk's own table, the one its full passes use: its e^{imθ} is fp32 (fp64) whatever qk's dtype.
        multipliers = _step_multipliers(
            offset, self.rope_dim, self.theta, qk.device, qk.dtype, q_scale, self.head_dim, "interleaved",
            self._table_scaling,
        )
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

    def _half_step(self, qk: Tensor, offset: int, q_scale: float) -> Tensor:
        """x ⊙ C + swap(x) ⊙ S, swap exchanging the halves of the rotated dimensions."""
        cos, sin = _step_multipliers(
            offset, self.rope_dim, self.theta, qk.device, qk.dtype, q_scale, self.head_dim, "half",
            self._table_scaling,
        )
        x = qk.transpose(0, 1)
        half = self.rope_dim // 2
        if self.rope_dim == self.head_dim:
            swapped = x.roll(half, -1)
        else:
            swapped = torch.cat((x[..., half:self.rope_dim], x[..., :half], x[..., self.rope_dim:]), -1)
        # The swap's copy, of the (2, B, ·) view, is the output: q and k each contiguous.
        out = swapped.transpose(0, 1).mul_(sin)
        return out.addcmul_(qk, cos)
