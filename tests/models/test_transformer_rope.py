"""transformer_rope models built through fairseq's parser: structure, options, errors.

Exactness (incremental decoding, beam search, padding) is in test_positional_transformer.py."""

import ast

import pytest
import torch
from fairseq.models.transformer import TransformerModel
from fairseq.modules import MultiheadAttention

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.models.transformer_rope import TransformerRopeModel
from tests.conftest import PLUGIN_DIR, build_model, fairseq_cli, load_checkpoint, parse_train_args, save_like_fairseq_train
from tests.models import test_positional_transformer as exactness


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


# ------------------------------------------------------------------ scaling (issue 28)

SCALING_OPTIONS = ("rope_scaling", "rope_scaling_factor", "rope_original_length")
SCALED_OVERRIDES = "{'rope_scaling': 'dynamic-ntk', 'rope_original_length': 4}"  # as README shows it


def as_flags(overrides: dict) -> list:
    return [item for name, value in overrides.items() for item in ("--" + name.replace("_", "-"), str(value))]


def scalings(model) -> set:
    return {layer.self_attn.position_encoding.scaling for layer in [*model.encoder.layers, *model.decoder.layers]}


def old_checkpoint(dict_dir, path):
    """A checkpoint from before the scaling options: none of them in its args."""
    saved = save_like_fairseq_train(dict_dir, path, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0")
    state = torch.load(path, weights_only=True)
    for name in SCALING_OPTIONS:
        delattr(state["cfg"]["model"], name)
    torch.save(state, path)
    return saved


def test_checkpoint_from_before_scaling_loads_unscaled_with_identical_outputs(dict_dir, tmp_path):
    saved = old_checkpoint(dict_dir, tmp_path / "checkpoint.pt")
    loaded, cfg = load_checkpoint(tmp_path / "checkpoint.pt")
    assert (cfg.model.rope_scaling, cfg.model.rope_scaling_factor, cfg.model.rope_original_length) == ("none", None, None)
    assert scalings(loaded) == {None}
    assert torch.equal(exactness.outputs(loaded, dict_dir), exactness.outputs(saved, dict_dir))


@pytest.mark.parametrize("overrides", [
    {"rope_scaling": "linear", "rope_scaling_factor": 2.0},
    {"rope_scaling": "dynamic-yarn", "rope_scaling_factor": 2, "rope_original_length": 4},
], ids=["linear", "dynamic-yarn"])
def test_scaling_set_when_decoding_an_existing_checkpoint(dict_dir, tmp_path, overrides):
    """fairseq-generate's --model-overrides (fairseq's load_model_ensemble_and_task, here called
    as fairseq-generate calls it) and the hub's from_pretrained keywords: the loaded model is
    the model built with those options, with the checkpoint's weights."""
    from fairseq_rope.rope_scaling import RopeScaling

    saved = old_checkpoint(dict_dir, tmp_path / "checkpoint.pt")
    built, _ = build_model(dict_dir, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0",
                           *as_flags(overrides))
    built.load_state_dict(saved.state_dict())
    expected = RopeScaling.from_options(*(overrides.get(name) for name in SCALING_OPTIONS))
    hub = TransformerRopeModel.from_pretrained(str(tmp_path), "checkpoint.pt", str(dict_dir), **overrides)
    for loaded in (load_checkpoint(tmp_path / "checkpoint.pt", **overrides)[0], hub.models[0]):
        loaded.eval()
        assert scalings(loaded) == {expected}
        assert torch.equal(exactness.outputs(loaded, dict_dir), exactness.outputs(built.eval(), dict_dir))
    assert not torch.allclose(exactness.outputs(built, dict_dir), exactness.outputs(saved, dict_dir))


def test_an_invalid_scaling_override_is_refused_at_load_naming_the_option(dict_dir, tmp_path):
    old_checkpoint(dict_dir, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="^--rope-scaling yarn needs --rope-original-length L"):
        load_checkpoint(tmp_path / "checkpoint.pt", rope_scaling="yarn", rope_scaling_factor=2.0)


def test_fairseq_generate_takes_the_scaling_as_a_model_override(toy_data_bin, tmp_path):
    """README's command line: fairseq-generate translates every test sentence, batched, with the
    overridden model — each printed positional score is what the checkpoint loaded with that
    override gives the hypothesis alone (forced rescoring), and not what the unscaled one does."""
    import math

    from fairseq.data import Dictionary

    path = tmp_path / "checkpoint.pt"
    plain = save_like_fairseq_train(toy_data_bin, path, "transformer_rope_tiny", "--share-all-embeddings")
    out = fairseq_cli("fairseq-generate", [
        toy_data_bin, "--user-dir", PLUGIN_DIR, "--path", path, "--cpu", "--beam", "2", "--max-len-b", "4",
        "--batch-size", "16", "--required-batch-size-multiple", "1", "--model-overrides", SCALED_OVERRIDES,
    ]).stdout
    lines = {tuple(line.split("\t", 1)[0].split("-", 1)): line.split("\t") for line in out.splitlines()
             if line[:2] in ("S-", "H-", "P-")}
    ids = sorted({int(i) for kind, i in lines if kind == "S"})
    assert len(ids) == 40
    scaled, _ = load_checkpoint(path, **ast.literal_eval(SCALED_OVERRIDES))
    d = Dictionary.load(str(toy_data_bin / "dict.en.txt"))
    worst, plain_worst = 0.0, 0.0
    for i in ids:
        src = d.encode_line(lines["S", str(i)][1], add_if_not_exist=False)[None]
        hypothesis = d.encode_line(lines["H", str(i)][2], add_if_not_exist=False)
        printed = torch.tensor([float(x) for x in lines["P", str(i)][1].split()])
        prev = torch.cat((hypothesis[-1:], hypothesis[:-1]))[None]  # EOS first
        for model in (scaled, plain):
            with torch.no_grad():
                lprobs = model.get_normalized_probs(model(src, torch.tensor([src.size(1)]), prev), log_probs=True)
            error = (lprobs[0].gather(-1, hypothesis[:, None])[:, 0] / math.log(2) - printed).abs().max().item()
            if model is scaled:
                worst = max(worst, error)
            else:
                plain_worst = max(plain_worst, error)
    assert worst < 1e-3  # printed to 4 decimals
    assert plain_worst > 1e-2


def test_a_scaled_model_trains(dict_dir):
    """--rope-scaling at training time: gradients through each sentence's rotation reach every
    projection (dynamic-yarn: per-sentence angles and temperature)."""
    model, task = build_model(dict_dir, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0",
                              "--rope-scaling", "dynamic-yarn", "--rope-original-length", "4")
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (3, 8))
    src[:, -1] = d.eos()
    model.train()
    model(src, torch.full((3,), 8), src)[0].logsumexp(-1).mean().backward()
    grads = [layer.self_attn.q_proj.weight.grad for layer in [*model.encoder.layers, *model.decoder.layers]]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("options", [
    ("--rope-scaling", "none"),
    ("--rope-scaling", "linear", "--rope-scaling-factor", "1"),
    ("--rope-scaling", "ntk", "--rope-scaling-factor", "1"),
], ids=["none", "linear-1", "ntk-1"])
def test_no_scaling_is_bit_identical_to_a_model_built_without_the_options(dict_dir, tiny, options):
    """Teacher-forced and step by step (beam search's lean steps): the same bits. A scale of 1
    gives θ_i exactly, so linear and ntk at S = 1 (their own tables) do too."""
    model, task = tiny
    other, _ = build_model(dict_dir, "transformer_rope_tiny", "--share-all-embeddings", "--dropout", "0", *options)
    other.load_state_dict(model.state_dict())
    d = task.target_dictionary
    src = exactness.tokens(d, 3, 11, seed=1, pad_left=4)
    prev = exactness.tokens(d, 3, 13, seed=2)
    for got, expected in zip(exactness.decode_both_ways(other.eval(), src, prev),
                             exactness.decode_both_ways(model, src, prev)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_rope_on_one_side_has_stock_parameters_and_the_other_side_is_fairseqs(dict_dir, side):
    """--rope-sides: the rope_enc and rope_dec ablation rows. The RoPE side rotates and adds no
    embedding; the other is fairseq's own encoder or decoder, sinusoidal embeddings and its own
    self-attention; the parameters are the stock Transformer's, name for name. (Incremental
    decoding and beam search: tests/models/test_positional_transformer.py, *-only rows.)"""
    from fairseq.models.transformer import TransformerDecoder, TransformerEncoder
    from fairseq.modules import SinusoidalPositionalEmbedding

    from fairseq_rope.attention import PositionalMultiheadAttention

    model, _ = build_model(dict_dir, "transformer_rope_tiny", "--rope-sides", side)
    stock, _ = build_model(dict_dir, "transformer_tiny")
    other = "decoder" if side == "encoder" else "encoder"
    rotating, plain = getattr(model, side), getattr(model, other)
    assert rotating.embed_positions is None
    assert all(isinstance(layer.self_attn, PositionalMultiheadAttention) for layer in rotating.layers)
    assert type(plain) in (TransformerEncoder, TransformerDecoder)
    assert isinstance(plain.embed_positions, SinusoidalPositionalEmbedding)
    assert not any(isinstance(m, PositionalMultiheadAttention) for m in plain.modules())
    assert {n: p.shape for n, p in model.named_parameters()} == {n: p.shape for n, p in stock.named_parameters()}
