"""One beam-search step of the RoPE self-attention, in fp32, fp16 and bf16: no more
torch operators than fairseq's stock self-attention step in the same dtype (also with a
fixed --rope-scaling, whose table and YaRN temperature the step folds in), and in
half precision the rotation that fp64 math and the general path compute."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_rope.position_context import PositionContext
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.benchmark.launches import kernel_launches
from fairseq_rope.position_encoding import PositionEncoding
from fairseq_rope.rope_scaling import RopeScaling
from fairseq_rope.rotary import RotaryEmbedding

EMBED, HEADS = 32, 4
HEAD_DIM = EMBED // HEADS
THETA = 10000.0
HALF_DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# (layout, rope_dim): the paper's pairs and GPT-NeoX's, whole heads and partial rotary.
CONFIGS = [("interleaved", None), ("interleaved", 4), ("half", None), ("half", 4)]


# --- Counting operators


def operators(call: Callable[[], object]) -> Counter:
    """The kernels ``call`` launches, counted on the CPU per operator (fairseq_rope/benchmark/launches.py:
    operators dispatched from Python, views left out unless they copied)."""
    return kernel_launches(call, torch.device("cpu"))[1]


def rope_attention(dtype: torch.dtype, layout: str = "interleaved", rope_dim: Optional[int] = None,
                   scaling: Optional[RopeScaling] = None) -> PositionalMultiheadAttention:
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, theta=THETA, layout=layout, scaling=scaling)
    return PositionalMultiheadAttention(EMBED, HEADS, encoding).eval().to(dtype)


def step_operators(attn: MultiheadAttention, dtype: torch.dtype) -> Counter:
    """Operators of the 4th decoding step (one new position, no gradient, incremental
    state), after three unprofiled steps have built every cache."""
    x = torch.randn(4, 3, EMBED).to(dtype)
    steps = [x[t : t + 1] for t in range(4)]
    state: dict = {}

    def step(t: int) -> object:
        return attn(steps[t], steps[t], steps[t], incremental_state=state, need_weights=False)

    with torch.no_grad():
        for t in range(3):
            step(t)
        return operators(lambda: step(3))


# No scaling, and a fixed one (YaRN: a scaled table and the temperature; linear and ntk
# differ from it only in the table's frequencies).
SCALINGS = {"none": None, "yarn": RopeScaling("yarn", 4.0, 64)}


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("layout, rope_dim", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=DTYPE_IDS.get)
def test_decoding_step_has_no_more_operators_than_stock_attention(dtype, layout, rope_dim, scaling):
    stock = step_operators(MultiheadAttention(EMBED, HEADS, self_attention=True).eval().to(dtype), dtype)
    rope = step_operators(rope_attention(dtype, layout, rope_dim, SCALINGS[scaling]), dtype)
    assert stock["aten::linear"] == 4  # the counter sees the step: q, k, v and output projections
    assert sum(rope.values()) <= sum(stock.values()), f"RoPE {rope} against stock {stock}"


@pytest.mark.parametrize("layout, rope_dim", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=DTYPE_IDS.get)
def test_step_rotation_takes_as_few_operators_as_the_dtype_allows(dtype, layout, rope_dim):
    """fp32 pairs are complex numbers: an allocation and one multiply. fp16/bf16 have
    no complex counterpart, and the half layout's pairs are not adjacent: three
    kernels (to fp32, multiply, back; or the swap of each pair, two products)."""
    rope = RotaryEmbedding(HEAD_DIM, rope_dim, theta=THETA, layout=layout)
    qkv = torch.randn(3, 3, HEADS, HEAD_DIM).to(dtype)  # as the packed projection gives it
    with torch.no_grad():
        rope.encode_step(qkv, PositionContext(5), 0.25)  # builds the tables
        ops = operators(lambda: rope.encode_step(qkv, PositionContext(5), 0.25))
    assert sum(ops.values()) <= (2 if dtype == torch.float32 and layout == "interleaved" else 3), ops


# --- Half precision: what fp64 math and the general path compute


def reference_rotation(x: Tensor, positions: Tensor, rope_dim: int, layout: str) -> Tuple[Tensor, Tensor]:
    """x (..., head_dim) rotated in fp64 at ``positions`` (broadcast against x's leading
    dims), straight from Eq. 15 and Eq. 34; and, per element, |x_j| + |x_j's pair
    partner| (itself past rope_dim), the scale of its rounding errors."""
    x = x.double()
    i = torch.arange(rope_dim // 2)
    first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + rope_dim // 2)
    angles = positions.double()[..., None] * THETA ** (-2.0 * i.double() / rope_dim)
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., first], x[..., second]
    out, partner = x.clone(), x.clone()
    out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
    partner[..., first], partner[..., second] = b, a
    return out, x.abs() + partner.abs()


def rounding_bound(magnitude: Tensor, dtype: torch.dtype) -> Tensor:
    """What a half-precision rotation may be off by, per element of magnitude
    |a| + |b| (its pair): with u = eps/2 the unit roundoff, rounding the multipliers
    (q_scale·cos, sin) costs u(|a| + |b|), each rounded product or sum at most as
    much again, and at most three roundings are chained (the half layout's
    swap × S, then + x × C): 3u(|a| + |b|) + u for the input's own rounding (an
    fp16 projection) is 2·eps·(|a| + |b|). ``tiny`` covers subnormal results,
    whose spacing is absolute."""
    info = torch.finfo(dtype)
    return 2 * info.eps * magnitude + info.tiny


def assert_within(got: Tensor, expected: Tensor, bound: Tensor) -> None:
    err = (got.double() - expected).abs()
    worst = (err / bound).max().item()
    assert worst <= 1, f"off by {worst:.2f}× the rounding bound (max |error| {err.max().item():.3g})"


@pytest.mark.parametrize("layout, rope_dim", CONFIGS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=DTYPE_IDS.get)
def test_half_precision_step_rotation_matches_fp64_and_the_general_path(dtype, layout, rope_dim):
    """At positions up to 20000 (where an fp16 angle would be off by radians):
    the lean step and the general path (encode_qk, then q's scaling) are each
    within the rounding bound of fp64 math, so within twice it of each other."""
    rope = RotaryEmbedding(HEAD_DIM, rope_dim, theta=THETA, layout=layout)
    qkv = (4 * torch.randn(5, 3, HEADS, HEAD_DIM)).to(dtype)
    qk = qkv[:, :2]
    q_scale = HEAD_DIM**-0.5
    scale = torch.tensor([q_scale, 1.0], dtype=torch.float64)[:, None, None]  # q's row, k's row
    with torch.no_grad():
        for offset in (0, 1, 9, 1000, 20000, 3):
            lean = torch.stack(rope.encode_step(qkv, PositionContext(offset), q_scale)[:2], dim=1)
            general = torch.stack(PositionEncoding.encode_step(rope, qkv, PositionContext(offset), q_scale)[:2], dim=1)
            expected, magnitude = reference_rotation(qk, torch.tensor(offset), rope.rope_dim, layout)
            bound = rounding_bound(scale * magnitude, dtype)
            assert lean.dtype == dtype and lean.shape == qk.shape
            assert_within(lean, scale * expected, bound)
            assert_within(general, scale * expected, bound)
            assert_within(lean, general.double(), 2 * bound)


def decode(attn: PositionalMultiheadAttention, x: Tensor, orders: Sequence[Optional[Tensor]]):
    """Incremental steps over x (T, B, C), the cache reordered before each step as beam
    search does; the outputs (T, B, C) and the final key cache (B, H, T, D)."""
    state: dict = {}
    outs = []
    for t in range(x.size(0)):
        if orders[t] is not None:
            attn.reorder_incremental_state(state, orders[t])
        step = x[t : t + 1]
        outs.append(attn(step, step, step, incremental_state=state, need_weights=False)[0])
    return torch.cat(outs), attn._get_input_buffer(state)["prev_key"]


def reference_keys(attn: PositionalMultiheadAttention, x: Tensor, orders: Sequence[Optional[Tensor]]):
    """The key cache of :func:`decode` in fp64: keys projected from x and rotated at
    their step's position, reordered like the cache; with the rounding magnitudes."""
    T, B, _ = x.shape
    keys = F.linear(x.double(), attn.k_proj.weight.double(), attn.k_proj.bias.double())
    keys = keys.view(T, B, HEADS, HEAD_DIM).permute(1, 2, 0, 3)  # (B, H, T, D)
    encoding = attn.position_encoding
    rotated, magnitude = reference_rotation(keys, torch.arange(T), encoding.rope_dim, encoding.layout)
    cache = torch.empty(2, B, HEADS, 0, HEAD_DIM, dtype=torch.float64)
    for t in range(T):
        if orders[t] is not None:
            cache = cache[:, orders[t]]
        cache = torch.cat((cache, torch.stack((rotated, magnitude))[:, :, :, t : t + 1]), dim=3)
    return cache.unbind(0)


@pytest.mark.parametrize("layout, rope_dim", CONFIGS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=DTYPE_IDS.get)
def test_half_precision_decoding_matches_fp64_and_the_general_path(dtype, layout, rope_dim):
    """Six steps of a beam of 4, reordered before every step: the lean steps' cached
    keys (without gradients: rotated by multipliers that carry 1/√d) are fp64 math's within
    the rounding bound, and their outputs and cache what the general rotation (encode_qk,
    taken with gradients enabled) computes."""
    torch.manual_seed(0)
    attn = rope_attention(dtype, layout, rope_dim)
    x = torch.randn(6, 4, EMBED).to(dtype)
    orders = [None] + [torch.randint(0, 4, (4,)) for _ in range(5)]
    general_out, general_keys = decode(attn, x, orders)  # gradients enabled: the general rotation
    with torch.no_grad():
        lean_out, lean_keys = decode(attn, x, orders)
    expected, magnitude = reference_keys(attn, x, orders)
    bound = rounding_bound(magnitude, dtype)
    assert_within(lean_keys, expected, bound)
    assert_within(general_keys.detach(), expected, bound)
    assert_within(lean_keys, general_keys.detach().double(), 2 * bound)
    if layout == "interleaved":  # both rotate in fp32 by the same e^{imθ}, rounding once
        assert torch.equal(lean_keys, general_keys.detach())
    # Beyond the keys, the outputs go through the same fp16/bf16 matmuls and softmax
    # on both paths: what differs is the query's rotation, a few roundings.
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(lean_out, general_out.detach(), atol=4 * eps, rtol=4 * eps)
