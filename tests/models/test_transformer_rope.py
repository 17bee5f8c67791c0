"""transformer_rope models built through fairseq's parser: structure, exactness, errors."""

import pytest
import torch
from fairseq import search
from fairseq.models.transformer import TransformerModel
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_rope import TransformerRopeModel
from fairseq_rope.position_encoding import PositionEncoding
from tests.conftest import build_model, parse_train_args


def tokens(dictionary, batch, length, seed=0, pad_left=0):
    """Random real tokens ending in EOS; the first row left-padded by ``pad_left``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=g)
    x[:, -1] = dictionary.eos()
    if pad_left:
        x[0, :pad_left] = dictionary.pad()
    return x


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


def test_reversing_the_source_is_not_reversing_the_encoder_output(tiny):
    """Without position information the encoder would be permutation-equivariant."""
    model, task = tiny
    src = tokens(task.source_dictionary, 2, 9)
    lengths = torch.full((2,), 9)
    out = model.encoder(src, lengths)["encoder_out"][0]
    out_reversed = model.encoder(src.flip(1), lengths)["encoder_out"][0]
    assert (out_reversed.flip(0) - out).abs().max() > 1e-2
    # Control: the same check passes (equality) once positions are switched off.
    rotations = [layer.self_attn.position_encoding for layer in model.encoder.layers]
    for layer in model.encoder.layers:
        layer.self_attn.position_encoding = PositionEncoding()
    try:
        out = model.encoder(src, lengths)["encoder_out"][0]
        out_reversed = model.encoder(src.flip(1), lengths)["encoder_out"][0]
        assert (out_reversed.flip(0) - out).abs().max() < 1e-5
    finally:
        for layer, rotation in zip(model.encoder.layers, rotations):
            layer.self_attn.position_encoding = rotation


def test_incremental_decoding_equals_teacher_forced_forward(tiny):
    model, task = tiny
    d = task.target_dictionary
    src = tokens(d, 3, 11, seed=1, pad_left=4)
    src_lengths = src.ne(d.pad()).sum(1)
    prev = tokens(d, 3, 13, seed=2)
    prev[:, 0] = d.eos()
    full, _ = model(src, src_lengths, prev)
    encoder_out = model.encoder(src, src_lengths)
    state = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0] for t in range(prev.size(1))]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_left_padding_does_not_change_the_encoding(tiny):
    """RoPE is relative: a left-padded source encodes like the unpadded one."""
    model, task = tiny
    d = task.source_dictionary
    src = tokens(d, 1, 8, seed=3)
    padded = torch.cat([torch.full((1, 3), d.pad()), src], dim=1)
    out = model.encoder(src, torch.tensor([8]))["encoder_out"][0]
    out_padded = model.encoder(padded, torch.tensor([8]))["encoder_out"][0][3:]
    assert (out - out_padded).abs().max() < 1e-5


def test_beam_search_scores_equal_teacher_forced_rescoring(tiny):
    model, task = tiny
    d = task.target_dictionary
    src = tokens(d, 3, 10, seed=4, pad_left=3)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}
    generator = SequenceGenerator(
        [model], d, beam_size=4, len_penalty=0.6, max_len_a=0, max_len_b=12,
        search_strategy=search.BeamSearch(d),
    )
    hypotheses = generator.forward(sample)
    checked = 0
    for i, beam in enumerate(hypotheses):
        assert len(beam) == 4
        for hypo in beam:
            target = hypo["tokens"]
            prev = torch.cat([torch.tensor([d.eos()]), target[:-1]])[None]
            logits, _ = model(src[i : i + 1], sample["net_input"]["src_lengths"][i : i + 1], prev)
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)[0]
            rescored = lprobs.gather(-1, target[:, None]).squeeze(-1)
            assert (rescored - hypo["positional_scores"]).abs().max() < 1e-4
            checked += 1
    assert checked == 12


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--encoder-embed-dim", "66", "--decoder-embed-dim", "66"], "odd"),
        (["--rope-dim", "7"], "--rope-dim must be .* got 7"),
        (["--rope-dim", "0"], "--rope-dim must be .* got 0"),
        (["--rope-dim", "-2"], "--rope-dim must be .* got -2"),
        (["--rope-dim", "64"], r"--rope-dim must be an even number in \[2, head dim = 32\], got 64"),
        (["--rope-theta", "0"], "--rope-theta must be > 0, got 0"),
        (["--rope-theta", "-1"], "--rope-theta must be > 0, got -1"),
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
