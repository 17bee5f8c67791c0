"""ALiBi (Press et al. 2022) inside PositionalMultiheadAttention, against the paper written
out in fp64: slopes from §3's words, the bias −m_h·|i − j| added to q·k/√d."""

import math

import pytest
import torch

from tests.conftest import attend_step_by_step

from fairseq_rope.position_context import PositionContext
from fairseq_rope.alibi import AlibiBias, alibi_slopes
from fairseq_rope.attention import PositionalMultiheadAttention

HEAD_DIM = 8


def paper_slopes(n: int) -> list:
    """§3: "the geometric sequence that starts at 2^(−8/n) and uses that same value as its
    ratio" for n a power of 2; otherwise (their get_slopes) the slopes of the closest power
    of 2 below n, then every other slope of twice that power, as many as are missing."""
    if math.log2(n).is_integer():
        start = 2 ** (-8 / n)
        return [start * start**i for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return paper_slopes(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def test_slopes_of_the_papers_examples():
    # §3: 8 heads take 1/2^1, 1/2^2, …, 1/2^8; 16 heads those 8 with the geometric mean of
    # each consecutive pair in between, 1/2^0.5, 1/2^1, …, 1/2^8.
    assert alibi_slopes(8) == pytest.approx([2.0**-k for k in range(1, 9)], rel=1e-15)
    assert alibi_slopes(16) == pytest.approx([2.0 ** -(k / 2) for k in range(1, 17)], rel=1e-15)


@pytest.mark.parametrize("n", range(1, 25))
def test_slopes_follow_the_rule_for_every_head_count(n):
    assert alibi_slopes(n) == pytest.approx(paper_slopes(n), rel=1e-14, abs=0)
    assert len(set(alibi_slopes(n))) == n  # every head its own slope


def alibi_attention(heads: int) -> PositionalMultiheadAttention:
    return PositionalMultiheadAttention(heads * HEAD_DIM, heads, AlibiBias(heads)).double().eval()


def causal_mask(T: int) -> torch.Tensor:
    return torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)


def press_reference(attn, x, causal: bool):
    """softmax(q_i·Kᵀ/√d + m_h·[−(i−1), …, −1, 0]) (§3; the decoder), or with −m_h·|i − j| for
    every key (the encoder), per head, in fp64."""
    T, B, C = x.shape
    H = attn.num_heads
    heads = lambda t: t.view(T, B, H, HEAD_DIM).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    for h, m in enumerate(paper_slopes(H)):
        for i in range(T):
            for j in range(T):
                if causal and j > i:
                    scores[:, h, i, j] = float("-inf")
                else:
                    scores[:, h, i, j] += -m * (i - j) if causal else -m * abs(i - j)
    z = torch.softmax(scores, -1) @ v
    return attn.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, C))


@pytest.mark.parametrize("heads", [4, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_forward_matches_press_et_al(heads, causal):
    """The fused path (no weights) and the explicit one (weights)."""
    attn = alibi_attention(heads)
    x = torch.randn(9, 2, heads * HEAD_DIM, dtype=torch.float64)
    expected = press_reference(attn, x, causal)
    mask = causal_mask(9) if causal else None
    for need_weights in (False, True):
        out, _ = attn(x, x, x, attn_mask=mask, need_weights=need_weights)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)


def test_the_bias_joins_the_scaled_scores():
    """The contract adds logit_bias to q·k/√d: it is Press et al.'s −m_h·|i − j| itself."""
    bias = AlibiBias(2).logit_bias(torch.zeros(1, 2, 3, HEAD_DIM, dtype=torch.float64), PositionContext(5), 8)
    distance = (torch.arange(8)[None, :] - torch.arange(5, 8)[:, None]).abs().double()
    expected = -torch.tensor([2.0**-4, 2.0**-8], dtype=torch.float64)[:, None, None] * distance
    torch.testing.assert_close(bias, expected, atol=1e-14, rtol=0)


@pytest.mark.parametrize("heads", [4, 6])
def test_incremental_decoding_equals_full_causal_forward(heads):
    attn = alibi_attention(heads)
    x = torch.randn(12, 3, heads * HEAD_DIM, dtype=torch.float64)
    full, _ = attn(x, x, x, attn_mask=causal_mask(12), need_weights=False)
    torch.testing.assert_close(attend_step_by_step(attn, x), full, atol=1e-12, rtol=0)


def test_no_parameters_and_an_attention_of_other_heads_is_refused():
    encoding = AlibiBias(2)
    assert list(encoding.parameters()) == [] and list(encoding.state_dict()) == []
    with pytest.raises(ValueError, match="built for 2 heads, not 4"):
        PositionalMultiheadAttention(4 * HEAD_DIM, 4, encoding)
