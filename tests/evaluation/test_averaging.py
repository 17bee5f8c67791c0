"""Checkpoint averaging on fake fairseq-style checkpoints."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fairseq_rope  # noqa: F401  (allows argparse.Namespace in safe loading)
from fairseq_rope.evaluation import averaging
from fairseq_rope.evaluation.averaging import (
    AveragingError,
    average_checkpoints,
    average_last_checkpoints,
    last_checkpoints,
)
from tests.conftest import REPO



def model_state(value: float, dtype=torch.float32, **overrides):
    state = {
        "encoder.layers.0.weight": torch.full((2, 3), value, dtype=dtype),
        "decoder.output_projection.bias": torch.full((4,), value, dtype=dtype),
        "encoder.version": torch.tensor([3]),
    }
    state.update(overrides)
    return state


def save_checkpoint(path: Path, value: float, update: int = 0, model_cfg=None, **model_kwargs) -> Path:
    """A fairseq-like checkpoint whose float parameters all equal ``value``."""
    torch.save({
        "args": argparse.Namespace(arch="transformer_rope_tiny"),
        "cfg": {"model": model_cfg or {"arch": "transformer_rope_tiny"}},
        "model": model_state(value, **model_kwargs),
        "optimizer_history": [{"num_updates": update}],
        "extra_state": {"train_iterator": {"epoch": 1}, "update": update},
        "last_optimizer_state": {"state": {0: {"exp_avg": torch.zeros(1000)}}},
    }, path)
    return path


def test_known_values_average_exactly_and_buffers_are_copied(tmp_path):
    paths = [save_checkpoint(tmp_path / f"c{i}.pt", v, update=i) for i, v in enumerate([1, 2, 3, 6])]
    state = average_checkpoints(paths)
    model = state["model"]
    assert torch.equal(model["encoder.layers.0.weight"], torch.full((2, 3), 3.0))
    assert torch.equal(model["decoder.output_projection.bias"], torch.full((4,), 3.0))
    assert model["encoder.layers.0.weight"].dtype == torch.float32
    assert torch.equal(model["encoder.version"], torch.tensor([3]))  # copied, not averaged
    assert model["encoder.version"].dtype == torch.int64
    # The newest checkpoint's other entries, minus the optimizer state.
    assert state["extra_state"]["update"] == 3
    assert state["cfg"] == {"model": {"arch": "transformer_rope_tiny"}}
    assert "last_optimizer_state" not in state


def test_fp16_is_averaged_in_higher_precision_and_stays_fp16(tmp_path):
    # In fp16, 60000 + 60000 overflows to inf; the average itself is representable.
    paths = [save_checkpoint(tmp_path / f"c{i}.pt", 60000.0, dtype=torch.float16) for i in range(3)]
    weight = average_checkpoints(paths)["model"]["encoder.layers.0.weight"]
    assert weight.dtype == torch.float16
    assert torch.equal(weight, torch.full((2, 3), 60000.0, dtype=torch.float16))


def touch_all(directory: Path, names):
    for name in names:
        save_checkpoint(directory / name, 1.0)


def test_update_checkpoints_sorted_numerically(tmp_path):
    touch_all(tmp_path, ["checkpoint_1_900.pt", "checkpoint_2_1000.pt", "checkpoint_10_10000.pt",
                         "checkpoint_9_9000.pt", "checkpoint_last.pt", "checkpoint_best.pt",
                         "checkpoint_avg_last5.pt", "checkpoint3.pt"])
    names = [p.name for p in last_checkpoints(tmp_path, 3, "update")]
    assert names == ["checkpoint_2_1000.pt", "checkpoint_9_9000.pt", "checkpoint_10_10000.pt"]
    names = [p.name for p in last_checkpoints(tmp_path, 2, "update", upper_bound=9000)]
    assert names == ["checkpoint_2_1000.pt", "checkpoint_9_9000.pt"]


def test_epoch_checkpoints_sorted_numerically(tmp_path):
    touch_all(tmp_path, ["checkpoint9.pt", "checkpoint10.pt", "checkpoint2.pt", "checkpoint_1_50.pt"])
    assert [p.name for p in last_checkpoints(tmp_path, 2, "epoch")] == ["checkpoint9.pt", "checkpoint10.pt"]
    assert [p.name for p in last_checkpoints(tmp_path, 2, "epoch", upper_bound=9)] == [
        "checkpoint2.pt", "checkpoint9.pt"]


def test_auto_prefers_update_checkpoints_and_falls_back_to_epochs(tmp_path):
    touch_all(tmp_path, ["checkpoint1.pt", "checkpoint2.pt", "checkpoint3.pt"])
    assert [p.name for p in last_checkpoints(tmp_path, 2, "auto")] == ["checkpoint2.pt", "checkpoint3.pt"]
    touch_all(tmp_path, ["checkpoint_1_100.pt"])
    # With update checkpoints present, too few of them is an error, not a silent fallback.
    with pytest.raises(AveragingError, match=r"last 2 update checkpoints.*found 1: checkpoint_1_100.pt"):
        last_checkpoints(tmp_path, 2, "auto")


def test_too_few_checkpoints_is_an_error_and_writes_nothing(tmp_path):
    touch_all(tmp_path, ["checkpoint_1_100.pt", "checkpoint_1_200.pt"])
    output = tmp_path / "avg.pt"
    with pytest.raises(AveragingError, match="found 2"):
        average_last_checkpoints(tmp_path, output, 5)
    assert not output.exists()


@pytest.mark.parametrize("model_kwargs, message", [
    ({"extra.weight": torch.zeros(1)}, r"has extra parameter 'extra.weight'"),
    ({"encoder.layers.0.weight": torch.zeros(3, 2)},
     r"'encoder.layers.0.weight' has shape \(3, 2\), but \(2, 3\)"),
    ({"encoder.version": torch.tensor([2])}, r"non-float tensor 'encoder.version' differs"),
])
def test_incompatible_checkpoints_name_file_and_key(tmp_path, model_kwargs, message):
    save_checkpoint(tmp_path / "checkpoint_1_100.pt", 1.0, **model_kwargs)
    save_checkpoint(tmp_path / "checkpoint_1_200.pt", 2.0)
    output = tmp_path / "avg.pt"
    with pytest.raises(AveragingError, match=message) as error:
        average_last_checkpoints(tmp_path, output, 2)
    assert "checkpoint_1_100.pt" in str(error.value)
    assert not output.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_100.pt", "checkpoint_1_200.pt"]


def test_missing_key_is_an_error(tmp_path):
    save_checkpoint(tmp_path / "checkpoint_1_100.pt", 1.0)
    newest = save_checkpoint(tmp_path / "checkpoint_1_200.pt", 2.0, **{"decoder.extra": torch.ones(2)})
    with pytest.raises(AveragingError, match=r"checkpoint_1_100.pt lacks parameter 'decoder.extra'"):
        average_checkpoints([tmp_path / "checkpoint_1_100.pt", newest])


def test_output_loads_safely_and_is_written_atomically(tmp_path, monkeypatch):
    for update, value in [(100, 1.0), (200, 2.0), (300, 4.0)]:
        save_checkpoint(tmp_path / f"checkpoint_1_{update}.pt", value, update=update)
    output = tmp_path / "checkpoint_avg_last3.pt"
    used = average_last_checkpoints(tmp_path, output, 3)
    assert [p.name for p in used] == ["checkpoint_1_100.pt", "checkpoint_1_200.pt", "checkpoint_1_300.pt"]
    state = torch.load(output, weights_only=True)
    assert torch.allclose(state["model"]["encoder.layers.0.weight"], torch.full((2, 3), 7 / 3))
    assert isinstance(state["args"], argparse.Namespace)
    size = output.stat().st_size

    # A failing save leaves the previous output intact and no temporary file behind.
    def failing_save(obj, path):
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(averaging.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        average_last_checkpoints(tmp_path, output, 2, force=True)
    assert output.stat().st_size == size
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_script_averages(tmp_path):
    for update, value in [(100, 1.0), (200, 3.0)]:
        save_checkpoint(tmp_path / f"checkpoint_1_{update}.pt", value)
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "average_checkpoints.py"), "--inputs", str(tmp_path),
         "--output", str(tmp_path / "avg.pt"), "--num-update-checkpoints", "2"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "checkpoint_1_100.pt"),
                                     str(tmp_path / "checkpoint_1_200.pt")]
    avg = torch.load(tmp_path / "avg.pt", weights_only=True)["model"]["encoder.layers.0.weight"]
    assert torch.equal(avg, torch.full((2, 3), 2.0))


def test_cli_error_is_reported_without_output(tmp_path, capsys):
    save_checkpoint(tmp_path / "checkpoint_1_100.pt", 1.0)
    output = tmp_path / "none.pt"
    code = averaging.main(["--inputs", str(tmp_path), "--output", str(output),
                           "--num-epoch-checkpoints", "1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "last 1 epoch checkpoints" in err and "found 0" in err
    assert not output.exists()


def snapshot(directory: Path):
    """Every file under ``directory``: (mtime, contents), to show that nothing changed."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir())}


def run_main(*argv: object) -> int:
    return averaging.main([str(a) for a in argv])


def test_unreadable_checkpoint_is_named_and_nothing_is_written(tmp_path, capsys):
    save_checkpoint(tmp_path / "checkpoint_1_100.pt", 1.0)
    bad = save_checkpoint(tmp_path / "checkpoint_1_200.pt", 2.0)
    bad.write_bytes(bad.read_bytes()[:1000])  # a run killed while saving
    before = snapshot(tmp_path)
    assert run_main("--inputs", tmp_path, "--output", tmp_path / "avg.pt", "--num-update-checkpoints", 2) == 1
    err = capsys.readouterr().err
    assert f"error: cannot read checkpoint {bad}: RuntimeError: " in err
    assert "truncated or corrupt" in err and "--checkpoint-upper-bound" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("older, message", [
    ({"model_cfg": argparse.Namespace(arch="transformer_rope_tiny", rope_layout="half", dropout=0.3)},
     "are of different architectures (rope_layout = 'half' vs 'interleaved'); "
     "average checkpoints of one training run only"),
    ({"model_cfg": {"arch": "transformer_rpe_tiny"}},
     "are of different architectures (arch = 'transformer_rpe_tiny' vs 'transformer_rope_tiny')"),
    ({"encoder.embed_tokens.weight": torch.zeros(12, 3)},
     "have different vocabularies: 'encoder.embed_tokens.weight' has 12 rows, but 10 in"),
])
def test_checkpoints_of_other_architectures_or_vocabularies_are_refused(tmp_path, capsys, older, message):
    older_path = save_checkpoint(tmp_path / "checkpoint_1_100.pt", 1.0, **{
        "encoder.embed_tokens.weight": torch.zeros(10, 3), **older})
    newest = save_checkpoint(tmp_path / "checkpoint_1_200.pt", 2.0, model_cfg=argparse.Namespace(
        arch="transformer_rope_tiny", rope_layout="interleaved", dropout=0.1),  # dropout: not architecture
        **{"encoder.embed_tokens.weight": torch.zeros(10, 3)})
    if "model_cfg" not in older:  # same architecture as the newest, other vocabulary
        save_checkpoint(older_path, 1.0, model_cfg=argparse.Namespace(
            arch="transformer_rope_tiny", rope_layout="interleaved", dropout=0.3), **older)
    before = snapshot(tmp_path)
    assert run_main("--inputs", tmp_path, "--output", tmp_path / "avg.pt", "--num-update-checkpoints", 2) == 1
    err = capsys.readouterr().err
    assert f"error: {older_path} and {newest} " in err and message in err
    assert snapshot(tmp_path) == before


def test_existing_output_is_refused_unless_forced(tmp_path, capsys):
    for update, value in [(100, 1.0), (200, 3.0)]:
        save_checkpoint(tmp_path / f"checkpoint_1_{update}.pt", value)
    output = tmp_path / "avg.pt"
    output.write_bytes(b"an earlier average")
    before = snapshot(tmp_path)
    args = ["--inputs", tmp_path, "--output", output, "--num-update-checkpoints", 2]
    assert run_main(*args) == 1
    assert f"error: output {output} already exists; pass --force to replace it" in capsys.readouterr().err
    assert snapshot(tmp_path) == before

    assert run_main(*args, "--force") == 0
    assert torch.equal(torch.load(output, weights_only=True)["model"]["encoder.layers.0.weight"],
                       torch.full((2, 3), 2.0))
    # Never over one of its own inputs, even forced.
    assert run_main(*args[:3], tmp_path / "checkpoint_1_200.pt", *args[4:], "--force") == 1
    assert "is one of the checkpoints to average" in capsys.readouterr().err
