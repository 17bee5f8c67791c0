"""fairseq-rope-export-ct2: what a model directory holds, and every refusal: a clear error and
nothing written (no OUT_DIR, no temporary directory beside it)."""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import shutil
from pathlib import Path

import pytest
import torch

from fairseq_rope.checkpoints import UnsafeCheckpointError, load_checkpoint
from fairseq_rope.deploy import DeployError
from fairseq_rope.deploy import spec as specs
from fairseq_rope.deploy.export import export_checkpoint, main
from fairseq_rope.models.architectures import EncodingOptions, Option
from fairseq_rope.models.transformer_rope import ROPE_OPTIONS
from fairseq_rope_serve.model_dir import CONFIG, ModelDirectory
from tests.deploy.conftest import ROWS, train


def nothing_written(parent: Path, before) -> bool:
    return sorted(p.name for p in parent.iterdir()) == before


def write_checkpoint(path: Path, state, **model_options) -> Path:
    """``state`` with its model options changed (cfg.model as fairseq-train saves them)."""
    state = copy.deepcopy(state)
    for name, value in model_options.items():
        setattr(state["cfg"]["model"], name, value)
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def rope_state(trained):
    return load_checkpoint(trained("rope"))


def refused(tmp_path: Path, checkpoint, error=DeployError, match=None, **kwargs):
    """Export ``checkpoint`` to tmp_path/out, expecting ``error``; nothing may appear in tmp_path."""
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=match) as info:
        export_checkpoint(checkpoint, tmp_path / "out", **kwargs)
    assert nothing_written(tmp_path, before)
    return str(info.value)


def test_model_directory_is_self_contained(exported, deploy_data):
    """Dictionaries, BPE codes (found at DATA/bpe/codes) and the text settings beside the model;
    the data directory came from the checkpoint itself."""
    model_dir = exported("rope")
    settings = ModelDirectory.read(model_dir)
    assert (settings.source_lang, settings.target_lang, settings.family) == ("en", "de", "transformer_rope")
    for name in ("dict.en.txt", "dict.de.txt"):
        assert (model_dir / name).read_bytes() == (deploy_data / "data-bin" / name).read_bytes()
    assert settings.codes_path(model_dir).read_bytes() == (deploy_data / "bpe" / "codes").read_bytes()
    assert settings.tokenizer["escape"] is False and settings.tokenizer["aggressive_dash_splits"] is True
    assert settings.decoding == {"beam": 4, "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200}
    assert settings.max_source_positions is None and settings.pad_token == "<blank>"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["decoder_start_token"] == "</s>" and config["add_source_eos"] is True
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_stock_rows_keep_their_position_table_limits(exported):
    settings = ModelDirectory.read(exported("sinusoidal", trained=False))
    assert (settings.family, settings.max_source_positions, settings.max_target_positions) == (
        "transformer", 1024, 1024)


def test_existing_out_dir_is_kept_unless_forced(exported, trained, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main([str(trained("rope")), str(out)]) == 1
    assert f"error: {out} exists: pass --force to replace it" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert main([str(trained("rope")), str(out), "--force"]) == 0
    assert (out / CONFIG).is_file() and not (out / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("failure", ["truncated checkpoint", "verification"])
def test_a_forced_export_that_fails_keeps_the_old_directory(failure, exported, trained, tmp_path, monkeypatch, capsys):
    """--force replaces OUT_DIR only with a finished export: failing before the conversion (an
    unreadable checkpoint) or after it (the forced-decoding check), the previous export stays,
    byte for byte, and nothing is left beside it."""
    from fairseq_rope.deploy import export

    out = tmp_path / "out"
    shutil.copytree(exported("rope"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    checkpoint = trained("rope")
    if failure == "truncated checkpoint":
        checkpoint = tmp_path / "c.pt"
        checkpoint.write_bytes(trained("rope").read_bytes()[:1000])
        expected = "is truncated, corrupt or not a checkpoint"
    else:
        def differs(model, task, model_dir, tolerance=export.TOLERANCE):
            assert (Path(model_dir) / "model.bin").is_file()  # converted, beside the old directory
            raise DeployError("the CTranslate2 model does not compute what the fairseq model computes")

        monkeypatch.setattr(export, "verify_export", differs)
        expected = "does not compute what the fairseq model computes"
    assert main([str(checkpoint), str(out), "--force"]) == 1
    assert expected in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert {p.name for p in tmp_path.iterdir()} <= {"out", "c.pt"}  # no temporary directory left


def test_int8_export_is_smaller_and_translates_like_float32(exported, fairseq_model):
    """Quantized weights (the export's own check runs on float32 first), loaded and decoding
    every sentence."""
    from tests.deploy.test_decoding import ct2_beams
    from fairseq_rope_serve.decoding import Decoding

    int8, float32 = exported("rope", "int8"), exported("rope")
    assert ModelDirectory.read(int8).quantization == "int8"
    assert (int8 / "model.bin").stat().st_size < 0.5 * (float32 / "model.bin").stat().st_size
    quantized = ct2_beams(exported, fairseq_model, "rope", Decoding(), "int8")
    reference = ct2_beams(exported, fairseq_model, "rope", Decoding())
    assert all(h.tokens for h in quantized)
    # 8-bit weights of a 64-dimensional model: 30 of 48 identical (measured); multi30k's, see the benchmark.
    assert sum(q.tokens == r.tokens for q, r in zip(quantized, reference)) >= 0.5 * len(reference)


# ---------------------------------------------------------------- refusals


def test_unknown_architecture(rope_state, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "c.pt", rope_state, arch="transformer_rope_huge")
    assert "unknown architecture 'transformer_rope_huge'" in refused(tmp_path, checkpoint)


def test_a_model_of_another_family(rope_state, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "c.pt", rope_state, arch="lstm")
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert "architecture 'lstm' (model 'lstm') cannot be exported to CTranslate2" in message


def test_truncated_checkpoint(trained, tmp_path):
    data = trained("rope").read_bytes()
    (tmp_path / "c.pt").write_bytes(data[: len(data) // 2])
    assert "is truncated, corrupt or not a checkpoint" in refused(tmp_path, tmp_path / "c.pt")


class TouchMarker:
    """Unpickling this creates ``marker``: stands for any code a checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_malicious_checkpoint_runs_nothing(rope_state, tmp_path):
    marker = tmp_path / "PWNED"
    torch.save({**rope_state, "extra_state": {"x": TouchMarker(marker)}}, tmp_path / "c.pt")
    refused(tmp_path, tmp_path / "c.pt", UnsafeCheckpointError, "refused to load checkpoint")
    assert not marker.exists()


def test_missing_dictionary(trained, deploy_data, tmp_path):
    data_bin = tmp_path / "data-bin"
    shutil.copytree(deploy_data / "data-bin", data_bin)
    (data_bin / "dict.de.txt").unlink()
    message = refused(tmp_path, trained("rope"), data_bin=data_bin)
    assert f"missing dictionary {data_bin / 'dict.de.txt'}" in message


def test_missing_bpe_codes(trained, deploy_data, tmp_path):
    message = refused(tmp_path, trained("rope"), bpe_codes=tmp_path / "codes")
    assert f"no BPE codes at {tmp_path / 'codes'}: pass --bpe-codes FILE" in message


def test_bad_quantization(trained, tmp_path):
    assert "--quantization 'int3'" in refused(tmp_path, trained("rope"), quantization="int3")


def test_rope_options_the_exporter_does_not_map_are_refused(rope_state, tmp_path, monkeypatch):
    """An option added to the RoPE family later (a scaling mode, say) is refused at any value
    but its default, without the exporter knowing its name; at its default it exports."""
    future = Option("rope_future_scaling", "none", help="a RoPE option the exporter does not know")
    family = EncodingOptions(ROPE_OPTIONS.title, (*ROPE_OPTIONS.options, future), ROPE_OPTIONS.validate)
    monkeypatch.setitem(specs.FAMILY_OPTIONS, specs.ROPE, family)
    checkpoint = write_checkpoint(tmp_path / "c.pt", rope_state, rope_future_scaling="yarn")
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert message.startswith("--rope-future-scaling 'yarn' cannot be exported to CTranslate2")
    assert "maps only --rope-dim, --rope-layout, --rope-original-length, --rope-scaling, " in message
    args = copy.deepcopy(rope_state["cfg"]["model"])
    args.rope_future_scaling = "none"
    assert specs.check_exportable(args) == specs.ROPE


def test_a_scaling_chosen_at_export_is_carried(trained, deploy_data, tmp_path):
    """--model-overrides on a checkpoint trained without scaling, as for long inputs: CTranslate2
    scores as fairseq's own model loaded with the same overrides (fairseq-generate's loading)."""
    import ctranslate2
    from fairseq import checkpoint_utils

    from fairseq_rope.deploy.export import forced_log_probs, probe_batch

    scores = {}
    for name, overrides in (("none", {}), ("linear", {"rope_scaling": "linear", "rope_scaling_factor": 2.0}),
                            ("ntk", {"rope_scaling": "ntk", "rope_scaling_factor": 4.0})):
        out = tmp_path / name
        assert main([str(trained("rope")), str(out), "--model-overrides", repr(overrides)]) == 0
        assert ModelDirectory.read(out).provenance["options"]["rope_scaling"] == name
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(trained("rope"))], arg_overrides={"data": str(deploy_data / "data-bin"), **overrides})
        sources, targets = probe_batch(task, ((5, 7), (21, 26)))
        expected = forced_log_probs(models[0].eval(), task, sources, targets)
        got = ctranslate2.Translator(str(out), intra_threads=1).score_batch(
            [[task.source_dictionary[i] for i in s] for s in sources],
            [[task.target_dictionary[i] for i in t] for t in targets])
        for reference, result in zip(expected, got):
            assert torch.allclose(torch.tensor(result.log_probs, dtype=torch.float64), reference, atol=1e-4, rtol=0)
        scores[name] = torch.cat(expected)
    # and the scalings did change what the model computes
    assert (scores["linear"] - scores["none"]).abs().max() > 1e-2
    assert (scores["ntk"] - scores["none"]).abs().max() > 1e-2


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_rope_on_one_side_is_refused(side, rope_state, tmp_path):
    """The ablation rows (--rope-sides encoder / decoder): the exporter maps RoPE onto both of
    CTranslate2's attentions, so a one-sided model is refused, naming the option."""
    checkpoint = write_checkpoint(tmp_path / "c.pt", rope_state, rope_sides=side)
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert message.startswith(f"--rope-sides '{side}' cannot be exported to CTranslate2")


@pytest.mark.parametrize("scaling", ["yarn", "dynamic-linear", "dynamic-ntk", "dynamic-yarn"])
def test_scalings_ctranslate2_lacks_are_refused(scaling, trained, tmp_path):
    overrides = {"rope_scaling": scaling, "rope_scaling_factor": 2.0, "rope_original_length": 12}
    message = refused(tmp_path, trained("rope"), specs.UnsupportedModelError, model_overrides=overrides)
    lacks = "a scale per sentence" if scaling.startswith("dynamic") else "YaRN's ramp over the frequencies"
    assert message.startswith(f"--rope-scaling {scaling} cannot be exported to CTranslate2: it has no {lacks}")
    assert "carries linear, ntk at a fixed --rope-scaling-factor" in message


def test_alibi_is_refused(rope_state, tmp_path):
    """CTranslate2's encoder has no attention bias (its decoder has ALiBi); transformer_alibi
    biases both."""
    checkpoint = write_checkpoint(tmp_path / "c.pt", rope_state, arch="transformer_alibi_tiny")
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert message.startswith("architecture 'transformer_alibi_tiny' cannot be exported to CTranslate2: "
                              "CTranslate2 has ALiBi only in decoder self-attention")


def test_bad_model_overrides(trained, tmp_path, capsys):
    assert "'rope_sclaing' is not an option of this model" in refused(
        tmp_path, trained("rope"), model_overrides={"rope_sclaing": "linear"})
    message = refused(tmp_path, trained("rope"), model_overrides={"rope_scaling": "linear"})
    assert "--rope-scaling linear needs --rope-scaling-factor S" in message
    with pytest.raises(SystemExit):
        main([str(trained("rope")), str(tmp_path / "out"), "--model-overrides", "rope_scaling=linear"])
    assert "expected a dict literal of option names" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # 42 s on a quiet 2-core machine (2026-11-25): make test's budget
def test_rpe_with_tables_per_head(deploy_data, tmp_path):
    """CTranslate2 has one relative table per layer, shared by the heads (the exportable
    --rpe-shared-heads is in every exactness test)."""
    checkpoint = train(deploy_data / "data-bin", tmp_path / "rpe", "transformer_rpe_tiny", updates=0)
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert "transformer_rpe with relative tables per head cannot be exported" in message
    assert "one key and one value table per layer, shared by all heads" in message


def test_stock_options_ctranslate2_lacks(deploy_data, tmp_path):
    """CTranslate2's own converter decides for the stock rows (here: mixed pre-/post-norm)."""
    checkpoint = train(deploy_data / "data-bin", tmp_path / "mixed", "transformer_tiny",
                       "--encoder-normalize-before", updates=0)
    message = refused(tmp_path, checkpoint, specs.UnsupportedModelError)
    assert "--encoder-normalize-before and --decoder-normalize-before must have the same value" in message


def test_every_row_is_covered():
    assert {specs.model_family(argparse.Namespace(arch=arch)) for arch, _ in ROWS.values()} == set(specs.FAMILIES)
