"""Preparation SIGKILLed in the middle of a step resumes, rerun unchanged, to byte-identical outputs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from .conftest import REPO, make_pairs, write_parallel

PREPARE = REPO / "scripts" / "prepare_parallel.sh"


def prepare_command(corpus: Path, out: Path) -> List[str]:
    return [str(PREPARE), "--src", "en", "--tgt", "fr", "--trainpref", str(corpus / "train"),
            "--validpref", str(corpus / "dev"), "--testpref", str(corpus / "test"),
            "--vocab-size", "300", "--workers", "2", "--chunk-lines", "100", str(out)]


def outputs(out: Path) -> Dict[str, bytes]:
    """Every file the preparation made, but its bookkeeping (markers with times, the hash cache)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".done" not in p.relative_to(out).parts}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted preparation, moved to ``ref/`` so that other runs can use its path ``out/``
    (fairseq-preprocess's log in data-bin/ names its output directory)."""
    base = tmp_path_factory.mktemp("prepare-resume")
    corpus = base / "corpus"
    write_parallel(corpus / "train", make_pairs(3_000, seed=21, min_words=3, max_words=15), "en", "fr")
    write_parallel(corpus / "dev", make_pairs(40, seed=22), "en", "fr")
    write_parallel(corpus / "test", make_pairs(40, seed=23), "en", "fr")
    result = subprocess.run(prepare_command(corpus, base / "out"), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (base / "out").rename(base / "ref")
    return base


# Killed as soon as the step reports it is running: tokenization (a pool of forked
# workers writing a temporary file; ~0.6 s on 3k lines) and binarization
# (fairseq-preprocess, a child process that takes seconds just to start).
@pytest.mark.parametrize("step", ["tokenize train.en", pytest.param("binarize", marks=pytest.mark.slow)])  # 28 s
def test_preparation_killed_mid_step_resumes_to_identical_outputs(reference, step):
    out = reference / "out"
    shutil.rmtree(out, ignore_errors=True)
    command = prepare_command(reference / "corpus", out)
    killed = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True)
    for line in killed.stdout:
        if line.rstrip().endswith(f"{step}: running"):
            os.killpg(killed.pid, signal.SIGKILL)  # the script, its worker pool and fairseq-preprocess
            break
    else:
        pytest.fail(f"the preparation never reported '{step}: running'")
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL

    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"{step}: running" in rerun.stdout  # the interrupted step was redone...
    assert "import: skip (done)" in rerun.stdout  # ...and the steps finished before it were not
    assert outputs(out) == outputs(reference / "ref")
    assert not [p for p in out.rglob("*.tmp")]  # no leftovers of the killed run
    assert sorted(p.name for p in (out / ".done").glob("*.done")) == \
        sorted(p.name for p in (reference / "ref" / ".done").glob("*.done"))
