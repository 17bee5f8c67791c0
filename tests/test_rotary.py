"""RoPE math against the paper's definitions (RoFormer, Eqs. 15, 16, 34)."""

import math

import pytest
import torch

from fairseq_rope import rotary
from fairseq_rope.rotary import (
    RotaryEmbedding,
    apply_rotary,
    cos_sin,
    inverse_frequencies,
    layout_permutation,
    rotation_angles,
    validate_rope_options,
)


def rope(x, positions, layout="interleaved", rope_dim=None, theta=10000.0):
    """Rotate x (..., T, D) at explicit positions (T,)."""
    return RotaryEmbedding(x.size(-1), rope_dim, theta, layout)(x, positions=positions)


def block_diagonal_rotation(m: float, d: int, theta: float = 10000.0) -> torch.Tensor:
    """R^d_{Θ,m} of Eq. 15, built element by element in fp64."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        angle = m * theta ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        R[2 * i, 2 * i], R[2 * i, 2 * i + 1] = c, -s
        R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = s, c
    return R


def test_inverse_frequencies_follow_eq_15():
    inv = inverse_frequencies(8, theta=100.0)
    assert inv.dtype == torch.float32
    expected = torch.tensor([100.0 ** (-2 * i / 8) for i in range(4)])
    torch.testing.assert_close(inv, expected)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_inner_product_depends_only_on_relative_position(layout):
    torch.manual_seed(0)
    q, k = torch.randn(2, 64, dtype=torch.float64).unbind(0)
    for m, n in [(3, 7), (10, 2), (0, 0)]:
        near = rope(q[None], torch.tensor([m]), layout) @ rope(k[None], torch.tensor([n]), layout).T
        far = (
            rope(q[None], torch.tensor([m + 1000]), layout)
            @ rope(k[None], torch.tensor([n + 1000]), layout).T
        )
        assert abs(near.item() - far.item()) < 1e-5
    # ...and it does depend on m - n.
    a = rope(q[None], torch.tensor([0]), layout) @ rope(k[None], torch.tensor([5]), layout).T
    b = rope(q[None], torch.tensor([0]), layout) @ rope(k[None], torch.tensor([6]), layout).T
    assert abs(a.item() - b.item()) > 1e-3


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_preserves_norms(layout):
    x = torch.randn(3, 4, 50, 32)
    y = RotaryEmbedding(32, layout=layout)(x, offset=17)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_efficient_form_equals_block_diagonal_matrix():
    d = 16
    x = torch.randn(d, dtype=torch.float64)
    for m in [0, 1, 5, 123]:
        expected = block_diagonal_rotation(m, d) @ x
        cos, sin = (f(rotation_angles(torch.tensor([m]), inverse_frequencies(d)).double()) for f in (torch.cos, torch.sin))
        got = apply_rotary(x[None], cos, sin, "interleaved")[0]
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_half_and_interleaved_equal_up_to_projection_row_permutation():
    """A half-layout head equals an interleaved head whose q/k rows are permuted."""
    torch.manual_seed(0)
    d_model, head_dim = 12, 8
    w = torch.randn(head_dim, d_model, dtype=torch.float64)
    x = torch.randn(6, d_model, dtype=torch.float64)
    positions = torch.arange(6)
    perm = layout_permutation(head_dim)
    half = rope(x @ w.T, positions, "half")
    interleaved = rope(x @ w[perm].T, positions, "interleaved")
    torch.testing.assert_close(interleaved, half[:, perm])
    # Attention logits are permutation invariant, hence identical.
    torch.testing.assert_close(interleaved @ interleaved.T, half @ half.T)


def test_partial_rotary_leaves_the_tail_unchanged_and_rotates_the_head():
    x = torch.randn(2, 10, 16)
    y = RotaryEmbedding(16, rope_dim=6)(x, offset=3)
    torch.testing.assert_close(y[..., 6:], x[..., 6:], rtol=0, atol=0)
    full6 = RotaryEmbedding(6)(x[..., :6], offset=3)
    torch.testing.assert_close(y[..., :6], full6)
    assert not torch.allclose(y[..., :6], x[..., :6])


def test_offset_equals_explicit_positions_and_slicing():
    emb = RotaryEmbedding(8)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(emb(x, offset=40), emb(x, positions=torch.arange(40, 45)))
    long = torch.randn(2, 45, 8)
    torch.testing.assert_close(emb(long)[:, 40:], emb(long[:, 40:], offset=40))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_angles_at_position_20000_match_fp64_in_low_precision(dtype):
    d = 64
    emb = RotaryEmbedding(d)
    x = torch.randn(1, 3, d).to(dtype)
    cos, sin = emb.angles_cos_sin(x, offset=20000)
    assert cos.dtype == dtype
    i = torch.arange(d // 2, dtype=torch.float64)
    ref_angles = torch.arange(20000, 20003, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * i / d)
    # fp32 angles: error ~ulp(20000) ≈ 2e-3 rad; fp16 angles would be off by whole radians.
    torch.testing.assert_close(cos.double(), ref_angles.cos(), atol=5e-3, rtol=0)
    torch.testing.assert_close(sin.double(), ref_angles.sin(), atol=5e-3, rtol=0)
    y = emb(x, offset=20000)
    ref = apply_rotary(x.double(), ref_angles.cos(), ref_angles.sin(), "interleaved")
    torch.testing.assert_close(y.double(), ref, atol=0.05, rtol=0.02)


def test_cache_grows_on_demand_and_follows_dtype():
    rotary._TABLES.clear()
    cos, _ = cos_sin(10, 8, 10000.0, torch.device("cpu"), torch.float32)
    assert cos.shape == (10, 4)
    cos, sin = cos_sin(5000, 8, 10000.0, torch.device("cpu"), torch.float32, offset=3000)
    assert cos.shape == (5000, 4)
    expected = rotation_angles(torch.arange(3000, 8000), inverse_frequencies(8))
    torch.testing.assert_close(cos, expected.cos())
    half, _ = cos_sin(4, 8, 10000.0, torch.device("cpu"), torch.float16)
    assert half.dtype == torch.float16
    assert len(rotary._TABLES) == 2


def test_module_is_untouched_by_half_and_state_dict():
    emb = RotaryEmbedding(8)
    assert list(emb.state_dict()) == [] and list(emb.parameters()) == []
    emb.half()
    x = torch.randn(1, 4, 8)
    torch.testing.assert_close(emb(x), RotaryEmbedding(8)(x))


@pytest.mark.parametrize(
    "args, message",
    [
        ((7, 7, 10000.0, "interleaved"), "odd"),
        ((8, 3, 10000.0, "interleaved"), "--rope-dim"),
        ((8, 0, 10000.0, "interleaved"), "--rope-dim"),
        ((8, 10, 10000.0, "interleaved"), "--rope-dim"),
        ((8, 8, 0.0, "interleaved"), "--rope-theta"),
        ((8, 8, -5.0, "interleaved"), "--rope-theta"),
        ((8, 8, float("inf"), "interleaved"), "--rope-theta"),
        ((8, 8, float("nan"), "interleaved"), "--rope-theta"),
        ((8, 8, 10000.0, "diagonal"), "--rope-layout"),
    ],
)
def test_invalid_options_are_clear_errors(args, message):
    with pytest.raises(ValueError, match=message) as error:
        validate_rope_options(*args)
    bad_value = {"odd": "7", "--rope-dim": str(args[1]), "--rope-theta": str(args[2]), "--rope-layout": args[3]}[message]
    assert bad_value in str(error.value)


# --- The fast path (no temporaries, complex multiply, custom backward) against
# Eq. 34 written out with temporaries and differentiated by autograd.


def reference_rotary(x, cos, sin, layout):
    """x ⊙ cos + rotate(x) ⊙ sin (Eq. 34) with explicit rotate(); partial rotary passes through."""
    rope_dim = 2 * cos.size(-1)
    rotated, rest = x[..., :rope_dim], x[..., rope_dim:]
    if layout == "interleaved":
        pairs = rotated.unflatten(-1, (-1, 2))
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:
        a, b = rotated.chunk(2, dim=-1)
        turned = torch.cat((-b, a), dim=-1)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return torch.cat((rotated * cos + turned * sin, rest), dim=-1)


TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rope_dim", [16, 8])
@pytest.mark.parametrize("offset", [0, 1000])
def test_fast_path_equals_reference_forward_and_backward(dtype, layout, rope_dim, offset):
    torch.manual_seed(0)
    # (B, H, T, D) as the attention makes it: a permuted view of a (T, B, H·D) projection.
    x64 = torch.randn(7, 3, 2, 16, dtype=torch.float64).permute(1, 2, 0, 3)
    upstream = torch.randn(x64.shape, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_()
    cos, sin = cos_sin(7, rope_dim, 10000.0, x.device, dtype, offset)
    # The same (rounded) angles for both: only the rotation's arithmetic is compared.
    cos64, sin64 = cos.double(), sin.double()
    out = apply_rotary(x, cos, sin, layout)
    out.backward(upstream.to(dtype))
    assert out.dtype == dtype and out.shape == x.shape

    ref_x = x.detach().double().requires_grad_()
    ref = reference_rotary(ref_x, cos64, sin64, layout)
    ref.backward(upstream)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=tol, rtol=tol)
    torch.testing.assert_close(out[..., rope_dim:], x[..., rope_dim:], atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_fast_path_gradients_pass_gradcheck(layout):
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = cos_sin(5, 6, 10000.0, x.device, torch.float64, offset=3)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin, layout), (x,))
    assert torch.autograd.gradgradcheck(lambda t: apply_rotary(t, cos, sin, layout), (x,))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("case", ["odd_storage_offset", "strided_last_dim"])
def test_fast_path_handles_awkward_strides(layout, case):
    # Neither can be viewed as complex pairs in place (SDPA's key gradient is the
    # strided case); the result must not change.
    if case == "odd_storage_offset":
        x = torch.randn(1 + 4 * 6 * 8)[1:].view(4, 6, 8)
    else:
        x = torch.randn(4, 8, 6).transpose(-1, -2)
    cos, sin = cos_sin(6, 8, 10000.0, x.device, x.dtype)
    torch.testing.assert_close(apply_rotary(x, cos, sin, layout), reference_rotary(x, cos, sin, layout))
