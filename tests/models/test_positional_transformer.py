"""Exactness shared by every position encoding inside self-attention (RoPE, each of
its scalings, RPE and ALiBi)."""

import copy
import os
import subprocess

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from fairseq_rope.models.positional_transformer import PositionalTransformerEncoder
from fairseq_rope.position_encoding import PositionEncoding
from tests.conftest import BIN_DIR, PLUGIN_DIR, build_model, parse_train_args


def tokens(dictionary, batch, length, seed=0, pad_left=0):
    """Random real tokens ending in EOS; the first row left-padded by ``pad_left``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=g)
    x[:, -1] = dictionary.eos()
    if pad_left:
        x[0, :pad_left] = dictionary.pad()
    return x


ROPE = "transformer_rope_tiny"
# The test sentences have 7 to 11 source tokens: the dynamic rows' L puts every one (4),
# or some (8), past it, each sentence of a batch at its own scale.
MODELS = {
    "rope": (ROPE,),
    "rpe": ("transformer_rpe_tiny", "--rpe-max-distance", "4"),  # short k: clipping happens
    "alibi": ("transformer_alibi_tiny",),
    "rope-linear": (ROPE, "--rope-scaling", "linear", "--rope-scaling-factor", "2"),
    "rope-ntk": (ROPE, "--rope-scaling", "ntk", "--rope-scaling-factor", "3"),
    "rope-yarn": (ROPE, "--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--rope-original-length", "8"),
    "rope-dynamic-linear": (ROPE, "--rope-scaling", "dynamic-linear", "--rope-original-length", "8",
                            "--rope-layout", "half"),
    "rope-dynamic-ntk": (ROPE, "--rope-scaling", "dynamic-ntk", "--rope-original-length", "4"),
    "rope-dynamic-yarn": (ROPE, "--rope-scaling", "dynamic-yarn", "--rope-scaling-factor", "2",
                          "--rope-original-length", "4"),
    # RoPE on one side, the other fairseq's own (sinusoidal embeddings): the rope_enc and rope_dec rows.
    "rope-encoder-only": (ROPE, "--rope-sides", "encoder"),
    "rope-decoder-only": (ROPE, "--rope-sides", "decoder", "--rope-scaling", "dynamic-ntk",
                          "--rope-original-length", "4"),
}


@pytest.fixture(scope="module", params=list(MODELS.values()), ids=list(MODELS))
def tiny_model(request, dict_dir):
    model, task = build_model(dict_dir, *request.param, "--share-all-embeddings", "--dropout", "0")
    return model.eval(), task


def test_permuting_the_source_is_not_permuting_the_encoder_output(tiny_model):
    """Without position information the encoder would be permutation-equivariant. (Not a
    reversal: ALiBi's symmetric encoder is equivariant under that one, test_transformer_alibi.py.)"""
    model, task = tiny_model
    src = tokens(task.source_dictionary, 2, 9)
    lengths = torch.full((2,), 9)
    order = torch.tensor([3, 0, 7, 1, 8, 5, 2, 6, 4])
    out = model.encoder(src, lengths)["encoder_out"][0]
    out_permuted = model.encoder(src[:, order], lengths)["encoder_out"][0]
    assert (out_permuted - out[order]).abs().max() > 1e-2
    if not isinstance(model.encoder, PositionalTransformerEncoder):
        return  # fairseq's own encoder (--rope-sides decoder): its positions are added embeddings
    # Control: the same check passes (equality) once positions are switched off.
    encodings = [layer.self_attn.position_encoding for layer in model.encoder.layers]
    for layer in model.encoder.layers:
        layer.self_attn.position_encoding = PositionEncoding()
    try:
        out = model.encoder(src, lengths)["encoder_out"][0]
        out_permuted = model.encoder(src[:, order], lengths)["encoder_out"][0]
        assert (out_permuted - out[order]).abs().max() < 1e-5
    finally:
        for layer, encoding in zip(model.encoder.layers, encodings):
            layer.self_attn.position_encoding = encoding

def test_incremental_decoding_equals_teacher_forced_forward(tiny_model):
    model, task = tiny_model
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

def test_left_padding_changes_neither_the_encoding_nor_the_translation(tiny_model):
    """The encodings are relative: a left-padded source encodes like the unpadded one, and the
    decoder (which a dynamic RoPE scaling gives the source length) predicts the same."""
    model, task = tiny_model
    d = task.source_dictionary
    src = tokens(d, 1, 8, seed=3)
    padded = torch.cat([torch.full((1, 3), d.pad()), src], dim=1)
    out = model.encoder(src, torch.tensor([8]))["encoder_out"][0]
    out_padded = model.encoder(padded, torch.tensor([8]))["encoder_out"][0][3:]
    assert (out - out_padded).abs().max() < 1e-5
    prev = tokens(d, 1, 6, seed=4)
    prev[:, 0] = d.eos()
    logits, logits_padded = (model(s, torch.tensor([8]), prev)[0] for s in (src, padded))
    assert (logits - logits_padded).abs().max() < 1e-5

def test_beam_search_scores_equal_teacher_forced_rescoring(tiny_model):
    model, task = tiny_model
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
            # The hypothesis score beam search ranks by: fairseq's length normalisation,
            # Σ log p over the tokens (EOS included) / length^lenpen (EOS counted).
            assert target[-1] == d.eos() and d.eos() not in target[:-1]
            expected = rescored.double().sum() / len(target) ** 0.6
            assert abs(float(hypo["score"]) - float(expected)) < 1e-4
            checked += 1
    assert checked == 12


def outputs(model, dict_dir):
    """The model's teacher-forced logits on two fixed sentences (one left-padded) of dict_dir's words."""
    from fairseq.data import Dictionary

    d = Dictionary.load(str(dict_dir / "dict.en.txt"))
    src = tokens(d, 2, 9, seed=5, pad_left=2)
    prev = tokens(d, 2, 7, seed=6)
    with torch.no_grad():
        return model(src, src.ne(d.pad()).sum(1), prev)[0]


def decode_both_ways(model, src, prev):
    """The decoder's logits teacher-forced in one forward, and step by step from an incremental
    state, both without gradients as fairseq's beam search runs them."""
    d = model.decoder.dictionary
    src_lengths = src.ne(d.pad()).sum(1)
    with torch.no_grad():
        full, _ = model(src, src_lengths, prev)
        encoder_out = model.encoder(src, src_lengths)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0] for t in range(prev.size(1))]
    return full, torch.cat(steps, dim=1)


def rms(t):
    return t.double().pow(2).mean().sqrt().item()


HALF_PRECISION_ROWS = {
    "rope": ("transformer_rope_tiny",),
    "rope-half-layout": ("transformer_rope_tiny", "--rope-layout", "half"),
    "rpe": ("transformer_rpe_tiny", "--rpe-max-distance", "4"),
    "alibi": MODELS["alibi"],
    "rope-yarn": MODELS["rope-yarn"],  # the lean step's scaled table, 1/t folded into q's scaling
    "rope-dynamic-yarn": MODELS["rope-dynamic-yarn"],  # each sentence's angles, 1/t on q
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("row", HALF_PRECISION_ROWS)
def test_half_precision_incremental_decoding_equals_teacher_forced_forward(dict_dir, row, dtype):
    """In fp16 and bf16 (on CPU), beam search's incremental steps (the lean step for RoPE) give the
    teacher-forced forward's logits, and both stay close to the model's own forward in fp64: each
    error (RMS over the logits) at most twice what fairseq's stock sinusoidal transformer_tiny
    makes on the same tokens in the same dtype (measured: 0.9 to 1.2 times)."""
    errors = {}
    for name, arch in (("ours", HALF_PRECISION_ROWS[row]), ("stock", ("transformer_tiny",))):
        model, task = build_model(dict_dir, *arch, "--share-all-embeddings", "--dropout", "0")
        d = task.target_dictionary
        src = tokens(d, 3, 11, seed=1, pad_left=4)
        prev = tokens(d, 3, 13, seed=2)
        prev[:, 0] = d.eos()
        full64, steps64 = decode_both_ways(copy.deepcopy(model).double().eval(), src, prev)
        full, steps = decode_both_ways(copy.deepcopy(model).to(dtype).eval(), src, prev)
        assert full.dtype == steps.dtype == dtype
        if name == "ours":  # exact in fp64 (the stock model's sinusoids are computed in fp32)
            assert (steps64 - full64).abs().max() < 1e-9
        errors[name] = {"steps vs forward": rms(steps - full), "forward vs fp64": rms(full - full64),
                        "steps vs fp64": rms(steps - full64)}
    for what, stock_error in errors["stock"].items():
        assert 0 < errors["ours"][what] <= 2 * stock_error, (what, errors)


@pytest.mark.parametrize("arch, option, value", [
    ("transformer_rope_tiny", "--rope-dim", "7"),
    ("transformer_rpe_tiny", "--rpe-max-distance", "0"),
], ids=["rope", "rpe"])
def test_invalid_option_through_fairseq_train_exits_non_zero_naming_it(dict_dir, tmp_path, arch, option, value):
    """The checks of tests/models/test_transformer_{rope,rpe}.py (exact messages), through the real command line."""
    save = tmp_path / "save"
    result = subprocess.run(
        [str(BIN_DIR / "fairseq-train"), str(dict_dir), "--user-dir", str(PLUGIN_DIR), "--arch", arch,
         option, value, "--cpu", "--source-lang", "en", "--target-lang", "de", "--max-tokens", "100",
         "--save-dir", str(save)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"ValueError: {option} must be") and error.endswith(f"got {value}")
    assert not save.exists()  # refused while parsing, before fairseq-train creates --save-dir


XFORMERS_CONFIG = '{"name": "scaled_dot_product"}'


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("arch", ["transformer_rope_tiny", "transformer_rpe_tiny", "transformer_alibi_tiny"])
def test_xformers_attention_config_is_refused_not_ignored(dict_dir, arch, side):
    """fairseq hands --{side}-xformers-att-config to its own attention only: our
    self-attention would silently ignore it. Refused while parsing, and when building
    from args that bypass the parser (a hand-edited checkpoint, --model-overrides)."""
    from fairseq import tasks

    option = f"--{side}-xformers-att-config"
    message = f"^{option} is not supported: RoPE/RPE/ALiBi self-attention does not support xformers"
    with pytest.raises(ValueError, match=message):
        parse_train_args(dict_dir, arch, option, XFORMERS_CONFIG)
    args = parse_train_args(dict_dir, arch)
    setattr(args, f"{side}_xformers_att_config", XFORMERS_CONFIG)
    with pytest.raises(ValueError, match=message):
        tasks.setup_task(args).build_model(args)
