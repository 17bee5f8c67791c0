"""The fused Triton rotation (interpreted on the CPU) against Eq. 34 in fp64 and against the
PyTorch path: forward and backward, both layouts, partial rotary, offsets, every kind of
--rope-scaling, odd lengths, batch 1, strided inputs, fp32/fp16/bf16; a decoding step's keys
equal to the full pass's, bit for bit."""

from __future__ import annotations

from typing import Optional, Sequence

import pytest
import torch
from torch import Tensor

from fairseq_rope import rotary
from fairseq_rope.position_context import PositionContext
from fairseq_rope.rope_scaling import RopeScaling
from fairseq_rope.rotary import RotaryEmbedding
from tests.rope_reference import THETA, assert_rotation, random_input, unit_roundoff

pytestmark = pytest.mark.triton

CPU = torch.device("cpu")
HEADS, HEAD_DIM = 2, 16
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
LAYOUTS = pytest.mark.parametrize("layout", ["interleaved", "half"])
ROPE_DIMS = pytest.mark.parametrize("rope_dim", [HEAD_DIM, 6], ids=["full", "partial"])
SCALINGS = {
    "linear": RopeScaling("linear", 2.0, None),
    "yarn": RopeScaling("yarn", 4.0, 8),  # the table and q's temperature 1/t
    "dynamic-ntk": RopeScaling("dynamic-ntk", 1.0, 4),  # each sentence its own table
    "dynamic-yarn": RopeScaling("dynamic-yarn", 2.0, 4),  # ... and its own 1/t
}


def close_to(got: Tensor, expected: Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    """Two rotations of the same input in ``dtype``, each within a few roundings of Eq. 34: equal
    to 8 units in the last place of the magnitude (the bf16 interpreter truncates: one more)."""
    tolerance = 8 * unit_roundoff(dtype) * scale
    torch.testing.assert_close(got.double(), expected.double(), atol=tolerance * expected.abs().max().item(),
                               rtol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (1, 7)], ids=["odd-length", "batch-1-length-1", "batch-1"])
def test_kernel_is_eq34_and_its_gradient_the_inverse_rotation(paths, dtype, layout, rope_dim, shape):
    batch, length = shape
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    for offset in (0, 3000):  # 3000: past the first table's 256 positions
        positions = range(offset, offset + length)
        q, k, grad_q, grad_k = (random_input((batch, HEADS, length, HEAD_DIM), dtype, CPU, seed=offset + i)
                                for i in range(4))
        q.requires_grad_()
        k.requires_grad_()
        with paths("fused") as launches:
            rotated_q, rotated_k = encoding.encode_qk(q, k, PositionContext(offset))
            torch.autograd.backward((rotated_q, rotated_k), (grad_q, grad_k))
        assert len(launches) == 2  # q and k together, forward and backward
        assert_rotation(rotated_q, q, positions, rope_dim, layout, dtype, CPU)
        assert_rotation(rotated_k, k, positions, rope_dim, layout, dtype, CPU)
        inverse = [-m for m in positions]
        assert_rotation(q.grad, grad_q, inverse, rope_dim, layout, dtype, CPU)
        assert_rotation(k.grad, grad_k, inverse, rope_dim, layout, dtype, CPU)


def packed_projection(length: int, batch: int, dtype: torch.dtype, seed: int) -> Tensor:
    """(T, B, 3, H, D) as the packed q/k/v projection leaves it, requiring a gradient."""
    return random_input((length, batch, 3, HEADS, HEAD_DIM), dtype, CPU, seed).requires_grad_()


def through(paths, path: str, encoding: RotaryEmbedding, qkv: Tensor, offset: int, upstream: Sequence[Tensor],
            lengths: Optional[Tensor] = None):
    """encode_qkv's q, k, v and the gradient of qkv, on the fused or the PyTorch path; and the
    kernel's launches."""
    leaf = qkv.detach().clone().requires_grad_()
    with paths(path) as launches:
        out = encoding.encode_qkv(leaf, PositionContext(offset, lengths))
        torch.autograd.backward(out, tuple(upstream))
    return [t.detach() for t in out], leaf.grad, len(launches)


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
def test_packed_projection_in_sdpa_layout_equals_the_pytorch_path(paths, dtype, layout, rope_dim):
    """Straight from the packed projection (strided q, k, v): one launch forward writing q, k and v in
    SDPA's (B, H, T, D) layout, one backward writing the projection's gradient; the PyTorch path
    rotates the head-split views. Both are within a few roundings of each other."""
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    qkv = packed_projection(5, 2, dtype, seed=1)
    upstream = [random_input((2, HEADS, 5, HEAD_DIM), dtype, CPU, seed=10 + i) for i in range(3)]
    fused, fused_grad, launches = through(paths, "fused", encoding, qkv, 7, upstream)
    pytorch, pytorch_grad, _ = through(paths, "pytorch", encoding, qkv, 7, upstream)
    assert launches == 2
    assert all(t.is_contiguous() for t in fused)  # SDPA's layout, no copy left to make
    assert fused_grad.is_contiguous() and fused_grad.shape == qkv.shape
    for got, expected in zip(fused, pytorch):
        close_to(got, expected, dtype)
    assert torch.equal(fused[2], qkv.detach().permute(2, 1, 3, 0, 4)[2])  # v: copied, untouched
    close_to(fused_grad, pytorch_grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@LAYOUTS
@pytest.mark.parametrize("case", ["odd_storage_offset", "strided_last_dim", "transposed_heads"])
def test_awkward_strides_give_the_same_rotation(paths, dtype, layout, case):
    """Any strides: an odd storage offset, a strided last dimension (SDPA's key gradient; copied
    once), heads and time swapped."""
    base = random_input((1 + 2 * HEADS * 6 * HEAD_DIM,), dtype, CPU, seed=3)
    if case == "odd_storage_offset":
        x = base[1:].view(2, HEADS, 6, HEAD_DIM)
    elif case == "strided_last_dim":
        x = base[1:].view(2, HEADS, HEAD_DIM, 6).transpose(-1, -2)
    else:
        x = base[1:].view(2, 6, HEADS, HEAD_DIM).transpose(1, 2)
    encoding = RotaryEmbedding(HEAD_DIM, 10, THETA, layout)
    with paths("fused"):
        fused = encoding.encode_qk(x, x, PositionContext(11))
    assert_rotation(fused[0], x, range(11, 17), 10, layout, dtype, CPU)
    assert_rotation(fused[1], x, range(11, 17), 10, layout, dtype, CPU)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaling", list(SCALINGS))
@LAYOUTS
def test_every_scaling_equals_the_pytorch_path(paths, dtype, scaling, layout):
    """A fixed scaling: the kernel reads the scaled table (and YaRN folds 1/t into q's scale); a
    dynamic one: each batch row reads its own sentence's table."""
    encoding = RotaryEmbedding(HEAD_DIM, 12, THETA, layout, SCALINGS[scaling])
    lengths = torch.tensor([3, 30])  # row 1 past L: scaled; row 0 not
    qkv = packed_projection(6, 2, dtype, seed=5)
    upstream = [random_input((2, HEADS, 6, HEAD_DIM), dtype, CPU, seed=20 + i) for i in range(3)]
    fused, fused_grad, _ = through(paths, "fused", encoding, qkv, 4, upstream, lengths)
    pytorch, pytorch_grad, _ = through(paths, "pytorch", encoding, qkv, 4, upstream, lengths)
    for got, expected in zip(fused, pytorch):
        close_to(got, expected, dtype)
    close_to(fused_grad, pytorch_grad, dtype)
    if scaling.startswith("dynamic"):  # the rows differ: row 0 rotates as the unscaled RoPE does
        plain, _, _ = through(paths, "fused", RotaryEmbedding(HEAD_DIM, 12, THETA, layout), qkv, 4, upstream)
        torch.testing.assert_close(fused[1][0], plain[1][0], atol=0, rtol=0)
        assert not torch.allclose(fused[1][1], plain[1][1])


def steps(encoding: RotaryEmbedding, qkv: Tensor, q_scale: float):
    """Each position of qkv (T, B, 3, H, D) as a decoding step (inference mode), stacked over T."""
    with torch.inference_mode():
        out = [encoding.encode_step(qkv[t].detach(), PositionContext(t), q_scale) for t in range(qkv.size(0))]
    return [torch.stack(parts, dim=2) for parts in zip(*out)]  # each (B, H, T, D)


@pytest.mark.parametrize("dtype", DTYPES)
@ROPE_DIMS
@LAYOUTS
@pytest.mark.parametrize("scaling", [None, "yarn"])
def test_decoding_steps_rotate_with_pytorch_where_the_kernel_is_on(paths, monkeypatch, kernels, dtype, layout,
                                                                    rope_dim, scaling):
    """A step rotates one position: host time, which a launch only adds to. With the kernel on, the
    steps launch nothing; their q (scaled by 1/√d and YaRN's 1/t) and k, each contiguous, and v
    are the PyTorch path's to the bit and the fused full pass's within a few roundings."""
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout, SCALINGS.get(scaling))
    qkv = packed_projection(5, 3, dtype, seed=6)
    q_scale = HEAD_DIM**-0.5
    launches = []
    with monkeypatch.context() as patch, rotary.fused_rotation("interpret"):
        patch.setattr(kernels, "rotate", lambda *args, **kwargs: launches.append(args))
        fused_setting = steps(encoding, qkv, q_scale)
    assert not launches
    with rotary.fused_rotation("0"):
        pytorch = steps(encoding, qkv, q_scale)
    for got, expected in zip(fused_setting, pytorch):
        assert torch.equal(got, expected)
    with paths("fused"), torch.no_grad():
        full = encoding.encode_qkv(qkv, PositionContext(0))
    close_to(fused_setting[0], full[0] * q_scale, dtype, q_scale)
    close_to(fused_setting[1], full[1], dtype)
    assert torch.equal(fused_setting[2], full[2])
    with torch.inference_mode():
        q, k, _ = encoding.encode_step(qkv[0].detach(), PositionContext(0), q_scale)
    assert q.is_contiguous() and k.is_contiguous()


def test_opt_out_variable_selects_the_pytorch_path(monkeypatch, kernels):

    for setting, devices in (("0", frozenset()), ("interpret", frozenset({"cuda", "cpu"})),
                             ("auto", frozenset({"cuda"}) if torch.cuda.is_available() else frozenset())):
        monkeypatch.setattr(rotary, "_fused", None)
        monkeypatch.setenv(rotary.FUSED_VARIABLE, setting)
        x = torch.zeros(1, 1, 1, 2)
        chosen = rotary.fused_kernels(x)
        assert rotary._fused[1] == devices and (chosen is kernels) == ("cpu" in devices)
    monkeypatch.setattr(rotary, "_fused", None)
    monkeypatch.setenv(rotary.FUSED_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="FAIRSEQ_ROPE_TRITON='sometimes'"):
        rotary.fused_kernels(torch.zeros(1))
    monkeypatch.setattr(rotary, "_fused", (kernels, frozenset({"cpu"})))
    assert rotary.fused_kernels(torch.zeros(1, dtype=torch.float64)) is None  # fp64: the PyTorch path


@pytest.mark.parametrize("head_dim, rope_dim", [(64, 64), (64, 32), (96, 96), (80, 48), (16, 6), (2, 2)])
@pytest.mark.parametrize("length", [1, 5, 63, 64, 1000, 4097])
def test_block_sizes_are_powers_of_two_as_the_compiler_needs(kernels, head_dim, rope_dim, length):
    """The interpreter runs any tl.arange; the GPU compiler takes only powers of two."""
    sizes = kernels.block_sizes(length, rope_dim // 2, head_dim)
    assert all(size > 0 and size & (size - 1) == 0 for size in sizes), sizes
    block_t, block_half, block_tail, block_d = sizes
    assert block_half >= rope_dim // 2 and block_d >= head_dim and block_tail >= head_dim - rope_dim
    assert block_t * head_dim <= 2 * 4096 or block_t == 1  # about 4096 elements per program

