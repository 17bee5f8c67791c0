"""RoPE scaling: rotary frequencies for inputs longer than the training length.

Every method keeps RoPE's rotation (RoFormer Eq. 34) and changes only its
frequencies θ_i = b^(−2(i−1)/d), i = 1 … d/2 (RoFormer Eq. 15; d = rope_dim,
b = --rope-theta), for a scale s ≥ 1; s = 1 gives every θ_i back exactly.

* ``linear`` — position interpolation (Chen, Wong, Chen and Tian 2023,
  *Extending Context Window of Large Language Models via Positional
  Interpolation*, §2.2): f′(x, m) = f(x, m·L/L′), positions shrunk by
  s = L′/L; the same angles as θ_i → θ_i / s.
* ``ntk`` — "NTK-aware" scaling (bloc97 2023, Reddit r/LocalLLaMA; Peng et al.
  2023 §3.2): the base b → b′ = b·s^(d/(d−2)), i.e.
  θ_i → b′^(−2(i−1)/d) = θ_i · s^(−2(i−1)/(d−2)).
* ``yarn`` — YaRN (Peng, Quesnelle, Fan and Shippole 2023, *YaRN: Efficient
  Context Window Extension of Large Language Models*): the "NTK-by-parts"
  frequencies of §3.2 — with λ_i = 2π/θ_i the wavelength, r_i = L/λ_i the
  number of turns within the training length L and the ramp γ(r) = 0 for
  r < α, 1 for r > β, (r − α)/(β − α) between (α = 1, β = 32),
  θ_i → (1 − γ(r_i))·θ_i/s + γ(r_i)·θ_i — and the attention temperature of
  §3.4, softmax(q_mᵀk_n / (t·√d)) with √(1/t) = 0.1·ln s + 1.

The scale is either fixed (``--rope-scaling-factor S``) or, for the
``dynamic-*`` rules, follows the length ℓ of the sentence:

    s = max(1, S·ℓ/L − (S − 1))

— "Dynamic NTK" (emozilla 2023, Reddit r/LocalLLaMA, as Hugging Face
transformers computes it; with S = 1, the default, Peng et al. §3.3's
s = max(1, l′/L)). A language model's current length grows while it decodes,
and a key cached at one length's scale would then meet queries rotated at
another's (Peng et al. §3.3 cache keys before the rotation and rotate them
all again). In translation the source is known before decoding starts, so
here ℓ is the sentence's *source* length, for the encoder and the decoder
alike: one scale per sentence, fixed for all of its decoding, so the decoder's
cache never holds keys rotated at another scale and incremental decoding
computes exactly what the full forward does.

The functions take and return float64 tensors; ``scale`` broadcasts against
the frequencies (a number, or (B, 1) for one scale per sentence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

METHODS: Tuple[str, ...] = ("linear", "ntk", "yarn")
#: --rope-scaling's choices: none, a method at a fixed scale, or a method whose scale follows
#: the source length.
SCALINGS: Tuple[str, ...] = ("none", *METHODS, *(f"dynamic-{method}" for method in METHODS))
YARN_ALPHA, YARN_BETA = 1.0, 32.0  # Peng et al. §3.2's values for LLaMA

Scale = Union[float, Tensor]


def interpolated_frequencies(inv_freq: Tensor, scale: Scale) -> Tensor:
    """Position interpolation (Chen et al. 2023 §2.2): θ_i / s."""
    return inv_freq / scale


def ntk_frequencies(inv_freq: Tensor, scale: Scale) -> Tensor:
    """NTK-aware scaling (Peng et al. 2023 §3.2): the base b·s^(d/(d−2)), written as
    θ_i · s^(−2(i−1)/(d−2)), which is exactly θ_i at s = 1. d ≥ 4."""
    half = inv_freq.size(-1)
    index = torch.arange(half, dtype=inv_freq.dtype, device=inv_freq.device)  # i − 1
    return inv_freq * torch.as_tensor(scale, dtype=inv_freq.dtype) ** (-2 * index / (2 * half - 2))


def ntk_base(base: float, scale: float, rope_dim: int) -> float:
    """The same NTK-aware scaling as :func:`ntk_frequencies`, as the base b·s^(d/(d−2)) itself:
    what an engine that takes only a base (CTranslate2) is given."""
    return base * scale ** (rope_dim / (rope_dim - 2))


def yarn_ramp(inv_freq: Tensor, original_length: float) -> Tensor:
    """γ(r_i) of Peng et al. §3.2, with r_i = L/λ_i = L·θ_i/(2π): 0 where a dimension turns
    fewer than α times within L (interpolated), 1 beyond β turns (kept), linear between."""
    turns = original_length * inv_freq / (2 * math.pi)
    return ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0, 1)


def yarn_frequencies(inv_freq: Tensor, scale: Scale, original_length: float) -> Tensor:
    """NTK-by-parts (Peng et al. §3.2): (1 − γ)·θ_i/s + γ·θ_i, written as θ_i/s + γ·(θ_i − θ_i/s)
    so that s = 1 gives θ_i exactly."""
    interpolated = inv_freq / scale
    return interpolated + yarn_ramp(inv_freq, original_length) * (inv_freq - interpolated)


def yarn_attention_factor(scale: Scale) -> Scale:
    """√(1/t) = 0.1·ln s + 1 (Peng et al. §3.4): q and k each scaled by it divide the logits by t."""
    if isinstance(scale, Tensor):
        return 0.1 * torch.log(scale) + 1
    return 0.1 * math.log(scale) + 1


def dynamic_scale(length: Tensor, original_length: float, factor: float = 1.0) -> Tensor:
    """s = max(1, S·ℓ/L − (S − 1)) for lengths ℓ (Dynamic NTK's rule, as Hugging Face computes it;
    S = 1: Peng et al. §3.3's max(1, l′/L))."""
    return (factor * length.to(torch.float64) / original_length - (factor - 1)).clamp(min=1)


def validate_rope_scaling(kind: str, factor: Optional[float], original_length: Optional[int],
                          rope_dim: Optional[int] = None) -> None:
    """Raise ``ValueError`` naming the option when the scaling options do not fit together."""
    if kind not in SCALINGS:
        raise ValueError(f"--rope-scaling must be one of {', '.join(SCALINGS)}, got {kind!r}")
    dynamic = kind.startswith("dynamic-")
    # Values from --model-overrides or a hub keyword are Python objects: refuse strings and booleans.
    if factor is not None:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"--rope-scaling-factor must be a finite number >= 1, got {factor!r}")
    if original_length is not None:
        if isinstance(original_length, bool) or not isinstance(original_length, int) or original_length < 1:
            raise ValueError(f"--rope-original-length must be an integer >= 1, got {original_length!r}")
    if kind == "none":
        for flag, value in (("--rope-scaling-factor", factor), ("--rope-original-length", original_length)):
            if value is not None:
                raise ValueError(f"{flag} {value} is set, but --rope-scaling is 'none': choose a scaling")
        return
    if not dynamic and factor is None:
        raise ValueError(f"--rope-scaling {kind} needs --rope-scaling-factor S (the scale s)")
    if (dynamic or kind == "yarn") and original_length is None:
        raise ValueError(f"--rope-scaling {kind} needs --rope-original-length L (the training length)")
    if kind.endswith("ntk") and rope_dim is not None and rope_dim < 4:
        raise ValueError(f"--rope-scaling {kind} needs --rope-dim >= 4 (b·s^(d/(d-2))), got {rope_dim}")


@dataclass(frozen=True)
class RopeScaling:
    """A validated ``--rope-scaling`` (never ``none``: that is no scaling object at all).

    ``factor`` is S: the scale itself for a fixed method, the slope of the rule
    for a dynamic one (default 1). ``original_length`` is L, which linear and
    ntk do not use (accepted, so that one set of overrides serves every
    method). Hashable: it keys the shared cos/sin tables.
    """

    kind: str
    factor: float = 1.0
    original_length: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind == "none":
            raise ValueError("no scaling is None, not RopeScaling('none')")
        validate_rope_scaling(self.kind, self.factor, self.original_length)

    def validate(self, rope_dim: int) -> None:
        """The checks that need the rotated dimension d."""
        validate_rope_scaling(self.kind, self.factor, self.original_length, rope_dim)

    @classmethod
    def from_options(cls, kind: str, factor: Optional[float], original_length: Optional[int],
                     rope_dim: Optional[int] = None) -> Optional["RopeScaling"]:
        """The scaling of the command-line options, or None for ``none``."""
        validate_rope_scaling(kind, factor, original_length, rope_dim)
        if kind == "none":
            return None
        return cls(kind, 1.0 if factor is None else float(factor), original_length)

    @property
    def dynamic(self) -> bool:
        """True if the scale follows each sentence's source length."""
        return self.kind.startswith("dynamic-")

    @property
    def method(self) -> str:
        return self.kind.rsplit("-", 1)[-1]

    def scale(self, source_lengths: Tensor) -> Tensor:
        """Each sentence's s (float64, (B,)) from its source length."""
        return dynamic_scale(source_lengths, self.original_length, self.factor)

    def frequencies(self, inv_freq: Tensor, scale: Scale) -> Tensor:
        """The scaled frequencies of float64 θ_i at scale s."""
        if self.method == "linear":
            return interpolated_frequencies(inv_freq, scale)
        if self.method == "ntk":
            return ntk_frequencies(inv_freq, scale)
        return yarn_frequencies(inv_freq, scale, self.original_length)

    def logit_factor(self, scale: Scale) -> Scale:
        """What the logits are multiplied by: 1/t = (0.1·ln s + 1)² for YaRN, else 1."""
        return yarn_attention_factor(scale) ** 2 if self.method == "yarn" else 1.0

    def __str__(self) -> str:
        length = "" if self.original_length is None else f", L={self.original_length}"
        return f"{self.kind}(S={self.factor:g}{length})"
