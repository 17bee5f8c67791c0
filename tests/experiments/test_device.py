"""reproduce_table.sh --device: which device a run trains and decodes on, what its
subprocesses see, and what its record says; a GPU torch does not see is refused
before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fairseq_rope.experiments import reproduce, training
from fairseq_rope.experiments.device import CPU, Device
from fairseq_rope.experiments.table import ROWS, SCALES, TableError


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: f"NVIDIA H100 #{index}")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_auto_is_the_first_gpu_torch_sees_else_the_cpu(monkeypatch, no_gpu):
    assert Device.resolve("auto") == Device.resolve() == Device.resolve("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert Device.resolve("auto") == Device("cuda", 0)
    assert Device.resolve("CPU") == CPU  # still the CPU when asked, with a GPU there


def test_gpus_by_index(two_gpus):
    assert Device.resolve("cuda") == Device("cuda", 0) and str(Device.resolve("cuda:1")) == "cuda:1"
    with pytest.raises(TableError, match=r"--device cuda:2: torch sees 2 GPU\(s\), numbered 0 to 1"):
        Device.resolve("cuda:2")


@pytest.mark.parametrize("spec", ["tpu", "cpu:1", "cuda:x", "auto:0", "gpu"])
def test_other_names_are_refused(spec):
    with pytest.raises(TableError, match=r"expected auto, cpu, cuda or cuda:N"):
        Device.resolve(spec)


def test_subprocesses_see_the_device_only():
    assert CPU.environment({"PATH": "/bin"}) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert Device("cuda", 1).environment({})["CUDA_VISIBLE_DEVICES"] == "1"
    # cuda:N counts the GPUs this process sees: the N-th of those CUDA_VISIBLE_DEVICES already shows.
    assert Device("cuda", 1).environment({"CUDA_VISIBLE_DEVICES": "4, 6"})["CUDA_VISIBLE_DEVICES"] == "6"


def test_a_cpu_step_runs_in_a_process_that_sees_no_gpu(monkeypatch):
    ran = {}

    def run(command, env):
        ran.update(command=command, env=env)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(reproduce.subprocess, "run", run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    reproduce.run_step([sys.executable, "-V"], CPU)
    assert ran["command"] == [sys.executable, "-V"] and ran["env"]["CUDA_VISIBLE_DEVICES"] == ""
    reproduce.run_step([sys.executable, "-V"], Device("cuda", 1))
    assert ran["env"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_record_names_the_device(two_gpus, tmp_path):
    # train.sh's process sees the run's GPU only (CUDA_VISIBLE_DEVICES), as its GPU 0.
    assert training.training_provenance(["data-bin", "--arch", "x"])["train_device"] == "NVIDIA H100 #0"
    assert training.training_provenance(["data-bin", "--cpu"])["train_device"] == "cpu"
    rope, multi30k = ROWS["rope"], SCALES["multi30k"]
    assert reproduce.reproduce_command(rope, multi30k, 2, device=Device("cuda", 1)) == (
        "scripts/reproduce_table.sh rope --scale multi30k --seed 2 --device cuda:1")
    assert reproduce.reproduce_command(rope, multi30k, 2, device=CPU) == (
        "scripts/reproduce_table.sh rope --scale multi30k --seed 2")


def test_cuda_without_a_gpu_is_a_clear_error_and_writes_nothing(no_gpu, tmp_path, capsys):
    assert reproduce.main(["rope", "--scale", "multi30k", "--device", "cuda", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: --device cuda: torch sees no CUDA device" in err and "--device cpu" in err
    assert not list(tmp_path.iterdir())


def test_the_device_is_chosen_by_device_not_by_an_extra_cpu_flag(tmp_path):
    with pytest.raises(TableError, match=r"--cpu cannot be an extra fairseq-train argument.*--device"):
        reproduce.reproduce_row(ROWS["rope"], SCALES["demo"], 1, tmp_path, ["--cpu"])
    assert not list(tmp_path.iterdir())
