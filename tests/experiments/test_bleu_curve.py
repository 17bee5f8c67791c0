"""BLEU against updates from a run's kept checkpoints (scripts/bleu_curve.py)."""

from __future__ import annotations

import json

import pytest

from fairseq_rope.experiments import bleu_curve
from fairseq_rope.experiments.bleu_curve import with_plateau
from tests.conftest import TINY_TRAINING, fairseq_cli


def test_plateau_is_the_best_point():
    points = [{"update": 100, "bleu_tokenized": 10.0}, {"update": 200, "bleu_tokenized": 20.0},
              {"update": 300, "bleu_tokenized": 19.0}]
    assert with_plateau(points) == {"metric": "bleu_tokenized", "best_update": 200, "best": 20.0}
    assert [p["fraction_of_best"] for p in points] == [0.5, 1.0, 0.95]


@pytest.mark.slow  # 35 s on a quiet 2-core machine (2026-11-25): make test's budget
def test_curve_of_a_short_run(toy_data_bin, tmp_path):
    save = tmp_path / "run"
    fairseq_cli("fairseq-train", [
        toy_data_bin, *TINY_TRAINING, "--max-update", "60", "--save-dir", save, "--no-epoch-checkpoints",
        "--save-interval-updates", "20", "--keep-interval-updates", "-1", "--disable-validation"])
    out = tmp_path / "curve"
    assert bleu_curve.main([str(save), str(toy_data_bin), "--out", str(out), "--window", "2"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [p["update"] for p in report["points"]] == [40, 60]
    assert [len(p["averaged"]) for p in report["points"]] == [2, 2]
    assert all(p["sacrebleu"] is not None for p in report["points"])  # raw/valid.de beside data-bin
    best = max(p["bleu_tokenized"] for p in report["points"])
    fractions = [p["fraction_of_best"] for p in report["points"]]
    assert max(fractions) == 1.0 if best > 0 else fractions == [None, None]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "| 60 |" in out.with_suffix(".md").read_text()

    # A rerun reuses the measured points (decoding nothing) and adds new checkpoints.
    calls = []
    original = bleu_curve.measure_point
    bleu_curve.measure_point = lambda *a: calls.append(a) or original(*a)
    try:
        assert bleu_curve.main([str(save), str(toy_data_bin), "--out", str(out), "--window", "2"]) == 0
    finally:
        bleu_curve.measure_point = original
    assert calls == []


def test_a_curve_that_never_scores_has_no_fractions():
    points = [{"update": 100, "bleu_tokenized": 0.0}]
    assert with_plateau(points)["best"] == 0.0 and points[0]["fraction_of_best"] is None
