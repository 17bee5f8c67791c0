"""fairseq's data-parallel training with this plugin: 2 processes under torchrun
(gloo, CPU) against one process that sees the same global batch.

fairseq shards each epoch's (shuffled, seed + epoch) batch list round-robin over
ranks (``ShardedIterator``: rank r gets batches r, r + W, ...), and with
``--update-freq 2`` one process groups consecutive batches (``GroupedIterator``:
2i and 2i + 1 per update). So update i of the 2-rank run and of the
update-freq-2 run sum the gradients of the same two batches and normalise by
the same total sample size: losses and weights must agree.

On CPU, fairseq cannot infer the distributed setup from torchrun's environment
(it computes ``RANK % torch.cuda.device_count()``, a division by zero without
GPUs), so the entry point below passes what it would have inferred. It also
saves each rank's weights, because fairseq itself writes checkpoints on rank 0
only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from fairseq_rope.checkpoints import load_checkpoint
from tests.conftest import BIN_DIR, REPO, TINY_TRAINING

WORLD_SIZE = 2
MAX_UPDATE = 6  # the toy epoch is 5 updates of 2 batches: update 6 is after the reshuffle
TRAINING = [
    *TINY_TRAINING,  # dropout 0: no randomness after initialisation
    "--max-update", str(MAX_UPDATE), "--save-interval-updates", "3", "--disable-validation",
    "--no-epoch-checkpoints", "--num-workers", "0", "--required-batch-size-multiple", "1",
    "--log-format", "json", "--log-interval", "1",
]
# The first three: what fairseq infers from torchrun's environment when GPUs
# exist. gloo and legacy_ddp for CPU: fairseq's pytorch_ddp wrapper passes
# device_ids=[device_id], which PyTorch refuses for CPU modules.
DDP_OPTIONS = [
    "--distributed-world-size", str(WORLD_SIZE), "--distributed-init-method", "env://",
    "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
]

# fairseq-train's own cli_main, plus this rank's --distributed-rank (per-process,
# so it cannot be on the shared command line) and a dump of this rank's weights
# after every validate-and-save step (the last one ends training).
ENTRY_POINT = '''\
import os
import sys

import torch
from fairseq_cli import train

dump_dir = sys.argv.pop(1)
validate_and_save = train.validate_and_save


def validate_and_save_and_dump(cfg, trainer, *args, **kwargs):
    result = validate_and_save(cfg, trainer, *args, **kwargs)
    state = {"num_updates": trainer.get_num_updates(), "model": trainer.get_model().state_dict()}
    torch.save(state, os.path.join(dump_dir, f"rank{trainer.data_parallel_rank}.pt"))
    return result


train.validate_and_save = validate_and_save_and_dump
sys.argv += ["--distributed-rank", os.environ["RANK"]]
train.cli_main()
'''


@dataclass(frozen=True)
class Run:
    save_dir: Path
    log: List[Dict[str, Any]]  # train_inner records, one per update
    output: str


@dataclass(frozen=True)
class Runs:
    ddp: Run
    single: Run
    rank_dumps: Path


def train_inner_records(output: str) -> List[Dict[str, Any]]:
    return [json.loads(line.split("| train_inner | ", 1)[1])
            for line in output.splitlines() if "| train_inner | " in line]


def cpu_env() -> Dict[str, str]:
    # No GPU may be picked up, whatever the machine: this test is about the CPU/gloo path.
    # Unbuffered: both ranks share one log file, so each must write whole lines.
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def ddp_command(entry: Path, dumps: Path, data_bin: Path, save_dir: Path, *extra: str) -> List[str]:
    """fairseq-train under torchrun, WORLD_SIZE gloo processes (TRAINING, then ``extra``)."""
    # --standalone: torchrun binds its rendezvous to a free localhost port itself.
    return [str(BIN_DIR / "torchrun"), "--standalone", "--nnodes", "1", "--nproc_per_node", str(WORLD_SIZE),
            str(entry), str(dumps), str(data_bin), *TRAINING, *DDP_OPTIONS, "--save-dir", str(save_dir), *extra]


@pytest.fixture(scope="module")
def runs(toy_data_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("distributed")
    entry, dumps = root / "ddp_entry.py", root / "rank_weights"
    entry.write_text(ENTRY_POINT)
    dumps.mkdir()

    commands = {
        "ddp": ddp_command(entry, dumps, toy_data_bin, root / "ddp"),
        "single": [str(BIN_DIR / "fairseq-train"), str(toy_data_bin), *TRAINING,
                   "--update-freq", str(WORLD_SIZE), "--distributed-world-size", "1",
                   "--save-dir", str(root / "single")],
    }
    # Both runs at once: they are independent, and most of their time is start-up.
    # Output goes to files, so neither run can block on a full pipe.
    logs = {name: root / f"{name}.log" for name in commands}
    processes = {}
    try:
        for name, command in commands.items():
            with open(logs[name], "w") as log:
                processes[name] = subprocess.Popen(command, cwd=REPO, env=cpu_env(),
                                                   stdout=log, stderr=subprocess.STDOUT)
        for process in processes.values():
            process.wait(timeout=600)
    finally:
        for process in processes.values():  # never leave a hung run behind
            if process.poll() is None:
                process.terminate()  # torchrun passes SIGTERM on to its workers
                process.wait(timeout=60)
    results = {}
    for name, process in processes.items():
        output = logs[name].read_text()
        assert process.returncode == 0, f"{name} run failed:\n{output[-6000:]}"
        results[name] = Run(root / name, train_inner_records(output), output)
    return Runs(ddp=results["ddp"], single=results["single"], rank_dumps=dumps)


def run_ddp(command: List[str], log: Path, **env: str) -> subprocess.CompletedProcess:
    with open(log, "w") as out:
        result = subprocess.run(command, cwd=REPO, env={**cpu_env(), **env}, stdout=out,
                                stderr=subprocess.STDOUT, timeout=600)
    return subprocess.CompletedProcess(command, result.returncode, log.read_text())


def test_both_ranks_train_and_end_with_identical_weights(runs: Runs) -> None:
    for rank in range(WORLD_SIZE):
        assert f"as rank {rank}" in runs.ddp.output, f"rank {rank} never joined the process group"
    dumps = [torch.load(runs.rank_dumps / f"rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    assert [d["num_updates"] for d in dumps] == [MAX_UPDATE] * WORLD_SIZE
    reference, other = dumps[0]["model"], dumps[1]["model"]
    assert sorted(reference) == sorted(other)
    differing = [name for name in reference if not torch.equal(reference[name], other[name])]
    assert not differing, f"rank 1's weights differ from rank 0's in {differing}"
    # The checkpoint fairseq wrote (on rank 0) is that shared final state.
    saved = load_checkpoint(runs.ddp.save_dir / "checkpoint_last.pt")["model"]
    assert sorted(saved) == sorted(reference)
    assert all(torch.equal(saved[name], reference[name]) for name in saved)


def test_one_checkpoint_set_is_written(runs: Runs) -> None:
    ddp_files = sorted(p.name for p in runs.ddp.save_dir.iterdir())
    # Exactly what one process writes: no second copy or per-rank files from rank 1.
    assert ddp_files == sorted(p.name for p in runs.single.save_dir.iterdir())
    assert ddp_files == ["checkpoint_1_3.pt", "checkpoint_2_6.pt", "checkpoint_last.pt"]
    distributed = load_checkpoint(runs.ddp.save_dir / "checkpoint_last.pt")["cfg"]["distributed_training"]
    assert distributed["distributed_world_size"] == WORLD_SIZE
    # Only rank 0 logs training progress: one record per update, not one per rank.
    assert [int(r["num_updates"]) for r in runs.ddp.log] == list(range(1, MAX_UPDATE + 1))


def test_loss_per_update_matches_one_process_with_update_freq_2(runs: Runs) -> None:
    ddp, single = runs.ddp.log, runs.single.log
    assert len(ddp) == len(single) == MAX_UPDATE
    assert {r["epoch"] for r in ddp} == {1, 2}, "the comparison should cross an epoch boundary"
    for d, s in zip(ddp, single):
        # The same global batch: identical sentence and target-token counts.
        assert (d["bsz"], d["wpb"]) == (s["bsz"], s["wpb"]), (d, s)
        # fairseq logs 3 decimals: allow one unit in the last place.
        for key in ("loss", "nll_loss", "gnorm"):
            assert abs(float(d[key]) - float(s[key])) <= 1e-3, (key, d, s)


def test_weights_match_one_process_with_update_freq_2(runs: Runs) -> None:
    for name in ("checkpoint_1_3.pt", "checkpoint_2_6.pt", "checkpoint_last.pt"):
        ddp = load_checkpoint(runs.ddp.save_dir / name)["model"]
        single = load_checkpoint(runs.single.save_dir / name)["model"]
        assert sorted(ddp) == sorted(single)
        for key in ddp:
            # Summation order of the gradient reduction may differ: close, not bitwise.
            torch.testing.assert_close(ddp[key], single[key], rtol=1e-4, atol=1e-6, msg=f"{name}: {key}")


def test_a_stopped_run_resumes_on_every_rank_and_ends_as_the_uninterrupted_one(
        runs: Runs, toy_data_bin: Path, tmp_path: Path) -> None:
    """3 updates, then the same command to 6: rank 0 loads checkpoint_last.pt and broadcasts its
    state, which every other rank must unpickle (fairseq's DictConfig in it: BROADCAST_LOAD). Both
    ranks then end with the weights of the run never stopped, bit for bit."""
    entry, dumps = tmp_path / "ddp_entry.py", tmp_path / "rank_weights"
    entry.write_text(ENTRY_POINT)
    dumps.mkdir()
    save = tmp_path / "resumed"
    first = run_ddp(ddp_command(entry, dumps, toy_data_bin, save, "--max-update", "3"), tmp_path / "first.log")
    assert first.returncode == 0, first.stdout[-6000:]

    # The control: without the patch, rank 1 refuses rank 0's state and the resume fails.
    control = tmp_path / "control"
    shutil.copytree(save, control)
    refused = run_ddp(ddp_command(entry, tmp_path, toy_data_bin, control), tmp_path / "control.log",
                      FAIRSEQ_ROPE_NO_BROADCAST_LOAD="1")
    assert refused.returncode != 0 and "Weights only load failed" in refused.stdout
    assert "DictConfig" in refused.stdout

    resumed = run_ddp(ddp_command(entry, dumps, toy_data_bin, save), tmp_path / "resumed.log")
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    assert "Loaded checkpoint" in resumed.stdout
    assert [int(r["num_updates"]) for r in train_inner_records(resumed.stdout)] == [4, 5, 6]
    reference = load_checkpoint(runs.ddp.save_dir / "checkpoint_last.pt")["model"]
    for rank in range(WORLD_SIZE):
        dump = torch.load(dumps / f"rank{rank}.pt", weights_only=True)
        assert dump["num_updates"] == MAX_UPDATE
        assert sorted(dump["model"]) == sorted(reference)
        differing = [k for k in reference if not torch.equal(dump["model"][k], reference[k])]
        assert not differing, f"rank {rank} differs from the uninterrupted run in {differing}"
