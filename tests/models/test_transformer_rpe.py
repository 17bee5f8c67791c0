"""transformer_rpe models (the paper's RPE row) built through fairseq's parser.

Shaw et al. §4.1: the base model used k = 16 and tables per layer and head,
the big model k = 8 and tables per layer (shared by the heads)."""

import pytest
import torch

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_rpe import TransformerRpeModel
from fairseq_rope.relative import RelativePositionEncoding
from tests.conftest import build_model, load_checkpoint, parse_train_args, save_like_fairseq_train
from tests.models import test_positional_transformer as exactness

TINY = ("--share-all-embeddings", "--dropout", "0", "--rpe-max-distance", "4")
count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731


def encodings(model):
    return [layer.self_attn.position_encoding for layer in [*model.encoder.layers, *model.decoder.layers]]


@pytest.fixture(scope="module")
def tiny_rpe(dict_dir):
    model, task = build_model(dict_dir, "transformer_rpe_tiny", *TINY)
    return model.eval(), task


@pytest.fixture(scope="module")
def tiny_rpe_shared(dict_dir):
    model, task = build_model(dict_dir, "transformer_rpe_tiny", *TINY, "--rpe-shared-heads")
    return model.eval(), task


def test_base_has_stock_parameters_plus_relative_tables_per_layer_and_head(dict_dir):
    rpe, _ = build_model(dict_dir, "transformer_rpe_wmt_en_de", "--share-all-embeddings")
    stock, _ = build_model(dict_dir, "transformer_wmt_en_de", "--share-all-embeddings")
    assert isinstance(rpe, TransformerRpeModel)
    # 12 self-attention layers × (keys + values) × 8 heads × (2·16 + 1) distances × head dim 64
    assert count(rpe) - count(stock) == 12 * 2 * 8 * 33 * 64
    assert rpe.encoder.embed_positions is None and rpe.decoder.embed_positions is None


def test_shared_heads_have_one_table_per_layer_h_times_fewer_parameters(tiny_rpe, tiny_rpe_shared):
    (per_head, _), (shared, _) = tiny_rpe, tiny_rpe_shared
    heads = per_head.encoder.layers[0].self_attn.num_heads
    assert heads > 1
    relative = lambda m: sum(count(e) for e in encodings(m))  # noqa: E731
    assert relative(per_head) == heads * relative(shared)
    assert count(per_head) - count(shared) == (heads - 1) * relative(shared)
    for enc in encodings(shared):
        assert enc.shared_heads and enc.key_embeddings.weight.shape == (9, enc.head_dim)
    for enc in encodings(per_head):
        assert not enc.shared_heads and enc.key_embeddings.weight.shape == (heads, 9, enc.head_dim)


@pytest.mark.parametrize("arch, extra, expected", [
    ("transformer_rpe", (), (16, False)),
    ("transformer_rpe_wmt_en_de", (), (16, False)),
    ("transformer_rpe_tiny", (), (16, False)),
    ("transformer_rpe_wmt_en_de_big", (), (8, True)),
    ("transformer_rpe_tiny", ("--rpe-shared-heads",), (16, True)),
    ("transformer_rpe_wmt_en_de", ("--rpe-shared-heads", "--rpe-max-distance", "8"), (8, True)),
    ("transformer_rpe_wmt_en_de_big", ("--no-rpe-shared-heads", "--rpe-max-distance", "16"), (16, False)),
])
def test_architecture_defaults_follow_the_paper_and_the_command_line_overrides_them(dict_dir, arch, extra, expected):
    args = parse_train_args(dict_dir, arch, *extra)
    assert (args.rpe_max_distance, args.rpe_shared_heads) == expected


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


# The exactness checks of tests/models/test_positional_transformer.py (run there
# for the default, per-head tables), for tables shared by the heads.
@pytest.mark.parametrize("check", [
    exactness.test_incremental_decoding_equals_teacher_forced_forward,
    exactness.test_beam_search_scores_equal_teacher_forced_rescoring,
    exactness.test_left_padding_changes_neither_the_encoding_nor_the_translation,
], ids=lambda f: f.__name__[len("test_"):])
def test_shared_heads_are_exact_too(check, tiny_rpe_shared):
    check(tiny_rpe_shared)


# ------------------------------------------------------------------ checkpoints


def save_rpe(dict_dir, path, *extra):
    return save_like_fairseq_train(dict_dir, path, "transformer_rpe_tiny", *TINY, *extra)


@pytest.mark.parametrize("flag, shared", [((), False), (("--rpe-shared-heads",), True)])
def test_the_option_is_stored_in_the_checkpoint_and_rebuilds_the_same_model(dict_dir, tmp_path, flag, shared):
    saved = save_rpe(dict_dir, tmp_path / "checkpoint.pt", *flag)
    loaded, cfg = load_checkpoint(tmp_path / "checkpoint.pt")
    assert cfg.model.rpe_shared_heads is shared
    assert all(enc.shared_heads is shared for enc in encodings(loaded))
    assert torch.equal(exactness.outputs(loaded, dict_dir), exactness.outputs(saved, dict_dir))


def test_checkpoint_from_before_per_head_tables_loads_with_identical_outputs(dict_dir, tmp_path):
    """Such a checkpoint: tables shared by the heads, no ``rpe_shared_heads`` in its args."""
    path = tmp_path / "checkpoint.pt"
    saved = save_rpe(dict_dir, path, "--rpe-shared-heads")
    state = torch.load(path, weights_only=True)
    del state["cfg"]["model"].rpe_shared_heads
    torch.save(state, path)

    with pytest.warns(UserWarning, match="copied to every head"):
        loaded, cfg = load_checkpoint(path)
    assert cfg.model.rpe_shared_heads is False  # the default model: per layer and head
    heads = loaded.encoder.layers[0].self_attn.num_heads
    assert encodings(loaded)[0].key_embeddings.weight.shape == (heads, 9, encodings(saved)[0].head_dim)
    torch.testing.assert_close(exactness.outputs(loaded, dict_dir), exactness.outputs(saved, dict_dir), atol=1e-6, rtol=1e-6)
