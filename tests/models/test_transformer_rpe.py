"""transformer_rpe models (the paper's RPE row) built through fairseq's parser."""

import pytest

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_rpe import TransformerRpeModel
from fairseq_rope.relative import RelativePositionEncoding
from tests.conftest import build_model


@pytest.fixture(scope="module")
def tiny_rpe(dict_dir):
    model, task = build_model(dict_dir, "transformer_rpe_tiny", "--share-all-embeddings", "--dropout", "0", "--rpe-max-distance", "4")
    return model.eval(), task


def test_base_has_stock_parameters_plus_relative_tables(dict_dir):
    rpe, _ = build_model(dict_dir, "transformer_rpe_wmt_en_de", "--share-all-embeddings")
    stock, _ = build_model(dict_dir, "transformer_wmt_en_de", "--share-all-embeddings")
    assert isinstance(rpe, TransformerRpeModel)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # 12 self-attention layers × (keys + values) × (2·16 + 1) distances × head dim 64
    assert count(rpe) - count(stock) == 12 * 2 * 33 * 64
    assert rpe.encoder.embed_positions is None and rpe.decoder.embed_positions is None


def test_every_self_attention_is_relative_with_the_given_k(tiny_rpe):
    model, _ = tiny_rpe
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn, PositionalMultiheadAttention)
        assert isinstance(layer.self_attn.position_encoding, RelativePositionEncoding)
        assert layer.self_attn.position_encoding.max_distance == 4
    assert not any(isinstance(m, RelativePositionEncoding) for layer in model.decoder.layers for m in layer.encoder_attn.modules())


def test_invalid_max_distance_fails_at_model_build(dict_dir):
    with pytest.raises(ValueError, match="--rpe-max-distance must be >= 1, got 0"):
        build_model(dict_dir, "transformer_rpe_tiny", "--rpe-max-distance", "0")
