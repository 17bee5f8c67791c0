"""Crash and resume of scripts/train.sh, and its refusal of bad input.

A training run SIGKILLed in the middle of an epoch and rerun unchanged ends
with the same bits as a run never interrupted; train.sh refuses a missing or
incomplete DATA_BIN and a SAVE_DIR of another run before writing anything.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from fairseq_rope.experiments import training
from fairseq_rope.experiments.train_log import SAVED_CHECKPOINT, parse_train_log
from fairseq_rope.checkpoints import load_checkpoint
from tests.conftest import REPO

TRAIN_SH = REPO / "scripts" / "train.sh"
CONFIG = "rope_demo"  # dropout 0.1: resuming must restore the dropout RNG too
# 18 updates per epoch on the toy corpus; a checkpoint every 7 updates falls
# mid-epoch, and 40 updates end in the middle of epoch 3.
SCHEDULE = ["--max-tokens", "1000", "--max-update", "40", "--save-interval-updates", "7",
            "--warmup-updates", "20", "--log-interval", "5"]
KILL_AFTER = "checkpoint_2_28.pt"  # a checkpoint in the middle of epoch 2
LOADED = re.compile(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch (\d+) @ (\d+) updates\)")


def train_sh(*args: object, cwd: Path, **kwargs) -> subprocess.Popen:
    # One thread each: the kill test runs two trainings side by side, and two processes
    # with two OpenMP threads each on two cores spin against each other (several times slower).
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}
    return subprocess.Popen([str(TRAIN_SH), *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **kwargs)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate()
    assert proc.returncode == 0, out[-5000:]
    return out


def kill_after(proc: subprocess.Popen, line_part: str) -> List[str]:
    """Read ``proc``'s output until a line containing ``line_part``, then SIGKILL its process group."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line_part in line:
            os.killpg(proc.pid, signal.SIGKILL)  # train.sh, tee and fairseq-train alike
            break
    proc.communicate()
    assert lines and line_part in lines[-1], "".join(lines[-50:])
    return lines


def checkpoints(save_dir: Path) -> Dict[str, dict]:
    return {p.name: load_checkpoint(p) for p in sorted(save_dir.glob("checkpoint*.pt"))}


def assert_same_tensors(a, b, where: str) -> None:
    """Equal nested state (dicts, lists, tensors compared bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_training_killed_mid_epoch_resumes_bit_identically(toy_data_bin, tmp_path):
    """Also the guard of the RESUME_BATCHES patch (fairseq_rope.patches): without it, the resumed run's
    checkpoints from update 35 on differ (other batches in epoch 2 and later)."""
    # The uninterrupted run and the first attempt of the other run side by side.
    uninterrupted = train_sh(CONFIG, toy_data_bin, "A", *SCHEDULE, cwd=tmp_path)
    killed = train_sh(CONFIG, toy_data_bin, "B", *SCHEDULE, cwd=tmp_path, start_new_session=True)
    before_kill = kill_after(killed, f"Saved checkpoint B/{KILL_AFTER}")
    assert killed.returncode == -signal.SIGKILL
    assert not any("done training" in line for line in before_kill)
    for name, state in checkpoints(tmp_path / "B").items():  # everything the kill left loads
        assert "model" in state, name

    resumed = finish(train_sh(CONFIG, toy_data_bin, "B", *SCHEDULE, cwd=tmp_path))
    epoch, updates = map(int, LOADED.search(resumed).groups())
    # fairseq's own lines after each save, as train.sh's convergence stop reads them.
    saved = {int(m.group(1)) for m in map(SAVED_CHECKPOINT.search, resumed.splitlines()) if m}
    assert {35, 40} <= saved
    assert epoch == 2 and 28 <= updates < 36  # mid-epoch: epoch 2 ends at update 36
    finish(uninterrupted)

    a, b = checkpoints(tmp_path / "A"), checkpoints(tmp_path / "B")
    assert a.keys() == b.keys()
    assert {"checkpoint_2_35.pt", "checkpoint_last.pt"} <= a.keys()  # written after the resume
    for name in a:  # model, optimizer (Adam moments, step), lr schedule, iterator position, val loss
        for key in ("model", "last_optimizer_state"):
            assert_same_tensors(a[name][key], b[name][key], f"{name}:{key}")
        # One history entry per invocation: the last one holds the lr schedule and update count.
        assert_same_tensors(a[name]["optimizer_history"][-1], b[name]["optimizer_history"][-1], f"{name}:history")
        for key in ("train_iterator", "val_loss", "best"):  # not the meters: they hold wall times
            assert_same_tensors(a[name]["extra_state"][key], b[name]["extra_state"][key], f"{name}:{key}")
    assert a["checkpoint_last.pt"]["optimizer_history"][-1]["num_updates"] == 40
    assert a["checkpoint_last.pt"]["extra_state"]["train_iterator"]["epoch"] == 3


def test_a_kill_during_a_checkpoint_copy_leaves_the_previous_checkpoint(tmp_path):
    """fairseq copies checkpoint_last.pt from the first file of a save; the copy must be atomic."""
    src, dst = tmp_path / "checkpoint_1_7.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 100_000)
    dst.write_bytes(b"old checkpoint")
    # A child process killed in the middle of writing the copy.
    code = (
        "import os, shutil, signal, fairseq_rope\n"
        "from fairseq.file_io import PathManager\n"
        "def half_then_die(src, dst, *args, **kwargs):\n"
        "    with open(src, 'rb') as s, open(dst, 'wb') as d:\n"
        "        d.write(s.read(1000)); d.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "shutil.copyfile = half_then_die  # what fairseq's PathManager.copy calls\n"
        f"PathManager.copy({str(src)!r}, {str(dst)!r}, overwrite=True)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert dst.read_bytes() == b"old checkpoint"
    from fairseq.file_io import PathManager

    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()


# --- Bad input: refused before anything is created or changed


def run_training_check(*args: object, cwd: Path, capsys) -> Tuple[int, str, str]:
    """train.sh's checks in-process, without training (``training.check``); (status, stdout, stderr)."""
    os.chdir(cwd)
    status = training.check([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def snapshot(directory: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def fake_run(save_dir: Path, data_bin: Path, *extra: str, cwd: Path, capsys) -> None:
    """A SAVE_DIR as train.sh leaves it (command.txt) with a checkpoint (its bytes are not read)."""
    status, _, err = run_training_check(CONFIG, data_bin, save_dir, "--", *extra, cwd=cwd, capsys=capsys)
    assert status == 0, err
    (save_dir / "checkpoint_last.pt").write_bytes(b"not read by the checks")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # restored after the test
    return tmp_path


def test_missing_or_incomplete_data_bin_is_refused(toy_data_bin, in_tmp, capsys):
    save = in_tmp / "save"
    status, out, err = run_training_check(CONFIG, in_tmp / "nowhere", save, cwd=in_tmp, capsys=capsys)
    assert status == 2 and not out
    assert f"DATA_BIN {in_tmp / 'nowhere'}: no such directory" in err and "prepare_parallel.sh" in err

    partial = in_tmp / "partial"
    shutil.copytree(toy_data_bin, partial)
    for path in partial.glob("valid.*.bin"):
        path.unlink()
    status, _, err = run_training_check(CONFIG, partial, save, cwd=in_tmp, capsys=capsys)
    assert status == 2 and "the binarized 'valid' split is incomplete (valid.en-de.de.bin" in err
    assert "--disable-validation" not in err
    # ...unless validation is off; then the training split is all it needs.
    status, _, err = run_training_check(CONFIG, partial, in_tmp / "other", "--", "--disable-validation",
                                        cwd=in_tmp, capsys=capsys)
    assert status == 0, err

    for path in partial.glob("dict.*.txt"):
        path.unlink()
    status, _, err = run_training_check(CONFIG, partial, save, cwd=in_tmp, capsys=capsys)
    assert status == 2 and f"DATA_BIN {partial}: no dictionary (dict.*.txt)" in err
    assert not save.exists()


def test_save_dir_of_a_different_run_is_refused_unless_forced(toy_data_bin, in_tmp, capsys):
    save = in_tmp / "save"
    fake_run(save, toy_data_bin, "--max-update", "10", cwd=in_tmp, capsys=capsys)
    before = snapshot(save)

    # Another config, and another option of the same config: refused, nothing touched.
    for args, difference in [(("rpe_demo",), "--arch: transformer_rope_tiny -> transformer_rpe_tiny"),
                             ((CONFIG, "--", "--dropout", "0.3"), "--dropout: 0.1 -> 0.3"),
                             ((CONFIG, "--", "--fp16"), "--fp16: (not given) -> (flag set)")]:
        config, *rest = args
        status, out, err = run_training_check(config, toy_data_bin, save, *rest, cwd=in_tmp, capsys=capsys)
        assert status == 2 and not out
        assert f"SAVE_DIR {save} holds checkpoints of a different run" in err and difference in err, err
        assert "--force" in err
        assert snapshot(save) == before

    # The same run from another directory (the same data by a relative path), continued for
    # longer and logged more often: resumes.
    sub = in_tmp / "sub"
    sub.mkdir()
    status, out, err = run_training_check(CONFIG, os.path.relpath(toy_data_bin, sub), "../save", "--",
                                          "--max-update", "20", "--log-interval", "1", cwd=sub, capsys=capsys)
    assert status == 0, err
    assert out.split("\0")[-5:-1] == ["--max-update", "20", "--log-interval", "1"]
    assert (save / "command.txt").read_text().splitlines()[0] == f"cd {sub}"

    # How the processes of a distributed job find each other changes with every job.
    status, _, err = run_training_check(CONFIG, toy_data_bin, save, "--", "--max-update", "20",
                                        "--log-interval", "1", "--distributed-port", "12345",
                                        cwd=in_tmp, capsys=capsys)
    assert status == 0, err

    # --force continues with the new arguments, which become the recorded command.
    status, _, err = run_training_check("--force", CONFIG, toy_data_bin, save, "--", "--dropout", "0.3",
                                        cwd=in_tmp, capsys=capsys)
    assert status == 0, err
    assert (save / "command.txt").read_text().rstrip().endswith("--dropout 0.3")
    status, _, err = run_training_check(CONFIG, toy_data_bin, save, "--", "--dropout", "0.3",
                                        cwd=in_tmp, capsys=capsys)
    assert status == 0, err


def test_checkpoints_without_a_recorded_command_need_force(toy_data_bin, in_tmp, capsys):
    save = in_tmp / "save"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"made by fairseq-train directly")
    status, _, err = run_training_check(CONFIG, toy_data_bin, save, cwd=in_tmp, capsys=capsys)
    assert status == 2 and "holds checkpoints (checkpoint_last.pt, ...) but no readable command.txt" in err
    assert sorted(p.name for p in save.iterdir()) == ["checkpoint_last.pt"]
    status, _, err = run_training_check(CONFIG, toy_data_bin, save, "--", "--force", cwd=in_tmp, capsys=capsys)
    assert status == 2 and "--force goes before CONFIG" in err
    assert run_training_check("--force", CONFIG, toy_data_bin, save, cwd=in_tmp, capsys=capsys)[0] == 0


def test_train_sh_refuses_bad_input_with_a_clear_message(toy_data_bin, tmp_path):
    """The shell entry point: exit status 2, the message, and no SAVE_DIR."""
    missing = subprocess.run([str(TRAIN_SH), CONFIG, tmp_path / "nowhere", tmp_path / "save"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode == 2
    assert f"error: DATA_BIN {tmp_path / 'nowhere'}: no such directory" in missing.stderr
    assert not (tmp_path / "save").exists()
    for option, value, message in [("--rope-dim", "7", "error: invalid option: --rope-dim must be an even number"),
                                   ("--rope-layuot", "half", "unrecognized arguments: --rope-layuot half")]:
        bad = subprocess.run([str(TRAIN_SH), CONFIG, toy_data_bin, tmp_path / "save", option, value],
                             capture_output=True, text=True, cwd=tmp_path)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert not (tmp_path / "save").exists()
    usage = subprocess.run([str(TRAIN_SH), "--force", CONFIG], capture_output=True, text=True, cwd=tmp_path)
    assert usage.returncode == 2 and "usage:" in usage.stderr and "[--force]" in usage.stderr


def test_train_sh_runs_fairseq_train_under_the_launcher(toy_data_bin, tmp_path):
    """$LAUNCHER (e.g. torchrun) gets fairseq-train's path and the resolved arguments."""
    launcher = tmp_path / "launcher.sh"
    launcher.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/launched"\nexec "$@"\n')
    launcher.chmod(0o755)
    save = tmp_path / "save"
    env = {"LAUNCHER": f"{launcher} "}
    finish(train_sh(CONFIG, toy_data_bin, save, "--max-update", "1", "--max-tokens", "1000",
                    "--save-interval-updates", "1", cwd=tmp_path, env=env))
    launched = (tmp_path / "launched").read_text().splitlines()
    assert launched[0] == str(Path(sys.executable).parent / "fairseq-train")
    assert launched[1] == str(toy_data_bin) and launched[-2:] == ["--save-interval-updates", "1"]
    assert (save / "checkpoint_last.pt").exists()


# --- A resumed run stops where its convergence rule does


RESUMED_VALIDATIONS = "".join(
    f"2026-11-25 12:00:00 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss 4.1 | bleu {b} "
    f"| num_updates {u} | best_bleu 40.64\n"
    for e, u, b in ((35, 4378, 40.64), (36, 4577, 39.97), (38, 4776, 38.99)))


def fairseq_lines(update: int, bleu: float) -> List[str]:
    """fairseq-train's log of one validation and the save that follows it (its own format)."""
    return [
        f"2026-11-25 17:16:41 | INFO | valid | epoch 042 | valid on 'valid' subset | loss 4.07 | nll_loss 2.367 "
        f"| ppl 5.16 | bleu {bleu} | wps 791.4 | wpb 2650 | bsz 168 | num_updates {update} | best_bleu 40.64\n",
        f"2026-11-25 17:16:42 | INFO | fairseq.checkpoint_utils | Saved checkpoint /runs/seed1/checkpoint_42_{update}.pt "
        f"(epoch 42 @ {update} updates, score {bleu}) (writing took 0.31 seconds)\n",
    ]


def test_the_rule_counts_the_validations_of_earlier_invocations_and_waits_for_the_save():
    """Best 40.64 at 4378, then two validations without beating it before the resume: with
    --patience 4 the rule stops the run at its 2nd validation after resuming (fairseq, counting
    from its own start, would go on for 3 more), once that checkpoint is saved."""
    earlier = parse_train_log(RESUMED_VALIDATIONS.splitlines())
    on_bleu = ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]
    stop = training.StopAtConvergence([*on_bleu, "--patience", "4", "--max-update", "7960"], earlier)
    assert stop.converged() is None
    first, second = fairseq_lines(4975, 39.83), fairseq_lines(5174, 39.82)
    assert [stop.after(line) for line in first] == [None, None]
    assert stop.after(second[0]) is None  # the rule is met, but the checkpoint is not saved yet
    converged = stop.after(second[1])
    assert (converged.update, converged.reason, converged.best_update) == (5174, "patience", 4378)
    for never in (training.StopAtConvergence([*on_bleu, "--max-update", "7960"], earlier),  # no --patience
                  training.StopAtConvergence(["--patience", "4"], earlier)):  # patience on valid loss
        assert all(never.after(line) is None for line in first + second) and never.converged() is None


# A stand-in for fairseq-train: logs two validations and their saves, then waits to be stopped
# (SIGALRM ends it with an error after 60 s if nobody does).
FAKE_FAIRSEQ = """
import signal, sys
sys.stdout.write(sys.argv[1])
sys.stdout.flush()
signal.alarm(60)
signal.pause()
"""


def test_train_sh_stops_fairseq_train_at_the_rule_and_logs_why(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(RESUMED_VALIDATIONS)
    stop = training.StopAtConvergence.of_run(
        tmp_path, ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--patience", "4"])
    lines = "".join(fairseq_lines(4975, 39.83) + fairseq_lines(5174, 39.82))
    assert training.run_logged([sys.executable, "-c", FAKE_FAIRSEQ, lines], log, stop) == 0
    text = log.read_text()
    assert text.startswith(RESUMED_VALIDATIONS + lines)
    assert text.endswith("train.sh stopped fairseq-train: converged at update 5174 by its rule (--patience 4, "
                         "--max-update 0: patience; best valid BLEU 40.64 at 4378)\n")
    assert parse_train_log(text.splitlines()).invocations == []  # the note is no invocation's header
    assert "train.sh stopped fairseq-train" in capsys.readouterr().out


def test_train_sh_does_not_start_a_run_its_rule_has_stopped(toy_data_bin, in_tmp, capsys):
    save = in_tmp / "save"
    save.mkdir()
    (save / "train.log").write_text(RESUMED_VALIDATIONS + "".join(fairseq_lines(4975, 39.83)))
    before = snapshot(save)
    assert training.main([CONFIG, str(toy_data_bin), str(save), "--patience", "3", "--max-update", "7960",
                          "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]) == 0
    assert snapshot(save) == before  # nothing trained, nothing logged
    assert "converged at update 4975 by its rule (--patience 3" in capsys.readouterr().err
