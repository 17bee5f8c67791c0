"""Shaw et al. (2018) relative position representations inside PositionalMultiheadAttention,
with tables per layer and head (the paper's §4.1 base model, the default) and
shared by the heads of a layer (§3.3, ``shared_heads=True``)."""

import copy

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_rope.position_context import PositionContext
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.relative import TABLES, RelativePositionEncoding, relative_buckets

EMBED, HEADS, K = 24, 3, 3
HEAD_DIM = EMBED // HEADS
VARIANTS = pytest.mark.parametrize("shared_heads", [False, True], ids=["per-head", "shared"])


def rpe_attention(shared_heads: bool = False) -> PositionalMultiheadAttention:
    encoding = RelativePositionEncoding(HEAD_DIM, HEADS, K, shared_heads=shared_heads)
    return PositionalMultiheadAttention(EMBED, HEADS, encoding).eval()


def causal_mask(T: int) -> torch.Tensor:
    return torch.triu(torch.full((T, T), float("-inf")), 1)


def per_head_tables(enc: RelativePositionEncoding):
    """w^K, w^V as (H, 2k+1, d): a shared table is the same table for every head."""
    return [getattr(enc, name).weight.expand(HEADS, 2 * K + 1, HEAD_DIM) for name in TABLES]


def shaw_reference(attn, x, attn_mask=None):
    """Eqs. 3-6 written out: a^K_ij, a^V_ij materialized for every head h and (i, j)."""
    T, B, _ = x.shape
    heads = lambda t: t.view(T, B, HEADS, HEAD_DIM).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]
    w_k, w_v = per_head_tables(attn.position_encoding)
    a_k = w_k[:, distance.clamp(-K, K) + K]  # (H, T, T, d)
    a_v = w_v[:, distance.clamp(-K, K) + K]
    e = (torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,hijd->bhij", q, a_k)) / HEAD_DIM**0.5
    if attn_mask is not None:
        e = e + attn_mask
    alpha = torch.softmax(e, dim=-1)
    z = alpha @ v + torch.einsum("bhij,hijd->bhid", alpha, a_v)
    return attn.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, EMBED))


def test_distances_beyond_k_share_one_bucket():
    buckets = relative_buckets(6, 10, offset=2, max_distance=K)
    distance = torch.arange(10)[None, :] - torch.arange(2, 8)[:, None]
    assert torch.equal(buckets, distance.clamp(-K, K) + K)
    assert set(buckets[distance >= K].tolist()) == {2 * K}
    assert set(buckets[distance <= -K].tolist()) == {0}


@VARIANTS
def test_clipped_distances_get_identical_logit_terms(shared_heads):
    enc = RelativePositionEncoding(HEAD_DIM, HEADS, K, shared_heads=shared_heads)
    q = torch.randn(1, HEADS, 1, HEAD_DIM)
    bias = enc.logit_bias(q, PositionContext(0), src_len=12)[0, :, 0]  # query at 0, keys at 0..11
    assert torch.allclose(bias[:, K:], bias[:, K : K + 1].expand(HEADS, 12 - K))
    assert not torch.allclose(bias[:, K - 1], bias[:, K])


@VARIANTS
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_shaws_equations(causal, shared_heads):
    attn = rpe_attention(shared_heads)
    x = torch.randn(9, 2, EMBED)
    mask = causal_mask(9) if causal else None
    for need_weights in (False, True):
        out, _ = attn(x, x, x, attn_mask=mask, need_weights=need_weights)
        torch.testing.assert_close(out, shaw_reference(attn, x, mask), atol=1e-5, rtol=1e-5)


@VARIANTS
def test_incremental_decoding_equals_full_causal_forward(shared_heads):
    attn = rpe_attention(shared_heads)
    T = 2 * K + 5  # long enough for clipped distances
    x = torch.randn(T, 3, EMBED)
    full, _ = attn(x, x, x, attn_mask=causal_mask(T), need_weights=False)
    state = {}
    steps = [attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0] for t in range(T)]
    assert (torch.cat(steps) - full).abs().max() < 1e-5


def test_tables_have_one_slice_per_head_and_heads_start_different():
    per_head, shared = rpe_attention(False).position_encoding, rpe_attention(True).position_encoding
    for name in TABLES:
        assert getattr(per_head, name).weight.shape == (HEADS, 2 * K + 1, HEAD_DIM)
        assert getattr(shared, name).weight.shape == (2 * K + 1, HEAD_DIM)
    w = per_head.key_embeddings.weight
    assert not torch.allclose(w[0], w[1])
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(per_head) == HEADS * count(shared) == HEADS * 2 * (2 * K + 1) * HEAD_DIM


def test_shared_tables_equal_per_head_tables_that_are_copies():
    shared, per_head = rpe_attention(True), rpe_attention(False)
    projections = {k: v for k, v in shared.state_dict().items() if "position_encoding" not in k}
    per_head.load_state_dict(projections, strict=False)
    with torch.no_grad():
        for name, table in zip(TABLES, per_head_tables(shared.position_encoding)):
            getattr(per_head.position_encoding, name).weight.copy_(table)
    x = torch.randn(8, 2, EMBED)
    for mask in (None, causal_mask(8)):
        torch.testing.assert_close(per_head(x, x, x, attn_mask=mask)[0], shared(x, x, x, attn_mask=mask)[0])


def test_each_head_uses_its_own_tables():
    attn = rpe_attention(False)
    x = torch.randn(6, 1, EMBED)
    before = attn(x, x, x, need_head_weights=True)[1]  # (H, B, T, S)
    with torch.no_grad():
        attn.position_encoding.key_embeddings.weight[1, K] += 1.0  # head 1, distance 0
    after = attn(x, x, x, need_head_weights=True)[1]
    changed = [not torch.allclose(before[h], after[h]) for h in range(HEADS)]
    assert changed == [False, True, False]


def rms(t: torch.Tensor) -> float:
    return t.double().pow(2).mean().sqrt().item()


@VARIANTS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_follows_the_activations(shared_heads, dtype):
    """In fp16 and bf16 the output's error against Shaw's equations in fp64 is at most twice the
    error fairseq's own MultiheadAttention (the same projections, no relative terms) makes in
    that dtype against itself in fp64, on the same inputs (measured: 1.1-1.4 times)."""
    attn = rpe_attention(shared_heads)
    stock = MultiheadAttention(EMBED, HEADS, self_attention=True).eval()
    stock.load_state_dict({k: v for k, v in attn.state_dict().items() if "position_encoding" not in k})
    x, mask = torch.randn(12, 4, EMBED), causal_mask(12)

    def run(module, dt):
        x_dt = x.to(dt)
        return copy.deepcopy(module).to(dt)(x_dt, x_dt, x_dt, attn_mask=mask.to(dt))[0]

    out = run(attn, dtype)
    assert out.dtype == dtype
    attn64 = copy.deepcopy(attn).double()
    error = rms(out.double() - shaw_reference(attn64, x.double(), mask.double()))
    stock_error = rms(run(stock, dtype).double() - run(stock, torch.float64))
    assert 0 < error <= 2 * stock_error, (error, stock_error)


@VARIANTS
def test_gradients_reach_both_relative_tables(shared_heads):
    attn = rpe_attention(shared_heads).train()
    x = torch.randn(5, 2, EMBED)
    attn(x, x, x, need_weights=False)[0].sum().backward()
    enc = attn.position_encoding
    for name in TABLES:
        grad = getattr(enc, name).weight.grad
        assert grad.abs().sum() > 0
        if not shared_heads:
            assert all(grad[h].abs().sum() > 0 for h in range(HEADS))


def test_shared_checkpoint_tables_load_into_per_head_tables_with_identical_outputs():
    shared, per_head = rpe_attention(True), rpe_attention(False)
    state = shared.state_dict()
    with pytest.warns(UserWarning, match="copied to every head"):
        per_head.position_encoding.upgrade_state_dict_named(state, "position_encoding")
    per_head.load_state_dict(state)
    assert per_head.position_encoding.key_embeddings.weight.shape == (HEADS, 2 * K + 1, HEAD_DIM)
    x = torch.randn(9, 2, EMBED)
    torch.testing.assert_close(per_head(x, x, x)[0], shared(x, x, x)[0])


def test_per_head_checkpoint_into_a_shared_model_is_refused_naming_the_option():
    state = rpe_attention(False).state_dict()
    shared = rpe_attention(True)
    with pytest.raises(ValueError, match=r"position_encoding.key_embeddings.weight holds per-head tables .*--rpe-shared-heads"):
        shared.position_encoding.upgrade_state_dict_named(state, "position_encoding")


def test_per_head_tables_are_built_for_the_given_heads():
    enc = RelativePositionEncoding(HEAD_DIM, HEADS, K)
    assert enc.key_embeddings.weight.shape == (HEADS, 2 * K + 1, HEAD_DIM)
    with pytest.raises(ValueError, match="built for 3 heads, not 4"):
        PositionalMultiheadAttention(4 * HEAD_DIM, 4, enc)


def test_max_distance_must_be_positive():
    with pytest.raises(ValueError, match="--rpe-max-distance must be >= 1, got 0"):
        RelativePositionEncoding(HEAD_DIM, HEADS, 0)


def test_shared_heads_must_be_a_boolean():
    with pytest.raises(ValueError, match="--rpe-shared-heads must be a boolean, got 'False'"):
        RelativePositionEncoding(HEAD_DIM, HEADS, K, shared_heads="False")
