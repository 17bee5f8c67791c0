"""Shaw et al.'s relative self-attention (``fairseq_rope.relative`` inside
``PositionalMultiheadAttention``) on the device, in fp32, fp16 and bf16, against
Eqs. 3-6 written out in fp64 on the CPU (a^K_ij and a^V_ij materialized).

Tolerance: the root-mean-square error of the output is at most 3 times the error
that fairseq's own MultiheadAttention (the same projections, no relative terms;
its explicit softmax path) makes on the same inputs, on the same device and in
the same dtype, against itself in fp64. The relative terms add a few rounded
operations of the same kind (q·w^K, the probability mass per distance, its
product with w^V) to the ones both share: on the CPU the ratio measures 1.0 to
1.5 in every dtype; 3 leaves as much again for kernels that round differently
on the device. A wrong distance, sign or table is off by the size of the
output, hundreds of times this. The weights and inputs are rounded to the
dtype before the fp64 references see them, so both errors are the
computation's alone.
"""

from __future__ import annotations

import copy
import pytest
import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.relative import TABLES, RelativePositionEncoding
from tests.gpu.conftest import DTYPES

pytestmark = pytest.mark.gpu

EMBED, HEADS, K = 32, 4, 3
HEAD_DIM = EMBED // HEADS
LENGTH, BATCH = 12, 3  # LENGTH > 2K + 1: distances beyond K are clipped
RATIO = 3.0


def attention_pair(shared_heads: bool):
    """An RPE self-attention and fairseq's self-attention with the same projections, fp32 on the CPU."""
    rpe = PositionalMultiheadAttention(EMBED, HEADS, RelativePositionEncoding(HEAD_DIM, HEADS, K, shared_heads=shared_heads))
    stock = MultiheadAttention(EMBED, HEADS, self_attention=True)
    stock.load_state_dict({k: v for k, v in rpe.state_dict().items() if "position_encoding" not in k})
    return rpe.eval(), stock.eval()


def shaw64(rpe: PositionalMultiheadAttention, x: Tensor, mask: Tensor) -> Tensor:
    """Eqs. 3-6 in fp64 with ``rpe``'s weights: e_ij = q_i·(k_j + a^K_ij)/√d + mask_ij,
    z_i = Σ_j softmax(e_i)_j (v_j + a^V_ij), a_ij = w_clip(j−i, K); x (T, B, C), mask (B, T, S)."""
    T, B, _ = x.shape
    heads = lambda t: t.view(T, B, HEADS, HEAD_DIM).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = (heads(projection(x)) for projection in (rpe.q_proj, rpe.k_proj, rpe.v_proj))
    distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # j − i
    w_k, w_v = (getattr(rpe.position_encoding, name).weight.expand(HEADS, 2 * K + 1, HEAD_DIM) for name in TABLES)
    a_k, a_v = (w[:, distance.clamp(-K, K) + K] for w in (w_k, w_v))  # (H, T, T, d)
    e = (q @ k.transpose(-1, -2) + torch.einsum("bhid,hijd->bhij", q, a_k)) / HEAD_DIM**0.5 + mask[:, None]
    alpha = torch.softmax(e, dim=-1)
    z = alpha @ v + torch.einsum("bhij,hijd->bhid", alpha, a_v)
    return rpe.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, EMBED))


def rms(t: Tensor) -> float:
    return t.double().pow(2).mean().sqrt().item()


def inputs(dtype: torch.dtype):
    """x (T, B, C) rounded to the dtype, a key padding mask (3 pads left of sentence 0)
    and a causal mask, additive in fp64 (B, T, S)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(LENGTH, BATCH, EMBED, generator=g).to(dtype)
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[0, :3] = True
    causal = torch.triu(torch.full((LENGTH, LENGTH), float("-inf"), dtype=torch.float64), 1)
    return x, padding, causal


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shared_heads", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_relative_attention_matches_shaws_equations_in_fp64(device, dtype, shared_heads, side):
    """Encoder: padded keys, every query; decoder: causal, as one pass and step by step."""
    rpe, stock = attention_pair(shared_heads)
    rpe, stock = rpe.to(device, dtype), stock.to(device, dtype)
    rpe64, stock64 = (copy.deepcopy(m).to("cpu", torch.float64) for m in (rpe, stock))  # the dtype's weights
    x, padding, causal = inputs(dtype)
    x_dev = x.to(device)
    if side == "encoder":
        kwargs = dict(key_padding_mask=padding.to(device))
        kwargs64 = dict(key_padding_mask=padding)
        mask64 = torch.zeros(BATCH, LENGTH, LENGTH, dtype=torch.float64).masked_fill(padding[:, None], float("-inf"))
    else:
        kwargs = dict(attn_mask=causal.to(device, dtype))
        kwargs64 = dict(attn_mask=causal)
        mask64 = causal.expand(BATCH, -1, -1)
    expected = shaw64(rpe64, x.double(), mask64)
    stock_out = stock(x_dev, x_dev, x_dev, need_weights=True, **kwargs)[0]
    stock_error = rms(stock_out.cpu().double() - stock64(x.double(), x.double(), x.double(), **kwargs64)[0])
    assert stock_error > 0  # the dtype does round: a scale to compare with

    def check(out: Tensor, what: str) -> None:
        assert out.dtype == dtype and out.device == device, what
        error = rms(out.cpu().double() - expected)
        assert error <= RATIO * stock_error, f"{what}: rms error {error:.3g}, fairseq's own {stock_error:.3g}"

    for need_weights in (False, True):
        check(rpe(x_dev, x_dev, x_dev, need_weights=need_weights, **kwargs)[0], f"need_weights={need_weights}")
    if side == "decoder":
        state: dict = {}
        steps = [rpe(x_dev[t : t + 1], x_dev[t : t + 1], x_dev[t : t + 1], incremental_state=state,
                     need_weights=False)[0] for t in range(LENGTH)]
        check(torch.cat(steps), "incremental decoding")
