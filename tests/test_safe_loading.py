"""Every checkpoint loader the plugin and its scripts use refuses a checkpoint that
would run code when unpickled, before any of it runs, and loads real fairseq
checkpoints of the stock Transformer (sinusoidal, learned positions) and of the
plugin's models.

The malicious checkpoint is a real fairseq checkpoint (weights, cfg, optimizer
state) with one extra object whose ``__reduce__`` touches a marker file, so a
refusal cannot be a mere format error; each loader gets its own marker.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, NamedTuple, Tuple

import pytest
import torch

from fairseq_rope.checkpoints import UnsafeCheckpointError, load_checkpoint
from tests.conftest import PLUGIN_DIR, REPO, TINY_TRAINING, parse_train_args

# row → (architecture, extra options): the four rows of the table, as fairseq-train builds them.
ROWS = {
    "sinusoidal": ("transformer_tiny", ()),
    "learned": ("transformer_tiny", ("--encoder-learned-pos", "--decoder-learned-pos")),
    "rope": ("transformer_rope_tiny", ()),
    "rpe": ("transformer_rpe_tiny", ()),
}


class TouchMarker:
    """Unpickling this creates ``marker``: stands for any code a checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def training_args(data_bin: Path, row: str, save_dir: Path, *extra: str):
    arch, options = ROWS[row]
    return parse_train_args(
        data_bin, arch, *options, "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
        "--max-tokens", "2000", "--save-dir", str(save_dir), "--no-epoch-checkpoints", *extra,
    )


def fairseq_trainer(args):
    """fairseq-train's task, model, criterion and Trainer for parsed ``args``."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


@pytest.fixture(scope="module")
def legit_checkpoints(toy_data_bin, tmp_path_factory) -> Dict[str, Path]:
    """row → checkpoint_last.pt written by fairseq's own save_checkpoint, as fairseq-train writes it."""
    from fairseq import checkpoint_utils

    root = tmp_path_factory.mktemp("legit")
    paths = {}
    for row in ROWS:
        cfg, trainer = fairseq_trainer(training_args(toy_data_bin, row, root / row))
        epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
        epoch_itr.next_epoch_itr(shuffle=False)
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
        paths[row] = root / row / "checkpoint_last.pt"
    return paths


@pytest.fixture(scope="module")
def attack(legit_checkpoints, tmp_path_factory):
    """``make(loader) -> (checkpoint, marker)``: the rope checkpoint plus a payload touching ``marker``."""
    root = tmp_path_factory.mktemp("attack")
    state = load_checkpoint(legit_checkpoints["rope"])

    def make(loader: str, name: str = "checkpoint_last.pt"):
        directory = root / loader.replace(" ", "_").replace("/", "_")
        directory.mkdir()
        marker = directory / "PWNED"
        torch.save({**state, "extra_state": {**state["extra_state"], "x": TouchMarker(marker)}},
                   directory / name)
        return directory / name, marker

    return make


def test_the_payload_runs_when_unpickled_unsafely(attack):
    """The control: without the safe unpickler, loading this checkpoint runs its code."""
    checkpoint, marker = attack("unsafe control")
    torch.load(checkpoint, weights_only=False)
    assert marker.exists()


# ---------------------------------------------------------------- refused, in-process


def hub_load(cls_path: str, checkpoint: Path, data_bin: Path):
    module, name = cls_path.rsplit(".", 1)
    cls = getattr(__import__(module, fromlist=[name]), name)
    return cls.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                               data_name_or_path=str(data_bin))


def restore_into_trainer(checkpoint: Path, data_bin: Path, row: str = "rope"):
    """What fairseq-train --restore-file (and train.sh's resume from checkpoint_last.pt) runs."""
    from fairseq import checkpoint_utils

    cfg, trainer = fairseq_trainer(training_args(data_bin, row, checkpoint.parent / "save",
                                                 "--restore-file", str(checkpoint)))
    extra_state, _ = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    return trainer, extra_state


IN_PROCESS_LOADERS = {
    "fairseq_rope.checkpoints.load_checkpoint": lambda path, data: load_checkpoint(path),
    "TransformerRopeModel.from_pretrained": lambda path, data: hub_load(
        "fairseq_rope.models.transformer_rope.TransformerRopeModel", path, data),
    "TransformerModel.from_pretrained (stock)": lambda path, data: hub_load(
        "fairseq.models.transformer.TransformerModel", path, data),
    "fairseq checkpoint_utils.load_checkpoint (trainer restore)": restore_into_trainer,
}


@pytest.mark.parametrize("loader", IN_PROCESS_LOADERS)
def test_in_process_loader_refuses_code_in_checkpoint(loader, attack, toy_data_bin):
    checkpoint, marker = attack(loader)
    with pytest.raises(UnsafeCheckpointError) as refusal:
        IN_PROCESS_LOADERS[loader](checkpoint, toy_data_bin)
    assert not marker.exists()
    message = str(refusal.value)
    assert f"refused to load checkpoint {checkpoint}" in message
    assert "safe unpickler" in message and "getattr" in message  # what it refused: the payload's global


# ---------------------------------------------------------------- refused, command lines


class Refusal(NamedTuple):
    checkpoint: Path
    marker: Path
    status: int
    output: str
    stdout: str
    plugin_imported_before: bool


def malicious_commands(attack, data_bin: Path, work: Path) -> Dict[str, dict]:
    """loader → its command line, with the payload checkpoint where that command reads it."""
    plugin = str(PLUGIN_DIR)
    generate = ["fairseq-generate", str(data_bin), "--cpu", "--batch-size", "8", "--path"]
    commands = {
        # First: nothing has imported the plugin yet in the driver's process.
        "fairseq-generate without --user-dir": ({}, lambda path: [*generate, str(path)]),
        "fairseq-generate": ({}, lambda path: [*generate, str(path), "--user-dir", plugin]),
        "fairseq-generate with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1": (
            {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
            lambda path: [*generate, str(path), "--user-dir", plugin]),
        "fairseq-interactive": ({}, lambda path: [
            "fairseq-interactive", str(data_bin), "--user-dir", plugin, "--path", str(path), "--cpu",
            "--source-lang", "en", "--target-lang", "de"]),
        "fairseq-train --restore-file": ({}, lambda path: [
            "fairseq-train", str(data_bin), *TINY_TRAINING, "--user-dir", plugin, "--restore-file", str(path),
            "--save-dir", str(work / "restore"), "--max-update", "1"]),
        # scripts/train.sh's resume: fairseq-train's default --restore-file, SAVE_DIR/checkpoint_last.pt.
        "fairseq-train resuming SAVE_DIR/checkpoint_last.pt (scripts/train.sh)": ({}, lambda path: [
            "fairseq-train", str(data_bin), *TINY_TRAINING, "--user-dir", plugin,
            "--save-dir", str(path.parent), "--max-update", "1"]),
        # scripts/evaluate.sh loads through this script, then fairseq-generate.
        "scripts/average_checkpoints.py": ({}, lambda path: [
            str(REPO / "scripts" / "average_checkpoints.py"), "--inputs", str(path.parent),
            "--output", str(work / "avg.pt"), "--num-checkpoints", "1"]),
    }
    specs = {}
    for loader, (env, argv) in commands.items():
        name = "checkpoint_1_1.pt" if loader.startswith("scripts/average") else "checkpoint_last.pt"
        path, marker = attack(loader, name)
        specs[loader] = {"argv": argv(path), "env": env, "checkpoint": str(path), "marker": str(marker)}
    return specs


# Last, after the refusals: real checkpoints of all four rows, as one ensemble.
LEGIT_GENERATE = "fairseq-generate of real checkpoints"


@pytest.fixture(scope="module")
def refusals(attack, legit_checkpoints, toy_data_bin, tmp_path_factory) -> Dict[str, Refusal]:
    """All commands in one process (tests/loader_driver.py), paying fairseq's start-up once."""
    work = tmp_path_factory.mktemp("commands")
    specs = malicious_commands(attack, toy_data_bin, work)
    ensemble = ":".join(str(legit_checkpoints[row]) for row in ROWS)
    specs[LEGIT_GENERATE] = {"checkpoint": ensemble, "marker": str(work / "none"), "argv": [
        "fairseq-generate", str(toy_data_bin), "--user-dir", str(PLUGIN_DIR), "--path", ensemble,
        "--cpu", "--batch-size", "64", "--beam", "2", "--max-len-b", "3"]}
    (work / "commands.json").write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "loader_driver.py"), work / "commands.json", work / "results.json"],
        cwd=work, env={**env, "OMP_NUM_THREADS": "1"}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((work / "results.json").read_text())
    return {
        loader: Refusal(Path(spec["checkpoint"]), Path(spec["marker"]), **results[loader])
        for loader, spec in specs.items()
    }


PLUGIN_COMMANDS = [
    "fairseq-generate", "fairseq-generate with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1", "fairseq-interactive",
    "fairseq-train --restore-file", "fairseq-train resuming SAVE_DIR/checkpoint_last.pt (scripts/train.sh)",
    "scripts/average_checkpoints.py",
]


@pytest.mark.parametrize("loader", PLUGIN_COMMANDS)
def test_command_refuses_code_in_checkpoint_and_says_why(loader, refusals):
    refusal = refusals[loader]
    assert not refusal.marker.exists()
    assert refusal.status != 0, refusal.output[-3000:]
    assert (f"UnsafeCheckpointError: refused to load checkpoint {refusal.checkpoint}: "
            "torch's safe unpickler (weights_only=True) rejected it") in refusal.output, refusal.output[-3000:]


def test_command_without_the_plugin_still_refuses(refusals):
    """Without --user-dir nothing is allowlisted: torch's own refusal (of any fairseq checkpoint)."""
    refusal = refusals["fairseq-generate without --user-dir"]
    assert not refusal.plugin_imported_before
    assert not refusal.marker.exists()
    assert refusal.status != 0
    assert "Weights only load failed" in refusal.output, refusal.output[-3000:]


# ---------------------------------------------------------------- real checkpoints load


def in_process_load(loader: str, row: str, checkpoint: Path, data_bin: Path) -> Tuple[object, Dict[str, torch.Tensor]]:
    """(what ``loader`` returned: a model or the checkpoint's state, the weights it ended up with)."""
    from fairseq import checkpoint_utils

    if loader == "load_checkpoint":
        state = load_checkpoint(checkpoint)
        return state, state["model"]
    if loader == "load_model_ensemble (fairseq-generate, fairseq-interactive)":
        (model,), _ = checkpoint_utils.load_model_ensemble([str(checkpoint)])
    elif loader == "from_pretrained":
        (model,) = hub_load("fairseq.models.transformer.TransformerModel", checkpoint, data_bin).models
    else:
        trainer, extra_state = restore_into_trainer(checkpoint, data_bin, row)
        return extra_state, trainer.get_model().state_dict()
    return model, model.state_dict()


def with_new_weights(source: Path, dest: Path) -> Dict[str, object]:
    """``source`` written to ``dest`` with every weight and bias drawn afresh (tied weights stay
    tied): a loader that built the model but kept its own initialization (the same seed
    would give the same initial weights) cannot pass for one that read the file. Read with
    the unsafe pickle loader, not the code under test: the file is this module's own."""
    state = torch.load(source, weights_only=False)
    g = torch.Generator().manual_seed(12345)
    drawn = set()
    for name, tensor in state["model"].items():
        if name.endswith(("weight", "bias")) and tensor.data_ptr() not in drawn:
            drawn.add(tensor.data_ptr())
            tensor.copy_(torch.randn(tensor.shape, generator=g))
    torch.save(state, dest)
    return state


@pytest.mark.parametrize("loader", [
    "load_checkpoint", "load_model_ensemble (fairseq-generate, fairseq-interactive)", "from_pretrained",
    "trainer restore (fairseq-train --restore-file, train.sh resume)",
])
@pytest.mark.parametrize("row", ROWS)
def test_real_checkpoint_loads(row, loader, legit_checkpoints, toy_data_bin, tmp_path):
    checkpoint = tmp_path / "checkpoint_last.pt"
    saved = with_new_weights(legit_checkpoints[row], checkpoint)
    loaded, weights = in_process_load(loader, row, checkpoint, toy_data_bin)
    if isinstance(loaded, torch.nn.Module):
        assert type(loaded).__name__ == {"rope": "TransformerRopeModel", "rpe": "TransformerRpeModel"}.get(
            row, "TransformerModel")
    elif loader.startswith("trainer restore"):
        assert loaded["train_iterator"] == saved["extra_state"]["train_iterator"]
    # Every tensor of the file, bit for bit: the weights drawn above, not a fresh initialization.
    assert sorted(weights) == sorted(saved["model"])
    differing = [name for name, tensor in saved["model"].items() if not torch.equal(weights[name], tensor)]
    assert not differing, f"{len(differing)} tensors differ from the checkpoint's, e.g. {differing[:3]}"


def test_real_checkpoints_of_every_row_decode_through_fairseq_generate(refusals):
    """fairseq-generate --user-dir loads all four rows (as one ensemble) and decodes the test set."""
    result = refusals[LEGIT_GENERATE]
    assert result.status == 0, result.output[-3000:]
    assert len(re.findall(r"^H-\d+\t", result.stdout, flags=re.M)) == 40


def test_a_file_that_is_no_checkpoint_is_called_corrupt_not_unsafe(tmp_path):
    garbage = tmp_path / "checkpoint_last.pt"
    garbage.write_bytes(b"garbage, not a torch file")
    with pytest.raises(Exception) as error:
        load_checkpoint(garbage)
    assert not isinstance(error.value, UnsafeCheckpointError)
    assert f"cannot read checkpoint {garbage}: it is not a torch checkpoint or it is corrupt" in str(error.value)


def test_numpy_arrays_of_eval_bleu_load_and_object_arrays_cannot_smuggle_code(tmp_path):
    """fairseq-train --eval-bleu keeps its BLEU n-gram counts as numpy int arrays in the checkpoint's
    metrics: they load safely; an object array is refused, so no payload inside one runs."""
    import numpy as np

    counts = {"extra_state": {"metrics": {"valid": [(0, "_bleu_counts_0", 0, {"val": np.arange(4), "sum": np.ones(4, dtype=np.int64)})]}},
              "model": {"w": torch.ones(2)}}
    good = tmp_path / "eval_bleu.pt"
    torch.save(counts, good)
    loaded = load_checkpoint(good)["extra_state"]["metrics"]["valid"][0][3]
    assert loaded["val"].tolist() == [0, 1, 2, 3] and loaded["sum"].dtype == np.int64
    payload = tmp_path / "object_array.pt"
    torch.save({"extra_state": {"metrics": np.array([TouchMarker(tmp_path / "PWNED")], dtype=object)}}, payload)
    with pytest.raises(UnsafeCheckpointError, match="refused to load checkpoint .*object_array.pt"):
        load_checkpoint(payload)
    assert not (tmp_path / "PWNED").exists()
