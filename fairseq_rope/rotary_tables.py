"""RoPE's frequencies and the cos/sin tables every rotation reads (RoFormer Eq. 15).

θ_i = base^(−2(i−1)/d), i = 1 … d/2, and the angles m·θ_i are always computed in fp32
(fp64 for fp64 inputs), whatever the dtype of q and k: in fp16 the position 20000 is not even
representable to the unit, let alone its product with θ_1. The tables keep cos and sin in the
inputs' dtype (the half layout's real kernels), e^{imθ} in the angles' precision (the interleaved
layout's complex multiply), its real and imaginary parts as contiguous tables (the fused kernel),
and a decoding step's per-position multipliers.

Tables are shared by every layer (and model) with the same (rope_dim, θ, fixed scaling) on one
device in one dtype: a bounded cache keyed by those values, which changes under a lock, so
several threads may decode at once (the hub interface). They hold no parameters and never enter
a state dict. A dynamic scaling gives each sentence its own angles (:func:`sentence_cos_sin`).
What one forward pass reads of them (slices at its positions, a step's multipliers) the
encoding keeps in that pass's :class:`~fairseq_rope.position_context.PositionContext`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq_rope.rope_scaling import RopeScaling

DEFAULT_THETA = 10000.0


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


class CosSinTable:
    """cos/sin of m·θ_i for m in [0, capacity), in one device and dtype."""

    def __init__(self, inv_freq: Tensor, dtype: torch.dtype, capacity: int) -> None:
        positions = torch.arange(capacity, device=inv_freq.device)
        angles = rotation_angles(positions, inv_freq)
        cos, sin = angles.cos(), angles.sin()
        self.cos = cos.to(dtype)
        self.sin = sin.to(dtype)
        # e^{i mθ} in the angles' precision, for the interleaved layout's complex
        # multiply: every pair in one pass (Eq. 16's form, e^{imθ} · (x1 + i x2)).
        self.cis = torch.complex(cos, sin)
        # The same values, contiguous, for the fused kernel's half layout: it reads a row of each
        # with unit stride (views of cis, stride 2, cost it half its speed on an H200); its
        # interleaved layout reads them per member of a pair (member_tables, built on first use).
        self.cos_angle, self.sin_angle = cos, sin
        self._members: Optional[Tuple[Tensor, Tensor]] = None
        self._inv_freq = inv_freq
        self._steps: Dict[Tuple[float, int, str], Tuple[Any, ...]] = {}

    def step_multipliers(self, q_scale: float, head_dim: int, layout: str) -> Tuple[Any, ...]:
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
            self._steps[key] = steps  # one dict store: threads at most build it twice
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

    def members(self) -> Tuple[Tensor, Tensor]:
        """:func:`member_tables` of the whole table (built once: threads at most build it twice)."""
        if self._members is None:
            with torch.inference_mode(False):  # shared, like the table itself
                self._members = member_tables(self.cos_angle, self.sin_angle)
        return self._members

    @property
    def capacity(self) -> int:
        return self.cos.size(0)


def member_tables(cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor]:
    """cos and sin (…, d/2), one per pair, as (…, d) tables with one entry per member of a pair,
    in the interleaved layout's order: cos_i twice, then −sin_i and +sin_i, so that the rotated
    pair is x ⊙ cos + swap(x) ⊙ sin (swap exchanging the members). Contiguous: the fused kernel
    reads them as it reads a row of q."""
    return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)


#: Most cos/sin tables kept: one per (rope_dim, theta, scaling, device, dtype) in use. A model
#: needs one or two (its rope_dim and dtype on its device); beyond this bound the least recently
#: used table is dropped and, if needed again, rebuilt identically.
COS_SIN_CACHE_SIZE = 16

# Least recently used first; changed only under _TABLES_LOCK.
TableKey = Tuple[int, float, torch.device, torch.dtype, Optional[RopeScaling]]
_TABLES: "OrderedDict[TableKey, CosSinTable]" = OrderedDict()
_TABLES_LOCK = threading.Lock()

def clear_cos_sin_cache() -> None:
    """Drop every cached cos/sin table (and the device memory it holds)."""
    with _TABLES_LOCK:
        _TABLES.clear()


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
    cos, sin, _ = cached_angles(length, rope_dim, theta, device, dtype, offset, scaling)
    return cos, sin


def cached_angles(
    length: int, rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, offset: int,
    scaling: Optional[RopeScaling] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`cos_sin` and cos + i·sin in the angles' precision (fp32, or fp64)."""
    needed = offset + length
    table = cos_sin_table(rope_dim, theta, device, dtype, needed, scaling)
    return table.cos[offset:needed], table.sin[offset:needed], table.cis[offset:needed]


def cos_sin_table(
    rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, needed: int,
    scaling: Optional[RopeScaling] = None,
) -> CosSinTable:
    """The shared table of (rope_dim, θ, a fixed scaling or None) on ``device`` in ``dtype``,
    holding at least ``needed`` positions; built or grown on demand, least recently used dropped."""
    key = (rope_dim, float(theta), device if isinstance(device, torch.device) else torch.device(device), dtype,
           scaling)
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None or table.capacity < needed:
            capacity = max(256, 1 << (needed - 1).bit_length())
            # Built as normal tensors even when the first caller decodes under
            # torch.inference_mode(): an inference tensor in the shared table would
            # make every later training step fail ("Inference tensors cannot be
            # saved for backward"), the backward saving cos/sin.
            with torch.inference_mode(False):
                inv_freq = scaled_frequencies(rope_dim, theta, scaling, device, angle_dtype(dtype))
                table = CosSinTable(inv_freq, dtype, capacity)
            _TABLES[key] = table
            while len(_TABLES) > COS_SIN_CACHE_SIZE:
                _TABLES.popitem(last=False)
        _TABLES.move_to_end(key)
    return table


def step_multipliers(
    offset: int, rope_dim: int, theta: float, device: torch.device, dtype: torch.dtype, q_scale: float,
    head_dim: int, layout: str, scaling: Optional[RopeScaling] = None,
) -> Any:
    """Position ``offset``'s entry of :meth:`CosSinTable.step_multipliers`."""
    table = cos_sin_table(rope_dim, theta, device, dtype, offset + 1, scaling)
    return table.step_multipliers(q_scale, head_dim, layout)[offset]


def sentence_cos_sin(
    scaling: RopeScaling, source_lengths: Tensor, length: int, rope_dim: int, theta: float,
    dtype: torch.dtype, offset: int = 0,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """cos and sin, (B, 1, length, rope_dim/2), of positions offset … offset+length−1 for each
    sentence at its own scale s = ``scaling.scale(source_lengths)``; and YaRN's logit factor 1/t
    per sentence, (B, 1, 1, 1), or None. Angles in fp32 (fp64 for fp64), like the tables; cos
    and sin cast to ``dtype`` (the fused kernel asks for fp32), the factor to ``dtype`` too."""
    device = source_lengths.device
    scale = scaling.scale(source_lengths)[:, None]  # (B, 1), fp64
    inv_freq = scaling.frequencies(inverse_frequencies(rope_dim, theta, device, torch.float64), scale)
    positions = torch.arange(offset, offset + length, device=device)
    angles = rotation_angles(positions, inv_freq.to(angle_dtype(dtype))[:, None])  # (B, T, d/2)
    factor = None
    if scaling.method == "yarn":
        factor = scaling.logit_factor(scale).to(dtype)[:, :, None, None]
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None], factor
