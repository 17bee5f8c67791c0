"""scripts/evaluate.sh on bad input: a clear error, a non-zero exit, nothing written.

Its successful path runs in tests/experiments/test_config.py
(test_train_and_evaluate_scripts_end_to_end: train.sh then evaluate.sh).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import pytest
import torch

from tests.conftest import REPO



def snapshot(directory: Path) -> Dict[str, Tuple[int, bytes]]:
    """Every file and folder under ``directory``: (mtime, contents), to show that nothing changed."""
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, b"" if p.is_dir() else p.read_bytes())
            for p in sorted(directory.rglob("*"))}


def evaluate_sh(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "evaluate.sh"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def fake_run(save_dir: Path, updates=(100, 200)) -> Path:
    """A run directory with fairseq-named update checkpoints (never decoded: every test fails first)."""
    save_dir.mkdir(parents=True)
    for update in updates:
        torch.save({"cfg": {"model": argparse.Namespace(arch="transformer_rope_tiny")},
                    "model": {"w": torch.full((2,), float(update))}}, save_dir / f"checkpoint_1_{update}.pt")
    return save_dir


def test_a_finished_evaluation_is_refused_unless_forced(tmp_path):
    save = fake_run(tmp_path / "run")
    (save / "eval").mkdir()
    (save / "eval" / "results.json").write_text('{"bleu_tokenized": 27.5}\n')
    before = snapshot(tmp_path)
    result = evaluate_sh(save, tmp_path, cwd=tmp_path)
    assert result.returncode == 1
    assert (f"error: {save}/eval/results.json exists: {save} is evaluated already. "
            "Pass --force to evaluate it again") in result.stderr
    assert snapshot(tmp_path) == before


def test_too_few_checkpoints_fail_before_any_output(toy_data_bin, tmp_path):
    save = fake_run(tmp_path / "run")
    before = snapshot(tmp_path)
    result = evaluate_sh(save, toy_data_bin, "--force", cwd=tmp_path)
    assert result.returncode == 1
    assert (f"error: asked for the last 5 update checkpoints (checkpoint_<epoch>_<update>.pt) in {save}, "
            "found 2: checkpoint_1_100.pt, checkpoint_1_200.pt") in result.stderr
    assert snapshot(tmp_path) == before  # no eval/, no checkpoint_avg_last5.pt


@pytest.fixture(scope="module")
def data_bin_without_references(toy_data_bin, tmp_path_factory) -> Path:
    """The toy data-bin with its test set binarized source side only."""
    data_bin = tmp_path_factory.mktemp("no-refs") / "data-bin"
    shutil.copytree(toy_data_bin, data_bin)
    for suffix in ("bin", "idx"):
        (data_bin / f"test.en-de.de.{suffix}").unlink()
    return data_bin


def latin1_references(path: Path) -> Path:
    path.write_bytes(b"eins\nzwei\n" + "sch\xf6n\n".encode("latin-1") + b"vier\n" * 37)
    return path


# The other checks of the inputs (a missing --raw-ref, one of another test set)
# are the same `scoring --check` call, tested in-process in tests/evaluation/test_scoring.py
# (test_check_refuses_raw_references_that_do_not_fit).
@pytest.mark.parametrize("case", ["no references", "non-UTF-8 --raw-ref", "missing DATA_BIN"])
def test_bad_test_set_fails_before_averaging(case, toy_data_bin, data_bin_without_references, tmp_path):
    save = fake_run(tmp_path / "run", updates=(100, 200, 300, 400, 500))
    data_bin, extra = toy_data_bin, []
    if case == "no references":
        data_bin = data_bin_without_references
        expected = (f"error: test has no reference side in {data_bin}: test.en-de.de.bin, test.en-de.de.idx "
                    "missing (test set without references? binarize it with its target side")
    elif case == "non-UTF-8 --raw-ref":
        extra = ["--raw-ref", latin1_references(tmp_path / "refs.de")]
        expected = f"error: {tmp_path / 'refs.de'}: line 3 is not valid UTF-8 (invalid start byte at byte 3); convert"
    else:
        data_bin = tmp_path / "nowhere"
        expected = f"error: no such directory: {data_bin}"
    before = snapshot(tmp_path)
    result = evaluate_sh(save, data_bin, *extra, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before


def test_ctranslate2_refuses_fairseq_generate_arguments(tmp_path, toy_data_bin, capsys):
    """--engine ctranslate2 decodes in-process with deploy's decoding: arguments meant for
    fairseq-generate have nowhere to go, and are refused before anything is averaged."""
    from fairseq_rope.evaluation import evaluate

    save = fake_run(tmp_path / "run")
    before = snapshot(tmp_path)
    assert evaluate.main([str(save), str(toy_data_bin), "--engine", "ctranslate2", "--", "--beam", "5"]) == 2
    assert "which --engine ctranslate2 does not run: --beam 5" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
