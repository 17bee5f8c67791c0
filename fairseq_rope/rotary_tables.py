"""RoPE's frequencies and the cos/sin tables every rotation reads (RoFormer Eq. 15).

θ_i = base^(−2(i−1)/d), i = 1 … d/2, and the angles m·θ_i are always computed in fp32
(fp64 for fp64 inputs), whatever the dtype of q and k: in fp16 the position 20000 is not even
representable to the unit, let alone its product with θ_1. The tables keep cos and sin in the
inputs' dtype (the half layout's real kernels), e^{imθ} in the angles' precision (the interleaved
layout's complex multiply), its real and imaginary parts as contiguous tables (the fused kernel),
and a decoding step's per-position multipliers.

Tables are shared by every layer (and model) with the same (rope_dim, θ, fixed scaling) on one
device in one dtype; they hold no parameters and never enter a state dict. A dynamic scaling
gives each sentence its own angles (:func:`sentence_cos_sin`).

Thread safety: several threads may decode at once (the hub interface). Each single-entry cache
below is one ``(key, value)`` tuple, read once and replaced whole, so a thread never pairs its
key with another thread's value; the table cache itself changes under a lock.
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
        # The same values, contiguous, for the fused kernel: it reads a row of each with unit
        # stride (views of cis, stride 2, cost it half its speed on an H200).
        self.cos_angle, self.sin_angle = cos, sin
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

    @property
    def capacity(self) -> int:
        return self.cos.size(0)


#: Most cos/sin tables kept: one per (rope_dim, theta, scaling, device, dtype) in use. A model
#: needs one or two (its rope_dim and dtype on its device); beyond this bound the least recently
#: used table is dropped and, if needed again, rebuilt identically.
COS_SIN_CACHE_SIZE = 16

# Least recently used first; changed only under _TABLES_LOCK.
TableKey = Tuple[int, float, torch.device, torch.dtype, Optional[RopeScaling]]
_TABLES: "OrderedDict[TableKey, CosSinTable]" = OrderedDict()
_TABLES_LOCK = threading.Lock()

_EMPTY: Tuple[Any, Any] = (None, None)
# The last lookup and its slices. Every layer of an encoder or decoder asks for the same
# positions in one forward pass (in a decoding step: one position), so all but the first
# layer are served here without touching the table cache.
_last_lookup: Tuple[Any, Any] = _EMPTY
# The step multipliers of the last table asked for: the key does not depend on the
# position, so every layer and step of a beam search hits it.
_last_step: Tuple[Any, Any] = _EMPTY
# The last per-sentence lookup: every layer rotates the same sentences at the same positions
# in one forward pass, and is given the same source-length tensor.
_last_sentences: Tuple[Any, Any] = _EMPTY


def clear_cos_sin_cache() -> None:
    """Drop every cached cos/sin table (and the device memory it holds)."""
    global _last_lookup, _last_step, _last_sentences
    with _TABLES_LOCK:
        _TABLES.clear()
    _last_lookup = _last_step = _last_sentences = _EMPTY


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
    global _last_lookup
    # Slices taken under inference mode are not for autograd: a separate entry.
    lookup = (length, offset, rope_dim, theta, device, dtype, torch.is_inference_mode_enabled(), scaling)
    last_key, last_angles = _last_lookup  # one read: the key and its own value
    if last_key == lookup:
        return last_angles
    needed = offset + length
    table = cos_sin_table(rope_dim, theta, device, dtype, needed, scaling)
    angles = (table.cos[offset:needed], table.sin[offset:needed], table.cis[offset:needed])
    _last_lookup = (lookup, angles)
    return angles


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
    global _last_step
    lookup = (rope_dim, theta, device, dtype, q_scale, head_dim, layout, scaling)
    last_key, steps = _last_step
    if last_key != lookup or offset >= len(steps):
        table = cos_sin_table(rope_dim, theta, device, dtype, offset + 1, scaling)
        steps = table.step_multipliers(q_scale, head_dim, layout)
        _last_step = (lookup, steps)
    return steps[offset]


def sentence_cos_sin(
    scaling: RopeScaling, source_lengths: Tensor, length: int, rope_dim: int, theta: float,
    dtype: torch.dtype, offset: int = 0,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """cos and sin, (B, 1, length, rope_dim/2), of positions offset … offset+length−1 for each
    sentence at its own scale s = ``scaling.scale(source_lengths)``; and YaRN's logit factor 1/t
    per sentence, (B, 1, 1, 1), or None. Angles in fp32 (fp64 for fp64), like the tables; cos
    and sin cast to ``dtype`` (the fused kernel asks for fp32), the factor to ``dtype`` too."""
    global _last_sentences
    lookup = (length, offset, rope_dim, theta, dtype, torch.is_inference_mode_enabled(), scaling)
    last_key, last_result = _last_sentences
    # The lengths by identity (the same tensor for every layer), the rest by value.
    if last_key is not None and last_key[0] is source_lengths and last_key[1] == lookup:
        return last_result
    device = source_lengths.device
    scale = scaling.scale(source_lengths)[:, None]  # (B, 1), fp64
    inv_freq = scaling.frequencies(inverse_frequencies(rope_dim, theta, device, torch.float64), scale)
    positions = torch.arange(offset, offset + length, device=device)
    angles = rotation_angles(positions, inv_freq.to(angle_dtype(dtype))[:, None])  # (B, T, d/2)
    factor = None
    if scaling.method == "yarn":
        factor = scaling.logit_factor(scale).to(dtype)[:, :, None, None]
    result = (angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None], factor)
    # The key holds the lengths tensor, so its identity cannot be recycled while cached.
    _last_sentences = ((source_lengths, lookup), result)
    return result
