"""transformer_rope models built through fairseq's parser: structure, options, errors.

Exactness (incremental decoding, beam search, padding) is in test_positional_transformer.py."""

import pytest
from fairseq.models.transformer import TransformerModel
from fairseq.modules import MultiheadAttention

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_rope import TransformerRopeModel
from tests.conftest import build_model, parse_train_args


@pytest.fixture(scope="module")
def tiny(dict_dir):
    model, task = build_model(dict_dir, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0")
    return model.eval(), task


def test_architectures_register_and_base_has_stock_parameter_count(dict_dir):
    rope, _ = build_model(dict_dir, "transformer_rope_wmt_en_de", "--share-all-embeddings")
    stock, _ = build_model(dict_dir, "transformer_wmt_en_de", "--share-all-embeddings")
    assert isinstance(rope, TransformerRopeModel)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(rope) == count(stock)
    layer = rope.encoder.layers[0]
    assert (len(rope.encoder.layers), layer.embed_dim, layer.fc1.out_features) == (6, 512, 2048)
    assert layer.self_attn.num_heads == 8 and layer.dropout_module.p == 0.1
    for arch, (dim, heads) in {
        "transformer_rope_wmt_en_de_big": (1024, 16),
        "transformer_rope_iwslt_de_en": (512, 4),
        "transformer_rope_tiny": (64, 2),
    }.items():
        args = parse_train_args(dict_dir, arch)
        assert (args.encoder_embed_dim, args.encoder_attention_heads) == (dim, heads), arch


def test_self_attention_rotates_cross_attention_does_not_and_no_position_embeddings(tiny):
    model, _ = tiny
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
    assert not [n for n, _ in model.named_parameters() if "embed_positions" in n]
    for layer in model.encoder.layers:
        assert isinstance(layer.self_attn, PositionalMultiheadAttention)
    for layer in model.decoder.layers:
        assert isinstance(layer.self_attn, PositionalMultiheadAttention)
        assert type(layer.encoder_attn) is MultiheadAttention


def test_rope_options_reach_every_layer(dict_dir):
    model, _ = build_model(
        dict_dir, "transformer_rope_tiny", "--rope-theta", "500", "--rope-dim", "16", "--rope-layout", "half"
    )
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        enc = layer.self_attn.position_encoding
        assert (enc.theta, enc.rope_dim, enc.layout, enc.head_dim) == (500.0, 16, "half", 32)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--encoder-embed-dim", "66", "--decoder-embed-dim", "66"], "odd"),
        (["--rope-dim", "7"], "--rope-dim must be .* got 7"),
        (["--rope-dim", "0"], "--rope-dim must be .* got 0"),
        (["--rope-dim", "-2"], "--rope-dim must be .* got -2"),
        (["--rope-dim", "64"], r"--rope-dim must be an even number in \[2, head dim = 32\], got 64"),
        (["--rope-theta", "0"], "--rope-theta must be a finite number > 0, got 0"),
        (["--rope-theta", "-1"], "--rope-theta must be a finite number > 0, got -1"),
    ],
)
def test_invalid_options_fail_at_model_build(dict_dir, extra, message):
    with pytest.raises(ValueError, match=message):
        build_model(dict_dir, "transformer_rope_tiny", *extra)


def test_unknown_layout_is_refused_by_the_parser_and_at_build(dict_dir, capsys):
    with pytest.raises(SystemExit):
        parse_train_args(dict_dir, "transformer_rope_tiny", "--rope-layout", "diagonal")
    assert "--rope-layout" in capsys.readouterr().err
    from fairseq import tasks

    args = parse_train_args(dict_dir, "transformer_rope_tiny")
    args.rope_layout = "diagonal"  # e.g. a hand-edited checkpoint or hub override
    with pytest.raises(ValueError, match="--rope-layout must be one of interleaved, half, got 'diagonal'"):
        tasks.setup_task(args).build_model(args)


def test_stock_transformer_is_untouched_by_the_plugin(dict_dir):
    stock, _ = build_model(dict_dir, "transformer_tiny")
    assert type(stock) is TransformerModel
    assert stock.encoder.embed_positions is not None
    assert type(stock.encoder.layers[0].self_attn) is MultiheadAttention


def test_attention_dropout_reaches_the_rotated_self_attention_in_training_only(dict_dir):
    """--attention-dropout (0.1 in the big architectures) reaches every rotated self-attention, whose
    training forward (fairseq's layers ask for no weights: the fused path) applies it; in eval the
    model is deterministic. All other dropout is off, cross-attention's too, so only it can differ."""
    import torch

    model, task = build_model(dict_dir, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0",
                              "--attention-dropout", "0.1")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert layer.self_attn.dropout_module.p == 0.1
    for layer in model.decoder.layers:
        layer.encoder_attn.dropout_module.p = 0.0
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (4, 9))
    src[:, -1] = d.eos()
    prev = torch.cat([torch.full((4, 1), d.eos()), src[:, :-1]], dim=1)
    lengths = torch.full((4,), 9)

    def forward():
        return model(src, lengths, prev)[0].detach()

    model.train()
    first, second = forward(), forward()
    assert (first - second).abs().max().item() > 1e-3, "two training forwards gave the same output"
    model.eval()
    evaluated = forward()
    assert torch.equal(evaluated, forward())
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.self_attn.dropout_module.p = 0.0
    assert torch.equal(evaluated, forward())  # eval with dropout 0.1 is the dropout-free model
