"""The kernel module's own functions (rotate, rotate_qk, rotate_packed), interpreted on the CPU,
where test_fused_rotation.py's small shapes do not reach: several blocks of positions with a
partial last one, real head sizes (64, 80, 128), offsets in the thousands, per-sentence tables
with a per-sentence scale of q (forward and backward); and the fail-safes: the argument checks, the device guard, and no silent second
derivative. Expected values are RoFormer's Eq. 34 in fp64 (tests/rope_reference.py), from fp64
tables built here."""

from __future__ import annotations

import contextlib
from typing import List, Sequence

import pytest
import torch
from torch import Tensor

from tests.rope_reference import angles64, eq34, random_input, unit_roundoff

pytestmark = pytest.mark.triton

CPU = torch.device("cpu")
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
LAYOUTS = pytest.mark.parametrize("layout", ["interleaved", "half"])


def tables(length: int, rope_dim: int, layout: str, scales: Sequence[float] = ()):
    """fp32 cos and sin of positions 0 … length−1: (length, W), or with ``scales`` one table per
    sentence, (B, length, W), sentence b at positions m / scales[b] (a linear scaling); W = rope_dim/2,
    one entry per pair, in the half layout, and rope_dim, one per member of a pair (cos, cos and
    −sin, +sin), in the interleaved one. Computed in fp64, rounded once."""
    if not scales:
        angles = angles64(range(length), rope_dim)
    else:
        angles = torch.stack([angles64([m / s for m in range(length)], rope_dim) for s in scales])
    cos, sin = angles.cos().float(), angles.sin().float()
    if layout == "interleaved":
        members = cos.shape[:-1] + (rope_dim,)
        cos = cos.unsqueeze(-1).expand(*cos.shape, 2).reshape(members)
        sin = torch.cat((-sin.unsqueeze(-1), sin.unsqueeze(-1)), dim=-1).reshape(members)
    return cos.contiguous(), sin.contiguous()


def assert_eq34(got: Tensor, x: Tensor, positions: Sequence[float], rope_dim: int, layout: str,
                dtype: torch.dtype, scale: float = 1.0) -> None:
    """got within tests/rope_reference's bound of s·R x (Eq. 34 in fp64); in bf16 one unit in the
    last place more: Triton's interpreter truncates bf16 stores instead of rounding them."""
    assert got.dtype == dtype
    expected, magnitude, angle = eq34(x, list(positions), rope_dim, layout, scale)
    u, u32 = unit_roundoff(dtype), unit_roundoff(torch.float32)
    bound = 2 * scale * magnitude * (3 * u + 2 * u32 * (1 + angle))
    if dtype == torch.bfloat16:
        bound = bound + 2 * u * expected.abs()
    excess = ((got.double() - expected).abs() - bound).max().item()
    assert excess <= 0, f"error exceeds the bound by {excess:.3g}"


def heads_of(qkv: Tensor, part: int) -> Tensor:
    """q, k or v (B, H, T, D) of the packed projection (T, B, 3, H, D)."""
    return qkv.detach()[:, :, part].permute(1, 2, 0, 3)


# --- Several blocks of positions, head sizes, partial rotary ----------------------------------

# Each length with two head sizes, each head size rotated whole and in part (the interpreter is slow).
BLOCKS = [(33, 64, 64), (300, 64, 24), (130, 80, 80), (33, 80, 48), (300, 128, 128), (130, 128, 96)]


@LAYOUTS
@pytest.mark.parametrize("length,head_dim,rope_dim", BLOCKS, ids=[f"T{t}-d{d}-rope{r}" for t, d, r in BLOCKS])
def test_several_blocks_of_positions_and_a_partial_last_one_are_eq34(kernels, length, head_dim, rope_dim,
                                                                      layout):
    """q (scaled by 1/√d), k and v of the packed projection, over blocks of positions
    (program_id(1) > 0) whose last is partial."""
    block_t = kernels.block_sizes(length, rope_dim // 2, head_dim)[0]
    assert block_t < length and length % block_t, "the case should span blocks, the last partial"
    qkv = random_input((length, 2, 3, 2, head_dim), torch.float32, CPU, seed=length + head_dim + rope_dim)
    cos, sin = tables(length, rope_dim, layout)
    q_scale = head_dim**-0.5
    q, k, v = kernels.rotate_packed(qkv, cos, sin, 0, layout == "interleaved", q_scale)
    assert_eq34(q, heads_of(qkv, 0), range(length), rope_dim, layout, torch.float32, q_scale)
    assert_eq34(k, heads_of(qkv, 1), range(length), rope_dim, layout, torch.float32)
    assert torch.equal(v, heads_of(qkv, 2))


@LAYOUTS
@pytest.mark.parametrize("start", [1000, 4093, 9967])
def test_offsets_in_the_thousands_forward_and_backward(kernels, start, layout):
    """Positions start … start+T−1 of a table of exactly start+T rows (its last row read), over
    two blocks; the gradients are the inverse rotation, q's scaled alike."""
    length, head_dim, rope_dim = 40, 64, 48
    q, k, grad_q, grad_k = (random_input((2, 2, length, head_dim), torch.float32, CPU, seed=start + i)
                            for i in range(4))
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = tables(start + length, rope_dim, layout)
    rotated_q, rotated_k = kernels.rotate_qk(q, k, cos, sin, start, layout == "interleaved", 0.125)
    torch.autograd.backward((rotated_q, rotated_k), (grad_q, grad_k))
    positions = range(start, start + length)
    inverse = [-m for m in positions]
    assert_eq34(rotated_q, q, positions, rope_dim, layout, torch.float32, 0.125)
    assert_eq34(rotated_k, k, positions, rope_dim, layout, torch.float32)
    assert_eq34(q.grad, grad_q, inverse, rope_dim, layout, torch.float32, 0.125)
    assert_eq34(k.grad, grad_k, inverse, rope_dim, layout, torch.float32)


# --- Per-sentence tables and a per-sentence scale of q -----------------------------------------

SCALES = (1.0, 2.5, 4.0)  # each sentence's own table (a dynamic scaling)
ROW_SCALE = (1.0, 0.75, 0.912345)  # and its own factor of q (dynamic YaRN's 1/t)


@pytest.mark.parametrize("dtype", DTYPES)
@LAYOUTS
@pytest.mark.parametrize("rope_dim", [64, 40], ids=["full", "partial"])
@pytest.mark.parametrize("function", ["rotate_qk", "rotate_packed"])
def test_per_sentence_tables_and_row_scale_forward_and_backward(kernels, function, rope_dim, layout, dtype):
    """Sentence b rotates by its own table and its q is scaled by q_scale·row_scale[b] (rounded
    once); the backward scales q's gradient alike (the gradient of s·R q is s·Rᵀ g)."""
    batch, heads, length, head_dim, start, q_scale = len(SCALES), 2, 19, 64, 5, 0.5
    row_scale = torch.tensor(ROW_SCALE, dtype=torch.float32)
    cos, sin = tables(start + length + 3, rope_dim, layout, SCALES)
    interleaved = layout == "interleaved"
    grads = [random_input((batch, heads, length, head_dim), dtype, CPU, seed=40 + i) for i in range(3)]
    if function == "rotate_qk":
        q, k = (random_input((batch, heads, length, head_dim), dtype, CPU, seed=i).requires_grad_() for i in (1, 2))
        out = kernels.rotate_qk(q, k, cos, sin, start, interleaved, q_scale, row_scale=row_scale)
        torch.autograd.backward(out, grads[:2])
        inputs, input_grads = (q.detach(), k.detach()), (q.grad, k.grad)
    else:
        qkv = random_input((length, batch, 3, heads, head_dim), dtype, CPU, seed=3).requires_grad_()
        out = kernels.rotate_packed(qkv, cos, sin, start, interleaved, q_scale, row_scale=row_scale)
        torch.autograd.backward(out, grads)
        inputs, input_grads = (heads_of(qkv, 0), heads_of(qkv, 1)), (heads_of(qkv.grad, 0), heads_of(qkv.grad, 1))
        assert torch.equal(out[2], heads_of(qkv, 2)) and torch.equal(heads_of(qkv.grad, 2), grads[2])
    for b, (sentence_scale, factor) in enumerate(zip(SCALES, row_scale.double().tolist())):
        positions = [m / sentence_scale for m in range(start, start + length)]
        inverse = [-m for m in positions]
        assert_eq34(out[0][b], inputs[0][b], positions, rope_dim, layout, dtype, q_scale * factor)
        assert_eq34(out[1][b], inputs[1][b], positions, rope_dim, layout, dtype)
        assert_eq34(input_grads[0][b], grads[0][b], inverse, rope_dim, layout, dtype, q_scale * factor)
        assert_eq34(input_grads[1][b], grads[1][b], inverse, rope_dim, layout, dtype)


# --- The checks of rotate() ---------------------------------------------------------------------

BATCH, HEADS, LENGTH, HEAD_DIM, HALF, TABLE = 2, 2, 5, 16, 6, 10


def valid_arguments() -> dict:
    """rotate's arguments, all consistent: q, k, v and outputs (2, 2, 5, 16), 2-D tables of 10
    positions, start 5 (the last row read: start + T = T_table), a row scale."""
    def x():
        return torch.zeros(BATCH, HEADS, LENGTH, HEAD_DIM)

    return dict(q=x(), k=x(), out_q=x(), out_k=x(), cos=torch.ones(TABLE, HALF), sin=torch.zeros(TABLE, HALF),
                start=TABLE - LENGTH, interleaved=True, q_scale=1.0, v=x(), out_v=x(),
                row_scale=torch.ones(BATCH))


def test_valid_arguments_pass_the_checks(kernels):
    arguments = valid_arguments()
    kernels.rotate(**arguments)
    per_sentence = dict(arguments, cos=torch.ones(BATCH, TABLE, HALF), sin=torch.zeros(BATCH, TABLE, HALF), start=0)
    kernels.rotate(**per_sentence)
    kernels.rotate(**dict(arguments, v=None, out_v=None, row_scale=None))


def shape(*size):
    return torch.zeros(*size)


META = torch.device("meta")  # a device that is not q's, on any machine
X_SHAPE = (BATCH, HEADS, LENGTH, HEAD_DIM)
CHECKS = {
    "q-not-4d": (dict(q=shape(BATCH, LENGTH, HEAD_DIM)), r"\(B, H, T, head_dim\)"),
    **{f"{name}-shape": (dict([(name, shape(BATCH, HEADS, LENGTH + 1, HEAD_DIM))]), f"{name} of q's shape")
       for name in ("k", "out_q", "out_k", "v", "out_v")},
    **{f"{name}-dtype": (dict([(name, torch.zeros(X_SHAPE, dtype=dtype))]), f"{name} of q's dtype")
       for name, dtype in (("k", torch.float16), ("out_q", torch.bfloat16), ("out_k", torch.float64),
                           ("v", torch.float16), ("out_v", torch.bfloat16))},
    **{f"{name}-device": (dict([(name, torch.zeros(X_SHAPE, device=META))]), f"{name} on q's device")
       for name in ("k", "out_q", "out_k", "v", "out_v")},
    "v-without-out_v": (dict(out_v=None), "v without out_v"),
    "out_v-without-v": (dict(v=None), "out_v without v"),
    "rope-past-head-dim": (dict(cos=shape(TABLE, 18), sin=shape(TABLE, 18)), "past head_dim"),
    "interleaved-odd-width": (dict(cos=shape(TABLE, 7), sin=shape(TABLE, 7)), "an even width"),
    "table-1d": (dict(cos=shape(TABLE), sin=shape(TABLE)), "tables for a batch"),
    "table-4d": (dict(cos=shape(BATCH, 1, TABLE, HALF), sin=shape(BATCH, 1, TABLE, HALF)), "tables for a batch"),
    "table-batch": (dict(cos=shape(BATCH + 1, TABLE, HALF), sin=shape(BATCH + 1, TABLE, HALF)),
                    "tables for a batch"),
    "sin-shape": (dict(sin=shape(TABLE + 1, HALF)), "differ in shape"),
    "table-dtype": (dict(cos=torch.ones(TABLE, HALF, dtype=torch.float64),
                         sin=torch.zeros(TABLE, HALF, dtype=torch.float64)), "fp32 tables"),
    "table-device": (dict(cos=torch.ones(TABLE, HALF, device=META), sin=torch.zeros(TABLE, HALF, device=META)),
                     "tables on q's device"),
    "negative-start": (dict(start=-1), "not rows of a table"),
    "past-the-table": (dict(start=TABLE - LENGTH + 1), "not rows of a table"),
    "row_scale-shape": (dict(row_scale=torch.ones(BATCH, 1)), "one fp32 factor per sentence"),
    "row_scale-batch": (dict(row_scale=torch.ones(BATCH + 1)), "one fp32 factor per sentence"),
    "row_scale-dtype": (dict(row_scale=torch.ones(BATCH, dtype=torch.float16)), "one fp32 factor per sentence"),
    "row_scale-device": (dict(row_scale=torch.ones(BATCH, device=META)), "row_scale on q's device"),
}


@pytest.mark.parametrize("case", list(CHECKS))
def test_each_check_raises_value_error(kernels, case):
    changes, message = CHECKS[case]
    with pytest.raises(ValueError, match=message):
        kernels.rotate(**dict(valid_arguments(), **changes))


def test_no_gradient_is_dropped_for_row_scale(kernels):
    q = torch.zeros(1, 1, 2, 4, requires_grad=True)
    cos, sin = tables(2, 4, "interleaved")
    with pytest.raises(ValueError, match="no gradient for row_scale"):
        kernels.rotate_qk(q, q, cos, sin, 0, True, row_scale=torch.ones(1, requires_grad=True))


# --- The device guard -----------------------------------------------------------------------------

def test_device_guard_is_entered_only_for_another_cuda_device(kernels, monkeypatch):
    """Triton launches on the current device: a tensor on another one needs torch.cuda.device
    around the launch; the current device and the CPU enter nothing (and the CPU asks nothing)."""
    asked: List[int] = []
    entered: List[int] = []

    def current_device() -> int:
        asked.append(0)
        return 0

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    monkeypatch.setattr(torch.cuda, "current_device", current_device)
    monkeypatch.setattr(torch.cuda, "device", device)
    with kernels._device_guard(torch.device("cuda", 1)):
        assert entered == [1]
    with kernels._device_guard(torch.device("cuda", 0)):
        pass
    assert entered == [1] and len(asked) == 2
    with kernels._device_guard(CPU):
        pass
    assert entered == [1] and len(asked) == 2


def test_the_launch_runs_inside_the_guard_of_q_device(kernels, monkeypatch):
    events: list = []

    @contextlib.contextmanager
    def guard(device):
        events.append(("enter", device))
        yield
        events.append("exit")

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: events.append("launch")

    monkeypatch.setattr(kernels, "_device_guard", guard)
    monkeypatch.setattr(kernels, "_rotary_kernel", Kernel())
    kernels.rotate(**valid_arguments())
    assert events == [("enter", CPU), "launch", "exit"]


# --- No silent second derivative ------------------------------------------------------------------

@pytest.mark.parametrize("function", ["rotate_qk", "rotate_packed"])
def test_a_second_derivative_through_the_kernel_raises(kernels, function):
    """The backward is a kernel autograd cannot differentiate: with create_graph=True its result
    must refuse a second backward, not count as a constant (here the x³ term would keep the graph
    alive and hide the missing R·R term)."""
    cos, sin = tables(3, 8, "half")
    if function == "rotate_qk":
        x = random_input((1, 2, 3, 8), torch.float32, CPU, seed=1).requires_grad_()
        out = kernels.rotate_qk(x, x * 2, cos, sin, 0, False, 0.5)
    else:
        x = random_input((3, 1, 3, 2, 8), torch.float32, CPU, seed=1).requires_grad_()
        out = kernels.rotate_packed(x, cos, sin, 0, False, 0.5)
    loss = sum((o**2).sum() for o in out) + (x**3).sum()
    (grad,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()
