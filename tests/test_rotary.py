"""RoPE math against the paper's definitions (RoFormer, Eqs. 15, 16, 34).

Rotation goes through the one path the attention uses,
``RotaryEmbedding.encode_qk`` (cached cos/sin, then :func:`apply_rotary`), or
through :func:`apply_rotary` itself with angles of explicit positions.
"""

import math

import pytest
import torch

from fairseq_rope.position_context import PositionContext
from fairseq_rope import rotary_tables
from fairseq_rope.rotary import (
    RotaryEmbedding,
    angle_dtype,
    apply_rotary,
    cos_sin,
    inverse_frequencies,
    layout_permutation,
    rotation_angles,
    validate_rope_options,
)
from tests.rope_reference import eq34


def rope(x, offset=0, layout="interleaved", rope_dim=None, theta=10000.0):
    """Rotate x (..., T, D) at positions offset … offset+T−1, as the attention does."""
    rotated, _ = RotaryEmbedding(x.size(-1), rope_dim, theta, layout).encode_qk(x, x, PositionContext(offset))
    return rotated


def rope_at(x, positions, layout="interleaved", rope_dim=None, theta=10000.0):
    """Rotate x (..., T, D) at explicit positions (T,): the pure function, angles computed here."""
    rope_dim = x.size(-1) if rope_dim is None else rope_dim
    angles = rotation_angles(positions, inverse_frequencies(rope_dim, theta, dtype=angle_dtype(x.dtype)))
    return apply_rotary(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), layout)


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
        near = rope(q[None], m, layout) @ rope(k[None], n, layout).T
        far = rope(q[None], m + 1000, layout) @ rope(k[None], n + 1000, layout).T
        assert abs(near.item() - far.item()) < 1e-5
        # The same through the pure function at explicit positions.
        explicit = rope_at(q[None], torch.tensor([m]), layout) @ rope_at(k[None], torch.tensor([n]), layout).T
        torch.testing.assert_close(explicit, near, atol=1e-12, rtol=0)
    # ...and it does depend on m - n.
    a = rope(q[None], 0, layout) @ rope(k[None], 5, layout).T
    b = rope(q[None], 0, layout) @ rope(k[None], 6, layout).T
    assert abs(a.item() - b.item()) > 1e-3


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_preserves_norms(layout):
    q, k = torch.randn(2, 3, 4, 50, 32).unbind(0)
    rq, rk = RotaryEmbedding(32, layout=layout).encode_qk(q, k, PositionContext(17))
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))


def test_efficient_form_equals_block_diagonal_matrix():
    d = 16
    x = torch.randn(d, dtype=torch.float64)
    for m in [0, 1, 5, 123]:
        expected = block_diagonal_rotation(m, d) @ x
        cos, sin = (f(rotation_angles(torch.tensor([m]), inverse_frequencies(d)).double()) for f in (torch.cos, torch.sin))
        got = apply_rotary(x[None], cos, sin, "interleaved")[0]
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        # The attention's path: cached fp64 angles for fp64 inputs.
        torch.testing.assert_close(rope(x[None], m)[0], expected, atol=1e-12, rtol=0)


def test_half_and_interleaved_equal_up_to_projection_row_permutation():
    """A half-layout head equals an interleaved head whose q/k rows are permuted."""
    torch.manual_seed(0)
    d_model, head_dim = 12, 8
    w = torch.randn(head_dim, d_model, dtype=torch.float64)
    x = torch.randn(6, d_model, dtype=torch.float64)
    perm = layout_permutation(head_dim)
    half = rope(x @ w.T, 0, "half")
    interleaved = rope(x @ w[perm].T, 0, "interleaved")
    torch.testing.assert_close(interleaved, half[:, perm])
    # Attention logits are permutation invariant, hence identical.
    torch.testing.assert_close(interleaved @ interleaved.T, half @ half.T)


def test_partial_rotary_leaves_the_tail_unchanged_and_rotates_the_head():
    x = torch.randn(2, 10, 16)
    y = rope(x, 3, rope_dim=6)
    torch.testing.assert_close(y[..., 6:], x[..., 6:], rtol=0, atol=0)
    full6 = rope(x[..., :6], 3)
    torch.testing.assert_close(y[..., :6], full6)
    assert not torch.allclose(y[..., :6], x[..., :6])


@pytest.mark.parametrize("rope_dim", [8, 6])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_offset_equals_explicit_positions_and_slicing(layout, rope_dim):
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(rope(x, 40, layout, rope_dim), rope_at(x, torch.arange(40, 45), layout, rope_dim))
    long = torch.randn(2, 45, 8)
    torch.testing.assert_close(rope(long, 0, layout, rope_dim)[:, 40:], rope(long[:, 40:], 40, layout, rope_dim))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_angles_at_position_20000_match_fp64_in_low_precision(dtype):
    d = 64
    x = torch.randn(1, 3, d).to(dtype)
    cos, sin = cos_sin(3, d, 10000.0, x.device, dtype, offset=20000)  # what encode_qk uses
    assert cos.dtype == dtype
    i = torch.arange(d // 2, dtype=torch.float64)
    ref_angles = torch.arange(20000, 20003, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * i / d)
    # fp32 angles: error ~ulp(20000) ≈ 2e-3 rad; fp16 angles would be off by whole radians.
    torch.testing.assert_close(cos.double(), ref_angles.cos(), atol=5e-3, rtol=0)
    torch.testing.assert_close(sin.double(), ref_angles.sin(), atol=5e-3, rtol=0)
    y = rope(x, 20000)
    ref, _, _ = eq34(x, range(20000, 20003), d, "interleaved")  # Eq. 34 written out in fp64
    torch.testing.assert_close(y.double(), ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("offset", [0, 1000, 20000])
def test_half_precision_interleaved_rotation_is_rounded_once(dtype, offset):
    """fp16/bf16 pairs are rotated in fp32 and rounded once, forward and backward (the
    inverse rotation): within half a unit in the last place of fp64 math, beyond what
    fp32 angles are off by (about m·2^-24 rad at position m). Four real kernels on the
    dtype's rounded cos/sin would be off by up to three units near position 0."""
    torch.manual_seed(0)
    d, length = 64, 40
    x = (4 * torch.randn(2, 3, length, d)).to(dtype).requires_grad_()
    upstream = (4 * torch.randn(x.shape)).to(dtype)
    out, _ = RotaryEmbedding(d).encode_qk(x, x.detach(), PositionContext(offset))
    out.backward(upstream)
    positions = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]
    angles = positions * 10000.0 ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)  # Eq. 15
    u = torch.finfo(dtype).eps / 2
    for got, given, sign in ((out, x, 1), (x.grad, upstream, -1)):  # the gradient turns back
        pairs = given.detach().double().unflatten(-1, (-1, 2))
        expected = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * torch.polar(
            torch.ones_like(angles), sign * angles)).flatten(-2)
        magnitude = pairs.abs().sum(-1).repeat_interleave(2, -1)
        bound = u * expected.abs() + (2**-20 + positions * 2**-22) * magnitude + torch.finfo(dtype).tiny
        worst = ((got.double() - expected).abs() / bound).max().item()
        assert got.dtype == dtype and worst <= 1, f"off by {worst:.2f}x one rounding"


def test_cache_grows_on_demand_and_follows_dtype():
    rotary_tables.clear_cos_sin_cache()
    cos, _ = cos_sin(10, 8, 10000.0, torch.device("cpu"), torch.float32)
    assert cos.shape == (10, 4)
    cos, sin = cos_sin(5000, 8, 10000.0, torch.device("cpu"), torch.float32, offset=3000)
    assert cos.shape == (5000, 4)
    expected = rotation_angles(torch.arange(3000, 8000), inverse_frequencies(8))
    torch.testing.assert_close(cos, expected.cos())
    half, _ = cos_sin(4, 8, 10000.0, torch.device("cpu"), torch.float16)
    assert half.dtype == torch.float16
    assert len(rotary_tables._TABLES) == 2


def test_module_is_untouched_by_half_and_state_dict():
    emb = RotaryEmbedding(8)
    assert list(emb.state_dict()) == [] and list(emb.parameters()) == []
    emb.half()
    x = torch.randn(1, 4, 8)
    torch.testing.assert_close(emb.encode_qk(x, x, PositionContext(0)), RotaryEmbedding(8).encode_qk(x, x, PositionContext(0)))


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
    # (B, H, T, D) as the attention makes them: permuted views of (T, B, H·D) projections.
    q64, k64 = (torch.randn(7, 3, 2, 16, dtype=torch.float64).permute(1, 2, 0, 3) for _ in range(2))
    upstream = torch.randn((2, *q64.shape), dtype=torch.float64)
    q, k = (t.to(dtype).requires_grad_() for t in (q64, k64))
    outs = RotaryEmbedding(16, rope_dim, layout=layout).encode_qk(q, k, PositionContext(offset))
    torch.autograd.backward(outs, tuple(upstream.to(dtype)))
    # The same (rounded) angles for the reference: only the rotation's arithmetic is compared.
    cos, sin = cos_sin(7, rope_dim, 10000.0, q.device, dtype, offset)
    cos64, sin64 = cos.double(), sin.double()
    tol = TOLERANCES[dtype]
    for x, out, up in zip((q, k), outs, upstream):
        assert out.dtype == dtype and out.shape == x.shape
        ref_x = x.detach().double().requires_grad_()
        ref = reference_rotary(ref_x, cos64, sin64, layout)
        ref.backward(up)
        torch.testing.assert_close(out.double(), ref.detach(), atol=tol, rtol=tol)
        torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=tol, rtol=tol)
        torch.testing.assert_close(out[..., rope_dim:], x[..., rope_dim:], atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_fast_path_gradients_pass_gradcheck(layout):
    q, k = (torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    emb = RotaryEmbedding(8, rope_dim=6, layout=layout)
    assert torch.autograd.gradcheck(lambda a, b: emb.encode_qk(a, b, PositionContext(3)), (q, k))
    assert torch.autograd.gradgradcheck(lambda a, b: emb.encode_qk(a, b, PositionContext(3)), (q, k))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("case", ["odd_storage_offset", "strided_last_dim"])
def test_fast_path_handles_awkward_strides(layout, case):
    # Neither can be viewed as complex pairs in place (SDPA's key gradient is the
    # strided case); the result must not change.
    if case == "odd_storage_offset":
        x = torch.randn(1 + 4 * 6 * 8)[1:].view(4, 6, 8)
    else:
        x = torch.randn(4, 8, 6).transpose(-1, -2)
    expected, _, _ = eq34(x, range(6), 8, layout)  # Eq. 34 written out in fp64
    for got in RotaryEmbedding(8, layout=layout).encode_qk(x, x, PositionContext(0)):
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


# --- The shared cos/sin cache: clearable, bounded (LRU), exact after eviction.


def test_cos_sin_cache_can_be_cleared():
    cos_sin(10, 8, 10000.0, torch.device("cpu"), torch.float32)
    assert len(rotary_tables._TABLES) > 0
    rotary_tables.clear_cos_sin_cache()
    assert len(rotary_tables._TABLES) == 0


def test_cos_sin_cache_keeps_at_most_its_bound_and_stays_exact_after_eviction():
    rotary_tables.clear_cos_sin_cache()
    bound = rotary_tables.COS_SIN_CACHE_SIZE
    assert 1 <= bound <= 64
    first = cos_sin(6, 8, 10000.0, torch.device("cpu"), torch.float32, offset=2)
    # More distinct (rope_dim, theta, device, dtype) keys than the bound.
    keys = [(2 * (i + 1), 100.0 + i) for i in range(bound + 5)]
    for rope_dim, theta in keys:
        cos_sin(3, rope_dim, theta, torch.device("cpu"), torch.float64)
        assert len(rotary_tables._TABLES) <= bound
    assert len(rotary_tables._TABLES) == bound
    # The first key was evicted (least recently used); rebuilt, it is the same table.
    assert (8, 10000.0, torch.device("cpu"), torch.float32, None) not in rotary_tables._TABLES
    again = cos_sin(6, 8, 10000.0, torch.device("cpu"), torch.float32, offset=2)
    for got, before in zip(again, first):
        torch.testing.assert_close(got, before, atol=0, rtol=0)
    for rope_dim, theta in keys:
        cos, sin = cos_sin(3, rope_dim, theta, torch.device("cpu"), torch.float64, offset=4)
        angles = rotation_angles(torch.arange(4, 7), inverse_frequencies(rope_dim, theta, dtype=torch.float64))
        torch.testing.assert_close(cos, angles.cos(), atol=0, rtol=0)
        torch.testing.assert_close(sin, angles.sin(), atol=0, rtol=0)
        assert len(rotary_tables._TABLES) <= bound


def test_cos_sin_cache_evicts_the_least_recently_used_table():
    rotary_tables.clear_cos_sin_cache()
    bound = rotary_tables.COS_SIN_CACHE_SIZE
    cpu = torch.device("cpu")
    for i in range(bound):
        cos_sin(3, 2 * (i + 1), 10000.0, cpu, torch.float32)
    cos_sin(3, 2, 10000.0, cpu, torch.float32)  # the oldest, used again
    cos_sin(3, 2 * (bound + 1), 10000.0, cpu, torch.float32)  # evicts the second oldest
    assert (2, 10000.0, cpu, torch.float32, None) in rotary_tables._TABLES
    assert (4, 10000.0, cpu, torch.float32, None) not in rotary_tables._TABLES


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_table_first_built_under_inference_mode_serves_training(dtype, layout):
    """Decoding under torch.inference_mode() first, then training, in one process:
    the shared table must not be an inference tensor, or backward cannot save it."""
    emb = RotaryEmbedding(16, rope_dim=12, layout=layout)
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, 9, 16, dtype=torch.float64).to(dtype) for _ in range(2))
    upstream = torch.randn(2, 2, 3, 9, 16, dtype=torch.float64).to(dtype)

    def train_step():
        q_, k_ = q.clone().requires_grad_(), k.clone().requires_grad_()
        rq, rk = emb.encode_qk(q_, k_, PositionContext(5))  # positions 5 … 13: the decoding's table
        torch.autograd.backward((rq, rk), tuple(upstream))
        return rq.detach(), rk.detach(), q_.grad, k_.grad

    rotary_tables.clear_cos_sin_cache()
    with torch.inference_mode():
        emb.encode_qk(q[..., :1, :], k[..., :1, :], PositionContext(20))  # one decoding step
    got = train_step()

    rotary_tables.clear_cos_sin_cache()
    clean = train_step()  # as in a fresh process: the table built in training mode
    for a, b in zip(got, clean):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_angles_looked_up_under_inference_mode_never_reach_training():
    """Layers share the last lookup; one made under inference mode is not reused by training."""
    rotary_tables.clear_cos_sin_cache()
    rope = RotaryEmbedding(8)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    with torch.inference_mode():
        rope.encode_qk(q, k, PositionContext(0))
    q.requires_grad_(True)
    rq, rk = rope.encode_qk(q, k, PositionContext(0))  # the same positions, dtype and device
    (rq.sum() + rk.sum()).backward()
    assert q.grad is not None and q.grad.shape == q.shape
