"""The exported model computes what the fairseq model computes: encoder output and forced
decoding on padded batches of mixed lengths, for every row the exporter takes: RoPE in both
layouts with a partial --rope-dim, another theta and pre-norm, the stock sinusoidal and
learned rows, and RPE with tables shared by the heads. The reference is always fairseq's
own model (as fairseq-generate loads it), never the exporter's.

The positional trap: a CTranslate2 encoder spec without ``rotary_dim`` adds sinusoidal
positions, silently. The control test shows the encoder comparison catches exactly that.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fairseq_rope.deploy import spec as specs
from tests.deploy.conftest import ROWS as ROW_OPTIONS, TRAINED_BY_DEFAULT, one_thread

ALL_ROWS = tuple(ROW_OPTIONS)
#: fp32 rounding of tiny models (measured: about 1e-6).
TOLERANCE = 1e-4


def padded_test_batch(task, n: int = 16):
    """fairseq's collated batch of the first ``n`` test sentences: sources left-padded, targets
    right-padded, as fairseq-generate and fairseq-train batch them."""
    dataset = task.dataset("test")
    sample = dataset.collater([dataset[i] for i in range(n)])
    lengths = sample["net_input"]["src_lengths"]
    assert lengths.min() < lengths.max()  # mixed lengths: padding inside
    return sample


def ct2_encoder_output(model, args, task, tmp_path: Path, sources):
    """The encoder of the exporter's spec run by CTranslate2 (as an encoder-only model)."""
    import ctranslate2
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import transformer_spec

    spec = specs.build_spec(model, args, task)
    encoder = transformer_spec.TransformerEncoderModelSpec(spec.encoder)
    encoder.register_vocabulary(spec._vocabularies["source"][0])

    class EncoderOnly(Converter):
        def _load(self):
            return encoder

    EncoderOnly().convert(str(tmp_path / "encoder"), force=True)
    output = ctranslate2.Encoder(str(tmp_path / "encoder"), intra_threads=1).forward_batch(sources)
    return np.array(output.last_hidden_state)


def encoder_difference(model, args, task, tmp_path: Path) -> float:
    """Largest difference between fairseq's encoder output and CTranslate2's, on a padded batch."""
    sample = padded_test_batch(task)
    src_tokens, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    dictionary = task.source_dictionary
    sources = [[dictionary[t] for t in row[row.ne(dictionary.pad())].tolist()] for row in src_tokens]
    with torch.no_grad(), one_thread():
        expected = model.encoder(src_tokens, lengths)["encoder_out"][0].transpose(0, 1).numpy()
    got = ct2_encoder_output(model, args, task, tmp_path, sources)  # CTranslate2 pads on the right
    worst = 0.0
    for i, n in enumerate(lengths.tolist()):
        worst = max(worst, float(np.abs(got[i, :n] - expected[i, -n:]).max()))
    return worst


@pytest.mark.parametrize("row", ALL_ROWS)
def test_encoder_output_is_fairseqs(row, fairseq_model, tmp_path):
    model, task, args = fairseq_model(row, trained=row in TRAINED_BY_DEFAULT)
    assert encoder_difference(model, args, task, tmp_path) < TOLERANCE


@pytest.mark.parametrize("row", ALL_ROWS)
def test_forced_decoding_scores_are_fairseqs(row, fairseq_model, exported):
    """Log-probabilities of every reference token (and EOS) of a padded batch."""
    import ctranslate2

    trained = row in TRAINED_BY_DEFAULT
    model, task, _ = fairseq_model(row, trained)
    sample = padded_test_batch(task)
    with torch.no_grad(), one_thread():
        logits, _ = model(**sample["net_input"])
        lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    target = sample["target"]
    source_dict, target_dict = task.source_dictionary, task.target_dictionary
    sources = [[source_dict[t] for t in row[row.ne(source_dict.pad())][:-1].tolist()]
               for row in sample["net_input"]["src_tokens"]]
    targets = [[target_dict[t] for t in row[row.ne(target_dict.pad())][:-1].tolist()] for row in target]
    translator = ctranslate2.Translator(str(exported(row, trained=trained)), intra_threads=1)
    scored = translator.score_batch(sources, targets)
    for i, result in enumerate(scored):
        n = len(targets[i]) + 1  # and EOS
        expected = lprobs[i, :n].gather(-1, target[i, :n, None])[:, 0]
        assert len(result.log_probs) == n
        assert torch.allclose(torch.tensor(result.log_probs), expected, atol=TOLERANCE, rtol=0)


def test_rope_spec_rotates_in_both_encoder_and_decoder(fairseq_model):
    """What the exporter asks of CTranslate2 for the variant: half layout (not interleaved),
    16 of 32 dimensions, theta 500, on every self-attention of both sides."""
    model, task, args = fairseq_model("rope-variant")
    spec = specs.build_spec(model, args, task)
    for side in (spec.encoder, spec.decoder):
        for layer in side.layer:
            attention = layer.self_attention
            assert (int(attention.rotary_dim), attention.rotary_interleave, float(attention.rotary_base)) == (
                16, False, 500.0)
    assert spec.encoder.pre_norm and spec.decoder.pre_norm


def test_an_encoder_spec_without_rotary_dim_is_caught(fairseq_model, tmp_path, monkeypatch):
    """The control of the trap: CTranslate2 gives an encoder spec without ``rotary_dim``
    sinusoidal positions. The encoder comparison above fails then, and so does the export's
    own check, which leaves nothing behind."""
    from ctranslate2.specs import transformer_spec

    from fairseq_rope.deploy.export import export_checkpoint

    class WithoutRotary(transformer_spec.TransformerEncoderSpec):
        def __init__(self, *args, rotary_dim=None, rotary_interleave=True, rotary_base=10000.0, **kwargs):
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(transformer_spec, "TransformerEncoderSpec", WithoutRotary)
    model, task, args = fairseq_model("rope")
    assert encoder_difference(model, args, task, tmp_path) > 0.1
    out = tmp_path / "exported"
    with pytest.raises(specs.UnsupportedModelError, match="does not compute what the fairseq model computes"):
        export_checkpoint(_checkpoint(model, args, tmp_path), out, data_bin=args.data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "encoder"]


def _checkpoint(model, args, tmp_path: Path) -> Path:
    """The model saved as a minimal fairseq checkpoint (its args and weights)."""
    path = tmp_path / "checkpoint.pt"
    torch.save({"args": args, "model": model.state_dict()}, path)
    return path
