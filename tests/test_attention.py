"""PositionalMultiheadAttention against an explicit reference and fairseq's own attention."""

import copy

import pytest
import torch
import torch.nn.utils.parametrize
from fairseq.modules import MultiheadAttention
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.position_encoding import PositionEncoding as NoEncoding
from fairseq_rope.rotary import RotaryEmbedding, apply_rotary, inverse_frequencies, rotation_angles

EMBED, HEADS = 32, 4


def rope_attention(layout="interleaved", rope_dim=None) -> PositionalMultiheadAttention:
    encoding = RotaryEmbedding(EMBED // HEADS, rope_dim, layout=layout)
    return PositionalMultiheadAttention(EMBED, HEADS, encoding).eval()


def rotate(encoding: RotaryEmbedding, x):
    """x (..., T, head_dim) rotated at positions 0 … T−1, angles computed here (not cached)."""
    inv_freq = inverse_frequencies(encoding.rope_dim, encoding.theta)
    angles = rotation_angles(torch.arange(x.size(-2)), inv_freq)
    return apply_rotary(x, angles.cos(), angles.sin(), encoding.layout)


def reference(attn: PositionalMultiheadAttention, x, key_padding_mask=None, attn_mask=None):
    """softmax(R q · R k / sqrt(d) + masks) v, written out from the definitions."""
    T, B, _ = x.shape
    H, D = attn.num_heads, attn.head_dim

    def heads(t):
        return t.view(T, B, H, D).permute(1, 2, 0, 3)

    encoding = attn.position_encoding
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    logits = rotate(encoding, q) @ rotate(encoding, k).transpose(-1, -2) / D**0.5
    if attn_mask is not None:
        logits = logits + attn_mask
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    out = torch.softmax(logits, -1) @ v
    return attn.out_proj(out.permute(2, 0, 1, 3).reshape(T, B, H * D))


def causal_mask(T):
    return torch.triu(torch.full((T, T), float("-inf")), 1)


def padding(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_forward_matches_reference_with_padding_and_causal_masks(need_weights, layout):
    attn = rope_attention(layout)
    x = torch.randn(7, 3, EMBED)
    kpm, mask = padding([7, 5, 2], 7), causal_mask(7)
    out, weights = attn(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=need_weights)
    expected = reference(attn, x, kpm, mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert (weights is not None) == need_weights
    if need_weights:
        assert weights.shape == (3, 7, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 7))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("masks", ["padding", "causal", "padding+causal"])
def test_fused_and_explicit_paths_agree_in_training_mode_without_dropout(layout, masks):
    # need_weights=True forces the explicit softmax; False takes SDPA.
    attn = rope_attention(layout).train()
    x = torch.randn(9, 2, EMBED, requires_grad=True)
    kwargs = {}
    if "padding" in masks:
        kwargs["key_padding_mask"] = padding([9, 4], 9)
    if "causal" in masks:
        kwargs["attn_mask"] = causal_mask(9)
    fused, _ = attn(x, x, x, need_weights=False, **kwargs)
    explicit, _ = attn(x, x, x, need_weights=True, **kwargs)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    (g_fused,) = torch.autograd.grad(fused.sum(), x)
    (g_explicit,) = torch.autograd.grad(explicit.sum(), x)
    torch.testing.assert_close(g_fused, g_explicit, atol=1e-5, rtol=1e-5)


def test_without_encoding_it_is_exactly_fairseqs_attention():
    """Same parameters and semantics as fairseq's MultiheadAttention (its fast path here)."""
    stock = MultiheadAttention(EMBED, HEADS, self_attention=True).eval()
    ours = PositionalMultiheadAttention(EMBED, HEADS, NoEncoding()).eval()
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(6, 2, EMBED)
    kpm = padding([6, 3], 6)
    torch.testing.assert_close(ours(x, x, x, kpm)[0], stock(x, x, x, kpm)[0], atol=1e-5, rtol=1e-5)


def test_rotation_is_never_skipped():
    """Rotating changes the output; an unrotated copy of the same weights differs."""
    attn = rope_attention()
    plain = PositionalMultiheadAttention(EMBED, HEADS, NoEncoding()).eval()
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(8, 2, EMBED)
    for need_weights in (False, True):
        rotated = attn(x, x, x, need_weights=need_weights)[0]
        assert (rotated - plain(x, x, x, need_weights=need_weights)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("rope_dim", [None, 4])
def test_incremental_steps_equal_full_causal_forward(rope_dim):
    attn = rope_attention(rope_dim=rope_dim)
    x = torch.randn(10, 3, EMBED)
    full, _ = attn(x, x, x, attn_mask=causal_mask(10), need_weights=False)
    state = {}
    steps = [attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0] for t in range(10)]
    assert (torch.cat(steps) - full).abs().max() < 1e-5
    cached = attn._get_input_buffer(state)
    assert cached["prev_key"].shape == (3, HEADS, 10, EMBED // HEADS)


def test_cache_holds_rotated_keys_and_survives_beam_reordering():
    attn = rope_attention()
    x = torch.randn(5, 4, EMBED)
    state = {}
    for t in range(4):
        attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
    keys = attn._get_input_buffer(state)["prev_key"]
    raw = attn.k_proj(x[:4]).view(4, 4, HEADS, -1).permute(1, 2, 0, 3)
    torch.testing.assert_close(keys, rotate(attn.position_encoding, raw))
    # Reorder the batch (as beam search does), then take one more step.
    order = torch.tensor([2, 2, 0, 1])
    attn.reorder_incremental_state(state, order)
    step_x, full_x = x[4:5, order], x[:, order]
    step, _ = attn(step_x, step_x, step_x, incremental_state=state, need_weights=False)
    full, _ = attn(full_x, full_x, full_x, attn_mask=causal_mask(5), need_weights=False)
    assert (step[0] - full[4]).abs().max() < 1e-5


def test_head_weights_shape():
    attn = rope_attention()
    x = torch.randn(4, 2, EMBED)
    _, weights = attn(x, x, x, need_head_weights=True)
    assert weights.shape == (HEADS, 2, 4, 4)


def test_unsupported_options_are_refused():
    with pytest.raises(ValueError, match="add_bias_kv"):
        PositionalMultiheadAttention(EMBED, HEADS, NoEncoding(), add_bias_kv=True)
    attn = rope_attention()
    x = torch.randn(3, 1, EMBED)
    with pytest.raises(ValueError, match="self-attention only"):
        attn(x, x, x, static_kv=True)


@pytest.mark.parametrize("which", ["key", "value", "both"])
def test_key_or_value_other_than_the_query_is_refused(which):
    """Self-attention only: a different key/value would otherwise be silently ignored."""
    attn = rope_attention()
    x, other = torch.randn(2, 5, 2, EMBED).unbind(0)
    key = other if which in ("key", "both") else x
    value = other if which in ("value", "both") else x
    with pytest.raises(ValueError, match=f"self-attention only.*{'key' if which != 'value' else 'value'}"):
        attn(x, key, value)
    # Same values in another tensor are refused too: only the query itself is accepted.
    with pytest.raises(ValueError, match="self-attention only"):
        attn(x, x.clone() if which != "value" else x, x.clone() if which != "key" else x)
    # A key of another length (encoder-decoder attention) as well.
    with pytest.raises(ValueError, match="self-attention only"):
        attn(x, torch.randn(7, 2, EMBED), torch.randn(7, 2, EMBED))


def test_query_as_key_and_value_as_fairseqs_layers_pass_them():
    """fairseq's encoder layer passes key=x, value=x; its decoder layer key=y, value=y
    with y = x; a query sliced the same way for each argument is the same tensor too."""
    attn = rope_attention()
    x = torch.randn(6, 2, EMBED)
    expected, _ = attn(x, x, x, need_weights=False)
    torch.testing.assert_close(attn(x, None, None, need_weights=False)[0], expected, atol=0, rtol=0)
    y = x
    torch.testing.assert_close(attn(query=x, key=y, value=y, need_weights=False)[0], expected, atol=0, rtol=0)
    # Decoding: each argument sliced separately (three views of the same memory) is the query
    # too; the steps compute the causal forward's first positions and cache both keys.
    state = {}
    steps = [attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)[0] for t in range(2)]
    full, _ = attn(x[:2], x[:2], x[:2], attn_mask=causal_mask(2), need_weights=False)
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps), reference(attn, x[:2], attn_mask=causal_mask(2)),
                               atol=1e-5, rtol=1e-5)
    assert attn._get_input_buffer(state)["prev_key"].shape == (2, HEADS, 2, EMBED // HEADS)


def test_fairseqs_encoder_and_decoder_layers_call_it_as_self_attention():
    """Through fairseq's own layers (their key/value arguments), training and decoding."""
    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

    cfg = TransformerConfig()
    for side in (cfg.encoder, cfg.decoder):
        side.embed_dim, side.ffn_embed_dim, side.attention_heads = EMBED, 2 * EMBED, HEADS
    encoder = TransformerEncoderLayerBase(cfg)
    encoder.self_attn = rope_attention()
    decoder = TransformerDecoderLayerBase(cfg, no_encoder_attn=True)
    decoder.self_attn = rope_attention()
    x = torch.randn(5, 2, EMBED)
    encoder.train()(x, encoder_padding_mask=padding([5, 3], 5)).sum().backward()
    decoder.eval()
    full, _, _ = decoder(x, self_attn_mask=causal_mask(5))
    state = {}
    steps = [decoder(x[t : t + 1], incremental_state=state)[0] for t in range(5)]
    assert (torch.cat(steps) - full).abs().max() < 1e-5


# --- Inference shortcuts: packed projections, masks and angles shared by the layers


def test_without_gradients_the_packed_projection_computes_what_training_computes():
    attn = rope_attention()
    x = torch.randn(6, 3, EMBED)
    kpm = padding([6, 4, 1], 6)
    with_grad, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)  # through _PackedLinear
    with torch.no_grad():
        packed, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)  # F.linear
    torch.testing.assert_close(packed, with_grad, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(packed, reference(attn, x, kpm), atol=1e-5, rtol=1e-5)


def test_training_through_the_packed_projection_gives_fairseqs_gradients():
    """One matmul for q, k and v in training: the output, the input's gradient and every
    parameter's gradient are those of fairseq's own attention (three projections) with the same
    weights; a second backward accumulates into them as autograd does."""
    stock = MultiheadAttention(EMBED, HEADS, self_attention=True)
    ours = PositionalMultiheadAttention(EMBED, HEADS, NoEncoding())
    ours.load_state_dict(stock.state_dict())
    assert ours._packed_projection() is not None
    x = torch.randn(5, 3, EMBED)
    grads = []
    for attn in (stock, ours):
        leaf = x.clone().requires_grad_()
        upstream = torch.randn(5, 3, EMBED, generator=torch.Generator().manual_seed(1))
        for _ in range(2):
            out, _ = attn(leaf, leaf, leaf, need_weights=False)
            out.backward(upstream)
        grads.append((out.detach(), leaf.grad, {n: p.grad for n, p in attn.named_parameters()}))
    (stock_out, stock_x, stock_params), (out, x_grad, params) = grads
    torch.testing.assert_close(out, stock_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x_grad, stock_x, atol=1e-5, rtol=1e-5)
    assert params.keys() == stock_params.keys() and len(params) == 8
    for name, grad in stock_params.items():
        torch.testing.assert_close(params[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_packing_changes_no_parameter_and_no_state_dict_key():
    attn = rope_attention()
    stock = MultiheadAttention(EMBED, HEADS, self_attention=True)
    assert list(attn.state_dict()) == list(stock.state_dict())
    attn.load_state_dict(stock.state_dict())  # in place: still packed
    weight, bias = attn._packed_projection()
    torch.testing.assert_close(weight, torch.cat([stock.q_proj.weight, stock.k_proj.weight, stock.v_proj.weight]))
    torch.testing.assert_close(bias, torch.cat([stock.q_proj.bias, stock.k_proj.bias, stock.v_proj.bias]))
    assert all(p.is_leaf and p.requires_grad for p in attn.parameters())


def lives_in_the_pack(attn: PositionalMultiheadAttention) -> bool:
    """The packed path is on and each q/k/v parameter is a row block of the packed tensors."""
    packed = attn._packed_projection()
    if packed is None:
        return False
    weight, bias = packed
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    return all(p.weight.data_ptr() == weight[i * attn.embed_dim].data_ptr()
               and p.bias.data_ptr() == bias[i * attn.embed_dim].data_ptr() for i, p in enumerate(projections))


def assign_a_new_parameter(attn):
    attn.k_proj.weight = torch.nn.Parameter(torch.randn(EMBED, EMBED))


def replace_a_projection(attn):
    attn.v_proj = torch.nn.Linear(EMBED, EMBED)


class Negated(torch.nn.Module):
    def forward(self, weight):
        return -weight


def parametrize_a_weight(attn):
    torch.nn.utils.parametrize.register_parametrization(attn.k_proj, "weight", Negated())  # deletes the parameter


def load_with_assign(attn):
    attn.load_state_dict({name: torch.randn_like(t) for name, t in attn.state_dict().items()}, assign=True)


def deep_copy(attn):
    copied = copy.deepcopy(attn)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(-0.5)  # in place: a copy still projecting with the pack it was copied with would not see it
    return copied


def to_double(attn):
    attn.double()


@pytest.mark.parametrize("change, repacked", [
    (assign_a_new_parameter, False), (replace_a_projection, False), (parametrize_a_weight, False),
    (load_with_assign, True), (deep_copy, True), (to_double, True),
])
def test_whatever_replaces_the_parameters_is_seen_without_a_check_per_forward(change, repacked):
    """No forward checks the packing: each way of giving the projections new tensors either drops
    the packed path (three projections) or repacks, and the output is that of the module's weights,
    in a whole pass and a decoding step."""
    attn = rope_attention()
    attn = change(attn) or attn
    assert lives_in_the_pack(attn) == repacked
    x = torch.randn(5, 2, EMBED, dtype=attn.q_proj.weight.dtype)
    with torch.no_grad():
        out, _ = attn(x, x, x, attn_mask=causal_mask(5), need_weights=False)
        expected = reference(attn, x, attn_mask=causal_mask(5))
        step, _ = attn(x[:1], x[:1], x[:1], incremental_state={}, need_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step, expected[:1], atol=1e-5, rtol=1e-5)


def test_in_place_changes_keep_the_pack():
    """fairseq loads checkpoints in place (``copy_``) and optimizers step in place: still packed,
    and projecting with the new values."""
    attn = rope_attention()
    attn.load_state_dict(rope_attention().state_dict())
    with torch.no_grad():
        attn.q_proj.weight.add_(1.0)
    assert lives_in_the_pack(attn)
    x = torch.randn(5, 2, EMBED)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, x, x, need_weights=False)[0], reference(attn, x), atol=1e-5, rtol=1e-5)


def test_the_shared_mask_follows_each_new_mask():
    """Layers of one pass share the additive mask; the next pass's masks are its own."""
    attn = rope_attention()
    x = torch.randn(6, 3, EMBED)
    for lengths in ([6, 4, 1], [2, 6, 5], [6, 6, 6]):
        kpm = padding(lengths, 6)
        for _ in range(2):  # a second layer of the same pass
            out, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask(6), need_weights=False)
            torch.testing.assert_close(out, reference(attn, x, kpm, causal_mask(6)), atol=1e-5, rtol=1e-5)


def test_decoding_without_gradients_leaves_nothing_that_breaks_training():
    """Without gradients the attention runs in inference mode; the masks and angles it
    shares between layers must not be inference tensors when training comes next."""
    attn = rope_attention().train()
    attn.dropout_module.p = 0.0
    x = torch.randn(6, 3, EMBED)
    kpm, mask = padding([6, 4, 1], 6), causal_mask(6)
    with torch.no_grad():
        decoded, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
    assert decoded.is_inference()  # fairseq only reads it
    trained, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
    trained.sum().backward()  # the same masks and positions, now with autograd
    assert attn.q_proj.weight.grad is not None
    torch.testing.assert_close(trained.detach(), decoded.clone(), atol=1e-6, rtol=1e-6)


# --- The lean beam-search step


def decode_steps(attn, x, orders=None, key_padding_mask=None):
    """Incremental steps over x (T, B, C), reordering the cache as beam search does."""
    state, outs = {}, []
    for t in range(x.size(0)):
        if t and orders is not None:
            attn.reorder_incremental_state(state, orders[t])
            x = x[:, orders[t]]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[orders[t]]
        kpm = None if key_padding_mask is None else key_padding_mask[:, t : t + 1]  # this step's key
        outs.append(attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], key_padding_mask=kpm,
                         incremental_state=state, need_weights=False)[0])
    return torch.cat(outs)


@pytest.mark.parametrize("rope_dim", [None, 4])
def test_steps_without_gradients_compute_what_steps_with_gradients_compute(rope_dim):
    """Without gradients a step's q and k are rotated by multipliers that carry 1/√d; with gradients
    through encode_qk and its backward. Both agree, through beam reorderings and padded keys."""
    attn = rope_attention(rope_dim=rope_dim)
    x = torch.randn(6, 4, EMBED)
    orders = [None] + [torch.randint(0, 4, (4,)) for _ in range(5)]
    kpm = padding([6, 6, 6, 6], 6)
    kpm[1, 1:3] = True  # padded keys (the first is not: an all-padded step is NaN on either path)
    with_gradients = decode_steps(attn, x, orders, kpm)
    with torch.no_grad():
        without = decode_steps(attn, x, orders, kpm)
    torch.testing.assert_close(without, with_gradients.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["rope", "rpe"])
def test_a_step_gives_the_full_pass_weights_and_output_at_its_position(encoding):
    """One path for every step: weights asked for, or an encoding with logit and value terms (RPE),
    give the full causal pass's row at the step's position."""
    from fairseq_rope.relative import RelativePositionEncoding

    attn = rope_attention() if encoding == "rope" else PositionalMultiheadAttention(
        EMBED, HEADS, RelativePositionEncoding(EMBED // HEADS, HEADS, 2))
    attn = attn.eval().double()
    x = torch.randn(5, 2, EMBED, dtype=torch.float64)
    with torch.no_grad():
        full, full_weights = attn(x, x, x, attn_mask=causal_mask(5).double(), need_weights=True)
        state = {}
        for t in range(5):
            out, weights = attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=True)
            torch.testing.assert_close(out[0], full[t], atol=1e-10, rtol=0)
            torch.testing.assert_close(weights[:, 0], full_weights[:, t, :t + 1], atol=1e-10, rtol=0)


# --- Attention dropout (the big architectures train with --attention-dropout 0.1)


def probability_probe(p: float) -> PositionalMultiheadAttention:
    """A RoPE attention whose output is its (dropped-out) attention probabilities: identity value
    and output projections, and inputs whose per-head slice is one-hot in the position."""
    attn = PositionalMultiheadAttention(EMBED, HEADS, RotaryEmbedding(EMBED // HEADS), dropout=p)
    with torch.no_grad():
        for projection in (attn.v_proj, attn.out_proj):
            projection.weight.copy_(torch.eye(EMBED))  # in place: the packed projection stays valid
            projection.bias.zero_()
    return attn


def one_hot_positions(batch: int):
    """(T, B, C) with T = head_dim: position t's slice of every head is the unit vector e_t."""
    T = EMBED // HEADS
    return torch.eye(T).repeat(1, HEADS)[:, None, :].expand(T, batch, EMBED).contiguous()


def probabilities(attn, x):
    """softmax(R q · R k / √d) as (T, B, C) like the probe's output: from the definitions, no dropout."""
    T, B, _ = x.shape
    heads = lambda t: t.view(T, B, HEADS, -1).permute(1, 2, 0, 3)  # noqa: E731
    encoding = attn.position_encoding
    logits = rotate(encoding, heads(attn.q_proj(x))) @ rotate(encoding, heads(attn.k_proj(x))).transpose(-1, -2)
    probs = torch.softmax(logits / attn.head_dim**0.5, -1)  # (B, H, T, S), S = T = head_dim
    return probs.permute(2, 0, 1, 3).reshape(T, B, EMBED)


@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_attention_dropout_drops_probabilities_in_training(path):
    """In training, p = 0.1 of the attention probabilities are zeroed and the rest scaled by
    1/(1 - p), through SDPA's dropout (need_weights=False) and the explicit softmax's alike;
    every forward draws a new mask."""
    p = 0.1
    attn = probability_probe(p).train()
    x = one_hot_positions(batch=16)
    expected = probabilities(attn, x).detach()
    assert expected.min() > 0  # no mask: every probability is there to be dropped
    outs = [attn(x, x, x, need_weights=path == "explicit")[0].detach() for _ in range(2)]
    for out in outs:
        dropped = out == 0
        rate = dropped.double().mean().item()
        assert 0.07 < rate < 0.13, f"{rate:.3f} of 4096 probabilities dropped, p = {p}"
        torch.testing.assert_close(out[~dropped], expected[~dropped] / (1 - p), atol=1e-6, rtol=1e-5)
    assert not torch.equal(outs[0] == 0, outs[1] == 0)


@pytest.mark.parametrize("grad", [True, False], ids=["with gradients", "without gradients"])
def test_attention_dropout_is_off_in_eval(grad):
    """In eval the module with attention dropout 0.1 computes exactly what the same weights
    without dropout compute, every time: the probabilities themselves."""
    attn = probability_probe(0.1).eval()
    without = probability_probe(0.0).eval()
    without.load_state_dict(attn.state_dict())
    x = one_hot_positions(batch=4)
    with torch.set_grad_enabled(grad):
        first, second = (attn(x, x, x, need_weights=False)[0] for _ in range(2))
        no_dropout = without(x, x, x, need_weights=False)[0]
    assert torch.equal(first, second) and torch.equal(first, no_dropout)
    torch.testing.assert_close(first, probabilities(attn, x).detach(), atol=1e-6, rtol=1e-5)
