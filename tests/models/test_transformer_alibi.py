"""transformer_alibi models (Press et al. 2022) built through fairseq's parser.

Exactness (incremental decoding, beam search, padding, half precision) is in
test_positional_transformer.py; the bias itself in tests/test_alibi.py."""

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_rope.alibi import AlibiBias, alibi_slopes
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_alibi import TransformerAlibiModel
from tests.conftest import build_model, parse_train_args
from tests.models.test_positional_transformer import tokens

count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731


@pytest.fixture(scope="module")
def tiny_alibi(dict_dir):
    model, task = build_model(dict_dir, "transformer_alibi_tiny", "--share-all-embeddings", "--dropout", "0")
    return model.eval(), task


@pytest.mark.parametrize("arch, stock, dims", [
    ("transformer_alibi", "transformer_wmt_en_de", (512, 8, 2048, 0.1)),
    ("transformer_alibi_wmt_en_de", "transformer_wmt_en_de", (512, 8, 2048, 0.1)),
    ("transformer_alibi_wmt_en_de_big", "transformer_wmt_en_de_big", (1024, 16, 4096, 0.3)),
    ("transformer_alibi_iwslt_de_en", "transformer_iwslt_de_en", (512, 4, 1024, 0.1)),
    ("transformer_alibi_tiny", "transformer_tiny", (64, 2, 64, 0.1)),
])
def test_architectures_mirror_the_stock_ones(dict_dir, arch, stock, dims):
    args, stock_args = parse_train_args(dict_dir, arch), parse_train_args(dict_dir, stock)
    got = (args.encoder_embed_dim, args.encoder_attention_heads, args.encoder_ffn_embed_dim, args.dropout)
    assert got == dims
    same = ("encoder_layers", "decoder_layers", "decoder_embed_dim", "decoder_attention_heads",
            "decoder_ffn_embed_dim", "attention_dropout", "activation_dropout")
    assert [getattr(args, name) for name in same] == [getattr(stock_args, name) for name in same]


def test_stock_parameter_count_alibi_everywhere_in_self_attention_nothing_in_cross_attention(dict_dir, tiny_alibi):
    model, _ = tiny_alibi
    stock, _ = build_model(dict_dir, "transformer_tiny", "--share-all-embeddings")
    assert isinstance(model, TransformerAlibiModel)
    assert count(model) == count(stock)  # no parameters, no position embeddings (stock's are sinusoidal)
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn, PositionalMultiheadAttention)
        encoding = layer.self_attn.position_encoding
        assert isinstance(encoding, AlibiBias) and encoding.slopes == alibi_slopes(2) == (2**-4, 2**-8)
    for layer in model.decoder.layers:
        assert type(layer.encoder_attn) is MultiheadAttention


def test_the_symmetric_encoder_cannot_tell_a_mirrored_input_only_the_final_eos_orients_it(tiny_alibi):
    """−m·|i − j| is symmetric: an encoder's output for a mirrored input is the mirror of its
    output, and cross-attention has no positions, so the decoder sees the same source. What
    breaks the symmetry in real inputs is the EOS that always ends them: words reversed
    before that EOS encode differently."""
    model, task = tiny_alibi
    src = tokens(task.source_dictionary, 2, 9, seed=7)
    lengths = torch.full((2,), 9)
    with torch.no_grad():
        out = model.encoder(src, lengths)["encoder_out"][0]
        mirrored = model.encoder(src.flip(1), lengths)["encoder_out"][0]
        torch.testing.assert_close(mirrored.flip(0), out, atol=1e-5, rtol=0)
        words_reversed = torch.cat((src[:, :-1].flip(1), src[:, -1:]), dim=1)  # EOS stays last
        other = model.encoder(words_reversed, lengths)["encoder_out"][0]
    assert (other[:-1].flip(0) - out[:-1]).abs().max() > 1e-2
