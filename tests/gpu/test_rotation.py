"""RoPE's rotation on the device, in fp32, fp16 and bf16, against the paper's Eq. 34
written out in fp64 on the CPU: :func:`apply_rotary`, ``RotaryEmbedding.encode_qk``
(forward and backward) and ``encode_step`` (a decoding step's q and k).

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

import pytest
import torch
from torch import Tensor

from fairseq_rope.rotary import RotaryEmbedding, apply_rotary
from tests.gpu.conftest import DTYPES, unit_roundoff

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM, LENGTH = 3, 16, 5
THETA = 10000.0
OFFSETS = (0, 3000)  # 3000: past the first table's 256 positions, angles up to ~3000 rad
LAYOUTS = pytest.mark.parametrize("layout", ["interleaved", "half"])
ROPE_DIMS = pytest.mark.parametrize("rope_dim", [HEAD_DIM, 6], ids=["full", "partial"])


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


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
def test_apply_rotary_is_eq34(device, dtype, layout, rope_dim):
    """The pure function, given cos and sin of fp64 angles rounded to the dtype."""
    for offset in OFFSETS:
        positions = range(offset, offset + LENGTH)
        x = random_input((2, HEADS, LENGTH, HEAD_DIM), dtype, device, seed=offset)
        angles = angles64(positions, rope_dim).to(device)
        got = apply_rotary(x, angles.cos().to(dtype), angles.sin().to(dtype), layout)
        assert_rotation(got, x, positions, rope_dim, layout, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
def test_encode_qk_is_eq34_and_its_gradient_the_inverse_rotation(device, dtype, layout, rope_dim):
    """The attention's path (cached cos/sin); the backward rotates by −mθ, since Rᵀ_m = R_{−m} (Eq. 13)."""
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    for offset in OFFSETS:
        positions = range(offset, offset + LENGTH)
        q, k, grad_q, grad_k = (random_input((2, HEADS, LENGTH, HEAD_DIM), dtype, device, seed=offset + i)
                                for i in range(4))
        q.requires_grad_()
        k.requires_grad_()
        rotated_q, rotated_k = encoding.encode_qk(q, k, offset)
        assert_rotation(rotated_q, q, positions, rope_dim, layout, dtype, device)
        assert_rotation(rotated_k, k, positions, rope_dim, layout, dtype, device)
        torch.autograd.backward((rotated_q, rotated_k), (grad_q, grad_k))
        inverse = [-m for m in positions]
        assert_rotation(q.grad, grad_q, inverse, rope_dim, layout, dtype, device)
        assert_rotation(k.grad, grad_k, inverse, rope_dim, layout, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
def test_encode_step_is_eq34_with_the_query_scaling_folded_in(device, dtype, layout, rope_dim):
    """A beam-search step: q and k (B, 2, H, d) of one position, q also scaled by 1/√d."""
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    scale = HEAD_DIM**-0.5
    for offset in (0, 1, 7, 3000):
        qk = random_input((4, 2, HEADS, HEAD_DIM), dtype, device, seed=offset)
        with torch.inference_mode():  # as the attention's decoding step calls it
            got = encoding.encode_step(qk, offset, scale)
        assert got.shape == qk.shape
        # One position per step: the reference sees each as a sequence of length 1.
        assert_rotation(got[:, 0, :, None], qk[:, 0, :, None], [offset], rope_dim, layout, dtype, device, scale)
        assert_rotation(got[:, 1, :, None], qk[:, 1, :, None], [offset], rope_dim, layout, dtype, device)
