"""`make demo`'s pipeline, whole: scripts/demo.sh on the embedded corpus (about 5 minutes on
2 cores, hence slow) reaches the BLEU the README promises, and a rerun redoes nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

DEMO_SH = REPO / "scripts" / "demo.sh"


@pytest.mark.slow
def test_demo_pipeline_translates_the_demo_corpus_above_90_bleu(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    first = subprocess.run([str(DEMO_SH), str(work)], capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-5000:]
    results = json.loads((work / "checkpoints" / "eval" / "results.json").read_text())
    assert results["num_sentences"] == 500
    assert results["bleu_tokenized"] > 90 and results["sacrebleu"] > 90, results
    assert len(results["averaged_checkpoints"]) == 5

    stamp = os.stat(work / "checkpoints" / "checkpoint_last.pt").st_mtime_ns
    again = subprocess.run([str(DEMO_SH), str(work)], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-5000:]
    assert "already trained and evaluated" in again.stderr
    assert os.stat(work / "checkpoints" / "checkpoint_last.pt").st_mtime_ns == stamp
