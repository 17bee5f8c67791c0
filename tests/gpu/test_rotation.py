"""RoPE's rotation on the device, in fp32, fp16 and bf16, against the paper's Eq. 34
written out in fp64 on the CPU: :func:`apply_rotary`, ``RotaryEmbedding.encode_qk``
(forward and backward) and ``encode_step`` (a decoding step's q and k).

The reference and its error bound: tests/rope_reference.py. On CUDA with Triton these run the
fused kernel (the default there); tests/gpu/test_fused.py compares it with the PyTorch path.
"""

from __future__ import annotations

import pytest
import torch

from fairseq_rope.position_context import PositionContext
from fairseq_rope.rotary import RotaryEmbedding, apply_rotary
from tests.gpu.conftest import DTYPES
from tests.rope_reference import THETA, angles64, assert_rotation, random_input

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM, LENGTH = 3, 16, 5
OFFSETS = (0, 3000)  # 3000: past the first table's 256 positions, angles up to ~3000 rad
LAYOUTS = pytest.mark.parametrize("layout", ["interleaved", "half"])
ROPE_DIMS = pytest.mark.parametrize("rope_dim", [HEAD_DIM, 6], ids=["full", "partial"])


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
        rotated_q, rotated_k = encoding.encode_qk(q, k, PositionContext(offset))
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
    """A beam-search step: q, k and v (B, 3, H, d) of one position, q also scaled by 1/√d."""
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    scale = HEAD_DIM**-0.5
    for offset in (0, 1, 7, 3000):
        qkv = random_input((4, 3, HEADS, HEAD_DIM), dtype, device, seed=offset)
        with torch.inference_mode():  # as the attention's decoding step calls it
            q, k, v = encoding.encode_step(qkv, PositionContext(offset), scale)
        # One position per step: the reference sees each as a sequence of length 1.
        assert_rotation(q[:, :, None], qkv[:, 0, :, None], [offset], rope_dim, layout, dtype, device, scale)
        assert_rotation(k[:, :, None], qkv[:, 1, :, None], [offset], rope_dim, layout, dtype, device)
        assert torch.equal(v, qkv[:, 2])
