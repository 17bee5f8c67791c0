"""fairseq_rope.patches: every change to fairseq and torch is listed, applied by
default, left out entirely by its opt-out variable, and refused or skipped when
its target no longer looks as expected; safe loading never touches os.environ."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import FairseqDataset, iterators
from fairseq.dataclass import utils as dataclass_utils
from fairseq.file_io import PathManager
from fairseq.tasks import FairseqTask

from fairseq_rope import patches
from fairseq_rope.checkpoints import UnsafeCheckpointError
from fairseq_rope.patches import PatchError, PatchWarning, apply_patches, applied_patches, get_patch
from tests.conftest import BIN_DIR, REPO, TINY_TRAINING

NAMES = ["SAFE_GLOBALS", "SAFE_LOADER", "BROADCAST_LOAD", "ATOMIC_COPY", "RESUME_BATCHES", "BF16_DEVICE",
         "PREFETCH_EXIT"]
REFUSING = {"SAFE_GLOBALS", "SAFE_LOADER"}  # safety: refuse; the others warn and skip


# ---------------------------------------------------------------- listed and documented


def test_the_list_is_complete_and_each_entry_says_what_why_and_how_to_opt_out():
    assert [p.name for p in patches.PATCHES] == NAMES
    doc = (REPO / "docs" / "patches.md").read_text()
    for patch in patches.PATCHES:
        assert patch.target and patch.changes and patch.why and patch.expected, patch.name
        assert patch.opt_out == f"FAIRSEQ_ROPE_NO_{patch.name}"
        assert patch.refuse == (patch.name in REFUSING)
        assert f"`{patch.opt_out}`" in doc and f"`{patch.name}`" in doc


# ---------------------------------------------------------------- applied by default, opt-out


# Records fairseq's and torch's own objects, then imports the plugin and reports what it changed.
PROBE = """
import argparse, json, torch
from fairseq import checkpoint_utils
from fairseq.data import iterators
from fairseq.dataclass import utils as dataclass_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from fairseq.tasks import FairseqTask
before = dict(load=checkpoint_utils.load_checkpoint_to_cpu, torch=checkpoint_utils.torch,
              distributed_torch=distributed_utils.torch,
              copy=PathManager.copy, batches=FairseqTask.get_batch_iterator,
              overrides=dataclass_utils.override_module_args, consumer=iterators.BackgroundConsumer,
              safe_globals=list(torch.serialization.get_safe_globals()))
import fairseq_rope
from fairseq_rope.patches import applied_patches
untouched = {
    "SAFE_GLOBALS": torch.serialization.get_safe_globals() == before["safe_globals"]
                    and argparse.Namespace not in torch.serialization.get_safe_globals(),
    "SAFE_LOADER": checkpoint_utils.load_checkpoint_to_cpu is before["load"]
                   and checkpoint_utils.torch is before["torch"] is torch,
    "BROADCAST_LOAD": distributed_utils.torch is before["distributed_torch"] is torch,
    "ATOMIC_COPY": PathManager.copy is before["copy"],
    "RESUME_BATCHES": FairseqTask.get_batch_iterator is before["batches"],
    "BF16_DEVICE": dataclass_utils.override_module_args is before["overrides"],
    "PREFETCH_EXIT": iterators.BackgroundConsumer is before["consumer"],
}
print(json.dumps({"applied": list(applied_patches()), "untouched": untouched}))
"""


def probe(script: str = PROBE, **env: str) -> Dict[str, Any]:
    """Run ``script`` (PROBE) in a fresh process with ``env`` (and no other opt-out) set;
    its report, and its stderr as ``"stderr"``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRSEQ_ROPE_NO_", "TORCH_FORCE"))}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                            env={**clean, "OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "stderr": result.stderr}


@pytest.fixture(scope="module")
def by_default() -> Dict[str, Any]:
    return probe()


@pytest.mark.parametrize("name", NAMES)
def test_patch_is_applied_by_default(name, by_default):
    assert name in by_default["applied"]
    assert not by_default["untouched"][name]


@pytest.mark.parametrize("name", NAMES)
def test_opt_out_variable_leaves_the_target_untouched(name):
    report = probe(**{f"FAIRSEQ_ROPE_NO_{name}": "1"})
    assert report["untouched"][name]
    assert name not in report["applied"]
    others = [n for n in NAMES if n != name]
    assert report["applied"] == others and not any(report["untouched"][n] for n in others)


def test_opt_out_takes_true_values_only():
    patch = get_patch("ATOMIC_COPY")
    assert not patch.enabled({"FAIRSEQ_ROPE_NO_ATOMIC_COPY": "1"})
    assert not patch.enabled({"FAIRSEQ_ROPE_NO_ATOMIC_COPY": "True"})
    assert patch.enabled({"FAIRSEQ_ROPE_NO_ATOMIC_COPY": "0"})
    assert patch.enabled({"FAIRSEQ_ROPE_NO_SAFE_LOADER": "1"})


def test_applying_again_changes_nothing():
    from fairseq.distributed import utils as distributed_utils

    # Every patch's target, in PATCHES order (SAFE_LOADER has two).
    targets = lambda: (list(torch.serialization.get_safe_globals()),  # noqa: E731
                       checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.torch,
                       distributed_utils.torch, PathManager.copy, FairseqTask.get_batch_iterator,
                       dataclass_utils.override_module_args, iterators.BackgroundConsumer)
    before = targets()
    applied = apply_patches({})
    assert targets() == before
    assert applied == tuple(NAMES) == applied_patches()
    for wrapper in before[1], before[4], before[5], before[6]:  # each wraps fairseq's original once
        assert not hasattr(wrapper.__wrapped__, "__wrapped__")


# ---------------------------------------------------------------- guards


def assert_refused(name: str, what: str) -> None:
    with pytest.raises(PatchError) as refusal:
        get_patch(name).apply()
    message = str(refusal.value)
    assert f"patch {name} cannot be applied to {get_patch(name).target}" in message
    assert f"expected {get_patch(name).expected}" in message and what in message
    assert f"FAIRSEQ_ROPE_NO_{name}=1" in message


def test_safe_globals_refuses_a_torch_with_another_allowlist_api(monkeypatch):
    monkeypatch.setattr(torch.serialization, "get_safe_globals", lambda: [])  # not applied yet
    monkeypatch.setattr(torch.serialization, "add_safe_globals", lambda safe_globals, strict: None)
    assert_refused("SAFE_GLOBALS", "add_safe_globals with parameters ('safe_globals', 'strict')")
    monkeypatch.delattr(torch.serialization, "add_safe_globals")
    assert_refused("SAFE_GLOBALS", "without torch.serialization.add_safe_globals")


def test_safe_loader_refuses_another_load_checkpoint_to_cpu(monkeypatch):
    def load_checkpoint_to_cpu(path, arg_overrides=None, strict=True):
        return {}

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu)
    assert_refused("SAFE_LOADER", "parameters ('path', 'arg_overrides', 'strict')")
    assert checkpoint_utils.load_checkpoint_to_cpu is load_checkpoint_to_cpu


def test_safe_loader_refuses_a_loader_that_does_not_read_through_torch_load(monkeypatch):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        with open(path, "rb") as f:
            return pickle.load(f)

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu)
    assert_refused("SAFE_LOADER", "does not call torch.load through its module's global torch")
    assert checkpoint_utils.load_checkpoint_to_cpu is load_checkpoint_to_cpu


def test_atomic_copy_warns_and_skips_another_copy(monkeypatch):
    def copy(src_path, dst_path, overwrite=False, recursive=False):
        return True

    monkeypatch.setattr(PathManager, "copy", staticmethod(copy))
    with pytest.warns(PatchWarning, match=r"patch ATOMIC_COPY cannot be applied .* parameters "
                                          r"\('src_path', 'dst_path', 'overwrite', 'recursive'\).*skipped"):
        assert get_patch("ATOMIC_COPY").apply() is False
    assert PathManager.copy is copy and "ATOMIC_COPY" not in applied_patches()


def test_resume_batches_warns_and_skips_another_get_batch_iterator(monkeypatch):
    def get_batch_iterator(self, dataset, max_tokens=None, epoch=1):
        return None

    monkeypatch.setattr(FairseqTask, "get_batch_iterator", get_batch_iterator)
    with pytest.warns(PatchWarning, match=r"patch RESUME_BATCHES cannot be applied .* parameters "
                                          r"\('self', 'dataset', 'max_tokens', 'epoch'\).*skipped"):
        assert get_patch("RESUME_BATCHES").apply() is False
    assert FairseqTask.get_batch_iterator is get_batch_iterator


def test_bf16_device_warns_and_skips_when_bf16_no_longer_implies_tpu(monkeypatch):
    from fairseq import options

    original = dataclass_utils.override_module_args.__wrapped__
    monkeypatch.setattr(dataclass_utils, "override_module_args", original)
    monkeypatch.setattr(options, "parse_args_and_arch", lambda parser, input_args=None: None)
    with pytest.warns(PatchWarning, match=r"patch BF16_DEVICE cannot be applied .* no longer implies --tpu"):
        assert get_patch("BF16_DEVICE").apply() is False
    assert dataclass_utils.override_module_args is original


def test_prefetch_exit_warns_and_skips_another_background_consumer(monkeypatch):
    class BackgroundConsumer(threading.Thread):
        def __init__(self, queue, source, max_len, cuda_device, pin_memory):
            super().__init__()

    monkeypatch.setattr(iterators, "BackgroundConsumer", BackgroundConsumer)
    with pytest.warns(PatchWarning, match=r"patch PREFETCH_EXIT cannot be applied .* parameters "
                                          r"\('self', 'queue', 'source', 'max_len', 'cuda_device', 'pin_memory'\)"):
        assert get_patch("PREFETCH_EXIT").apply() is False
    assert iterators.BackgroundConsumer is BackgroundConsumer and "PREFETCH_EXIT" not in applied_patches()


def no_source(obj: Any) -> str:
    """inspect.getsource where only bytecode is installed (.pyc without .py, a frozen app)."""
    raise OSError("could not get source code")


def fairseq_originals(monkeypatch) -> None:
    """BROADCAST_LOAD's and BF16_DEVICE's targets as fairseq has them, unpatched."""
    from fairseq.distributed import utils as distributed_utils

    monkeypatch.setattr(distributed_utils, "torch", torch)
    monkeypatch.setattr(dataclass_utils, "override_module_args", dataclass_utils.override_module_args.__wrapped__)


@pytest.mark.parametrize("name", ["BROADCAST_LOAD", "BF16_DEVICE"])
def test_a_guard_that_cannot_read_its_targets_source_warns_and_skips(name, monkeypatch):
    fairseq_originals(monkeypatch)
    assert name not in applied_patches()
    monkeypatch.setattr(patches.inspect, "getsource", no_source)
    with pytest.warns(PatchWarning, match=rf"patch {name} cannot be applied .* found a target whose source "
                                          rf"cannot be read \(could not get source code\)\. Set "
                                          rf"FAIRSEQ_ROPE_NO_{name}=1 .*skipped"):
        assert get_patch(name).apply() is False
    assert name not in applied_patches()


def test_import_without_source_files_warns_and_applies_the_other_patches():
    """``import fairseq_rope`` where inspect.getsource fails: the two patches whose guards read
    source are skipped with a warning; the import, and every other patch, go on."""
    report = probe(PROBE.replace("import fairseq_rope\n", "import inspect\n"
                                 "def no_source(obj):\n    raise OSError('could not get source code')\n"
                                 "inspect.getsource = no_source\nimport fairseq_rope\n"))
    skipped = {"BROADCAST_LOAD", "BF16_DEVICE"}
    assert report["applied"] == [n for n in NAMES if n not in skipped]
    assert {n for n, untouched in report["untouched"].items() if untouched} == skipped
    for name in skipped:
        assert f"PatchWarning: fairseq-rope patch {name} cannot be applied" in report["stderr"]


# ---------------------------------------------------------------- safe loading leaves os.environ alone


class TouchMarker:
    """Unpickling this creates ``marker``: stands for any code a checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.fixture
def unsafe_checkpoint(tmp_path):
    path, marker = tmp_path / "checkpoint_last.pt", tmp_path / "PWNED"
    torch.save({"model": {"w": torch.zeros(2)}, "extra_state": {"x": TouchMarker(marker)}}, path)
    return path, marker


@pytest.fixture
def forcing_unsafe_loads(monkeypatch) -> None:
    """The workaround users set for fairseq under torch >= 2.6."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)


def spy_on_torch_load(monkeypatch, during=None) -> List[dict]:
    """Record os.environ and the keywords of every torch.load; ``during()`` runs inside it."""
    calls, real = [], torch.load

    def load(*args, **kwargs):
        calls.append({"environ": dict(os.environ), "kwargs": dict(kwargs)})
        if during:
            during()
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    return calls


def test_safe_loader_refuses_code_under_force_no_weights_only_without_touching_environ(
        unsafe_checkpoint, forcing_unsafe_loads, monkeypatch):
    path, marker = unsafe_checkpoint
    calls = spy_on_torch_load(monkeypatch)
    before = dict(os.environ)
    with pytest.raises(UnsafeCheckpointError, match=f"refused to load checkpoint {path}: torch's safe unpickler"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()
    assert len(calls) == 1 and calls[0]["kwargs"]["weights_only"] is True
    assert calls[0]["environ"] == before  # unchanged during the load...
    assert dict(os.environ) == before  # ...and after


def test_another_thread_sees_os_environ_unchanged_while_a_checkpoint_loads(
        unsafe_checkpoint, forcing_unsafe_loads, monkeypatch):
    path, marker = unsafe_checkpoint
    inside, release = threading.Event(), threading.Event()

    def pause():  # hold the loading thread inside torch.load while the main thread looks
        inside.set()
        assert release.wait(timeout=60)

    spy_on_torch_load(monkeypatch, during=pause)
    errors: List[BaseException] = []

    def load() -> None:
        try:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        except BaseException as error:  # noqa: BLE001  (checked below, in the main thread)
            errors.append(error)

    before = dict(os.environ)
    worker = threading.Thread(target=load)
    worker.start()
    try:
        assert inside.wait(timeout=60)
        seen_meanwhile = dict(os.environ)
    finally:
        release.set()
        worker.join(timeout=60)
    assert seen_meanwhile == before
    assert len(errors) == 1 and isinstance(errors[0], UnsafeCheckpointError), errors
    assert not marker.exists() and dict(os.environ) == before


def test_fairseq_checkpoint_utils_torch_is_torch_but_for_a_weights_only_load(tmp_path, forcing_unsafe_loads):
    """The namespace patch: allowlisted Namespace loads, code is refused, torch.load itself is untouched."""
    good = tmp_path / "good.pt"
    torch.save({"args": argparse.Namespace(arch="transformer_rope_tiny"), "w": torch.ones(2)}, good)
    assert checkpoint_utils.torch.load(good)["args"].arch == "transformer_rope_tiny"
    assert checkpoint_utils.torch.device is torch.device and checkpoint_utils.torch.Tensor is torch.Tensor
    assert torch.load is not patches.weights_only_load
    payload = tmp_path / "payload.pt"
    torch.save({"x": TouchMarker(tmp_path / "PWNED")}, payload)
    with pytest.raises(Exception, match="Weights only load failed"):
        checkpoint_utils.torch.load(payload, weights_only=False)  # the caller cannot turn it off
    assert not (tmp_path / "PWNED").exists()


# ---------------------------------------------------------------- resume batches


class ToyDataset(FairseqDataset):
    """64 one-token sentences in a seeded random order: batches depend on the seed."""

    def __init__(self) -> None:
        self.sizes = np.ones(64, dtype=np.int64)
        self.epochs: List[int] = []

    def __getitem__(self, index: int) -> int:
        return index

    def __len__(self) -> int:
        return len(self.sizes)

    def num_tokens(self, index: int) -> int:
        return 1

    def size(self, index: int) -> int:
        return 1

    def ordered_indices(self) -> np.ndarray:
        return np.random.permutation(len(self))

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def collater(self, samples: list) -> list:
        return samples


def batches(get_batch_iterator, epoch: int, dataset=None):
    dataset = dataset or ToyDataset()
    itr = get_batch_iterator(FairseqTask(argparse.Namespace()), dataset, max_sentences=4, seed=1, epoch=epoch)
    return itr, [tuple(batch) for batch in itr.frozen_batches]


def test_a_run_resumed_in_epoch_3_gets_the_batches_of_epoch_1_and_says_so(caplog):
    patched = FairseqTask.get_batch_iterator
    fairseqs_own = patched.__wrapped__
    _, uninterrupted = batches(patched, epoch=1)
    dataset = ToyDataset()
    with caplog.at_level(logging.INFO, logger="fairseq_rope.patches"):
        itr, resumed = batches(patched, epoch=3, dataset=dataset)
    assert resumed == uninterrupted
    assert itr.epoch == 3 and dataset.epochs[-1] == 3  # still epoch 3 for the iterator and dataset
    assert "building the batches of a run resumed in epoch 3 as in epoch 1" in caplog.text
    assert batches(fairseqs_own, epoch=3)[1] != uninterrupted  # what fairseq alone does
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fairseq_rope.patches"):
        batches(patched, epoch=1)
    assert "resumed" not in caplog.text  # an uninterrupted run: nothing changes, nothing logged


# ---------------------------------------------------------------- BF16_DEVICE: --bf16 without a TPU


def bf16_training(save_dir: Path, data_bin: Path, **env: str) -> subprocess.CompletedProcess:
    """One update of fairseq-train --bf16 --cpu (CPU standing in for CUDA: both are 'not TPU')."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSEQ_ROPE_NO_")}
    return subprocess.run(
        [str(BIN_DIR / "fairseq-train"), str(data_bin), *TINY_TRAINING, "--bf16", "--max-update", "1",
         "--max-tokens", "200", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(save_dir)],
        cwd=REPO, capture_output=True, text=True, env={**clean, "OMP_NUM_THREADS": "1", **env})


def test_fairseq_train_bf16_trains_in_bf16_on_the_device_at_hand(toy_data_bin, tmp_path):
    run = bf16_training(tmp_path / "bf16", toy_data_bin)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--bf16 without torch_xla: bf16 on CUDA or CPU, not TPU" in run.stdout + run.stderr
    state = torch.load(tmp_path / "bf16" / "checkpoint_last.pt", weights_only=False)
    assert state["cfg"]["common"]["bf16"] and not state["cfg"]["common"]["tpu"]
    assert state["optimizer_history"][-1]["optimizer_name"] == "FP16Optimizer"  # fp32 master weights
    # fairseq saves the model's weights as fp32; trained in bf16, every one is a bf16 number.
    weights = [w for w in state["model"].values() if w.is_floating_point()]
    assert all(w.dtype == torch.float32 for w in weights)
    assert all(torch.equal(w, w.bfloat16().float()) for w in weights)

    fairseqs_own = bf16_training(tmp_path / "tpu", toy_data_bin, FAIRSEQ_ROPE_NO_BF16_DEVICE="1")
    assert fairseqs_own.returncode != 0 and "xla_device" in fairseqs_own.stdout + fairseqs_own.stderr  # --bf16 meant --tpu


def test_bf16_keeps_fairseqs_tpu_where_torch_xla_is_installed(monkeypatch):
    monkeypatch.setattr(patches, "_xla_installed", lambda: True)
    args = argparse.Namespace(bf16=True, tpu=True)
    dataclass_utils.override_module_args(args)
    assert args.tpu
    monkeypatch.setattr(patches, "_xla_installed", lambda: False)
    dataclass_utils.override_module_args(args)
    assert not args.tpu


# ---------------------------------------------------------------- PREFETCH_EXIT: no abort at exit


# fairseq's own BufferedIterator over batches that each take one long torch op (which releases
# the GIL) to make: the process exits after the first batch, while its thread makes another.
PREFETCHING_AT_EXIT = """
import torch
torch.set_num_threads(1)
import fairseq_rope
from fairseq.data.iterators import BufferedIterator

def slow_batches():
    a = torch.randn(1500, 1500)
    for _ in range(100):
        yield a @ a

class Batches:
    def __len__(self):
        return 100
    def __iter__(self):
        return slow_batches()

next(BufferedIterator(20, Batches()))
print("done", flush=True)
"""


def exit_while_prefetching(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSEQ_ROPE_NO_")}
    return subprocess.run([sys.executable, "-c", PREFETCHING_AT_EXIT], cwd=REPO, capture_output=True,
                          text=True, env={**clean, "OMP_NUM_THREADS": "1", **env})


def test_a_process_ending_while_fairseq_prefetches_a_batch_exits_cleanly():
    run = exit_while_prefetching()
    assert run.returncode == 0 and run.stdout == "done\n", run.stderr[-3000:]
    assert "terminate called" not in run.stderr


def test_without_the_patch_fairseq_aborts_there():
    """The failure PREFETCH_EXIT prevents, with fairseq's own iterator: the thread is ended in torch's C++."""
    run = exit_while_prefetching(FAIRSEQ_ROPE_NO_PREFETCH_EXIT="1")
    assert run.returncode == -signal.SIGABRT and run.stdout == "done\n"
    assert "terminate called without an active exception" in run.stderr


def test_stopping_ends_a_thread_blocked_on_a_full_buffer_before_its_epoch_ends():
    made = []

    class Batches:
        def __len__(self) -> int:
            return 1000

        def __iter__(self):
            for i in range(1000):
                made.append(i)
                yield torch.tensor([i])

    batches = iterators.BufferedIterator(3, Batches())
    assert int(next(batches)) == 0
    thread = batches._consumer
    patches.stop_prefetching()
    assert not thread.is_alive()
    assert len(made) < 10  # stopped, not run to the end of the epoch
