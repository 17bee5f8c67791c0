"""Shaw et al. (2018) relative position representations inside PositionalMultiheadAttention."""

import pytest
import torch

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.relative import RelativePositionEncoding, relative_buckets

EMBED, HEADS, K = 24, 3, 3
HEAD_DIM = EMBED // HEADS


def rpe_attention() -> PositionalMultiheadAttention:
    return PositionalMultiheadAttention(EMBED, HEADS, RelativePositionEncoding(HEAD_DIM, K)).eval()


def shaw_reference(attn, x, attn_mask=None):
    """Eqs. 3-6 written out: a^K_ij, a^V_ij materialized for every (i, j)."""
    T, B, _ = x.shape
    enc = attn.position_encoding
    heads = lambda t: t.view(T, B, HEADS, HEAD_DIM).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]
    a_k = enc.key_embeddings.weight[distance.clamp(-K, K) + K]  # (T, T, d)
    a_v = enc.value_embeddings.weight[distance.clamp(-K, K) + K]
    e = (torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,ijd->bhij", q, a_k)) / HEAD_DIM**0.5
    if attn_mask is not None:
        e = e + attn_mask
    alpha = torch.softmax(e, dim=-1)
    z = alpha @ v + torch.einsum("bhij,ijd->bhid", alpha, a_v)
    return attn.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, EMBED))


def test_distances_beyond_k_share_one_bucket():
    buckets = relative_buckets(6, 10, offset=2, max_distance=K)
    distance = torch.arange(10)[None, :] - torch.arange(2, 8)[:, None]
    assert torch.equal(buckets, distance.clamp(-K, K) + K)
    assert set(buckets[distance >= K].tolist()) == {2 * K}
    assert set(buckets[distance <= -K].tolist()) == {0}


def test_clipped_distances_get_identical_logit_terms():
    enc = RelativePositionEncoding(HEAD_DIM, K)
    q = torch.randn(1, 1, 1, HEAD_DIM)
    bias = enc.logit_bias(q, offset=0, src_len=12)[0, 0, 0]  # query at 0, keys at 0..11
    assert torch.allclose(bias[K:], bias[K].expand(12 - K))
    assert not torch.allclose(bias[K - 1], bias[K])


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_shaws_equations(causal):
    attn = rpe_attention()
    x = torch.randn(9, 2, EMBED)
    mask = torch.triu(torch.full((9, 9), float("-inf")), 1) if causal else None
    for need_weights in (False, True):
        out, _ = attn(x, x, x, attn_mask=mask, need_weights=need_weights)
        torch.testing.assert_close(out, shaw_reference(attn, x, mask), atol=1e-5, rtol=1e-5)


def test_incremental_decoding_equals_full_causal_forward():
    attn = rpe_attention()
    T = 2 * K + 5  # long enough for clipped distances
    x = torch.randn(T, 3, EMBED)
    full, _ = attn(x, x, x, attn_mask=torch.triu(torch.full((T, T), float("-inf")), 1), need_weights=False)
    state = {}
    steps = [attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0] for t in range(T)]
    assert (torch.cat(steps) - full).abs().max() < 1e-5


def test_gradients_reach_both_relative_tables():
    attn = rpe_attention().train()
    x = torch.randn(5, 2, EMBED)
    attn(x, x, x, need_weights=False)[0].sum().backward()
    enc = attn.position_encoding
    assert enc.key_embeddings.weight.grad.abs().sum() > 0
    assert enc.value_embeddings.weight.grad.abs().sum() > 0


def test_max_distance_must_be_positive():
    with pytest.raises(ValueError, match="--rpe-max-distance must be >= 1, got 0"):
        RelativePositionEncoding(HEAD_DIM, 0)
