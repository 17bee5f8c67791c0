"""An independent reference for RoPE's rotation: RoFormer's Eq. 34 written out in fp64 on the CPU,
and the error bound a rotation in a given dtype must stay within (tests/gpu, tests/triton).

Tolerance, per output element y_j = x_j cos(mθ_i) ± x_p sin(mθ_i) (p: j's partner in
its pair), from the unit roundoff u of the dtype and u₃₂ of fp32:

* angles: θ_i rounded to fp32 and the product m·θ_i rounded: ≤ 2u₃₂·|mθ_i|; cos and
  sin in fp32 within one ulp (≤ 2u₃₂); then rounded to the dtype (≤ u);
* arithmetic in the dtype: a product and a sum, each rounded (≤ 2u·(|x_j| + |x_p|));

|error| ≤ (|x_j| + |x_p|)·s·(3u + 2u₃₂·(1 + |mθ_i|)), s the scaling folded in
(encode_step's 1/√d for q, else 1); asserted with a factor 2 to spare. The input is
rounded to the dtype before the reference sees it, so only the rotation's error
counts. A wrong sign or angle is off by ~|x|, orders of magnitude above the bound.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

THETA = 10000.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of rounding a real number to ``dtype``."""
    return torch.finfo(dtype).eps / 2


def pairing(rope_dim: int, layout: str):
    """Per rotated dimension j: its pair i, its partner p and the sign of x_p in rotate(x) (Eq. 34)."""
    j = torch.arange(rope_dim)
    half = rope_dim // 2
    if layout == "interleaved":  # pairs (x_1, x_2), (x_3, x_4), …; rotate(x) = (−x_2, x_1, −x_4, x_3, …)
        return j // 2, j ^ 1, torch.where(j % 2 == 0, -1.0, 1.0).double()
    # GPT-NeoX: pair i is (x_i, x_{i+d/2}); rotate(x) = (−x_{d/2+1}, …, −x_d, x_1, …, x_{d/2})
    return j % half, (j + half) % rope_dim, torch.where(j < half, -1.0, 1.0).double()


def angles64(positions: Sequence[int], rope_dim: int) -> Tensor:
    """m·θ_i in fp64, θ_i = base^(−2(i−1)/d) (Eq. 15), shape (T, d/2)."""
    theta = torch.tensor([THETA ** (-2 * i / rope_dim) for i in range(rope_dim // 2)], dtype=torch.float64)
    return torch.tensor(list(positions), dtype=torch.float64)[:, None] * theta


def eq34(x: Tensor, positions: Sequence[int], rope_dim: int, layout: str, scale: float = 1.0):
    """s·R x for x (..., T, head_dim) at ``positions`` (T,), in fp64 on the CPU; and per element
    what the error bound needs: |x_j| + |x_p| and |mθ_i| (|x_j| and 0 past rope_dim)."""
    x = x.detach().cpu().double()
    pair, partner, sign = pairing(rope_dim, layout)
    angle = angles64(positions, rope_dim)[:, pair]  # (T, rope_dim)
    head, tail = x[..., :rope_dim], x[..., rope_dim:]
    rotated = head * angle.cos() + sign * head[..., partner] * angle.sin()
    magnitude = torch.cat((head.abs() + head[..., partner].abs(), tail.abs()), dim=-1)
    angle_error = torch.cat((angle.abs(), angle.new_zeros(len(positions), x.size(-1) - rope_dim)), dim=-1)
    return scale * torch.cat((rotated, tail), dim=-1), magnitude, angle_error


def assert_rotation(got: Tensor, x: Tensor, positions: Sequence[int], rope_dim: int, layout: str,
                    dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> None:
    assert got.dtype == dtype and got.device == device
    expected, magnitude, angle = eq34(x, positions, rope_dim, layout, scale)
    u, u32 = unit_roundoff(dtype), unit_roundoff(torch.float32)
    bound = 2 * scale * magnitude * (3 * u + 2 * u32 * (1 + angle))
    error = (got.cpu().double() - expected).abs()
    excess = (error - bound).max().item()
    assert excess <= 0, f"error {error.max().item():.3g} exceeds the bound by {excess:.3g}"


def random_input(shape: Sequence[int], dtype: torch.dtype, device: torch.device, seed: int) -> Tensor:
    """N(0, 1) values, drawn on the CPU (the same on every device) and rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)
