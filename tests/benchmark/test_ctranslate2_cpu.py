"""The CTranslate2 benchmark (scripts/benchmark_ctranslate2.py): its targets and report from
given measurements (fast), and the script end to end on a tiny trained model (slow: a few
decode processes). Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, List

import pytest

from fairseq_rope.benchmark import ctranslate2_cpu as bench
from tests.conftest import REPO
from tests.deploy.conftest import checkpoint, deploy_data, trained  # noqa: F401 (fixtures of the slow test)


def measurements(seconds: Dict[str, List[float]], hypotheses: Dict[str, List[str]],
                 bleu: Dict[str, float]) -> dict:
    """What :func:`bench.benchmark` returns, for models rope and sinusoidal at 1 thread."""
    runs, scores = [], {}
    for key, samples in seconds.items():
        model, engine = key.split("/")
        for round_, s in enumerate(samples):
            runs.append({"model": model, "engine": engine, "threads": 1, "round": round_, "decode_seconds": s,
                         "sentences": 4, "process_seconds": s + 5, "peak_rss_bytes": 400 * bench.MIB,
                         "output": "-"})
        scores[f"{key}/1"] = {"bleu_tokenized": bleu[key], "sacrebleu": bleu[key] + 1,
                              "hypotheses": hypotheses[key], "target_tokens": 40}
    return {"machine": {"date": "today", "git_commit": "abc", "cpu": "cpu", "cpu_cores_usable": 2,
                        "torch": "t", "fairseq": "f", "ctranslate2": "c"},
            "subset": "test", "sentences": 4, "limit": None, "threads": [1], "runs": runs,
            "weights_bytes": {key: bench.MIB for key in seconds}, "scores": scores}


def example() -> dict:
    same = ["a", "b", "c", "d"]
    seconds = {"rope/" + bench.FAIRSEQ: [10, 12, 11], "rope/" + bench.FLOAT32: [4, 5, 4],
               "rope/" + bench.INT8: [3, 3, 3], "sinusoidal/" + bench.FAIRSEQ: [10, 10, 10],
               "sinusoidal/" + bench.FLOAT32: [4, 4, 5], "sinusoidal/" + bench.INT8: [2, 2, 2]}
    hypotheses = {key: same for key in seconds}
    hypotheses["rope/" + bench.FLOAT32] = ["a", "b", "c", "x"]
    bleu = {key: 30.0 for key in seconds}
    bleu["sinusoidal/" + bench.INT8] = 29.0
    return measurements(seconds, hypotheses, bleu)


def test_targets_are_judged_from_paired_ratios_and_the_scores():
    targets = {t["target"]: (t["measured"], t["met"]) for t in bench.summary(example())["targets"]}
    assert targets["rope, 1 thread(s): float32 identical top hypotheses ≥ 99.5%"] == ("75.00%", False)
    assert targets["sinusoidal, 1 thread(s): float32 identical top hypotheses ≥ 99.5%"] == ("100.00%", True)
    # paired per round: 10/4, 12/5, 11/4 -> median 2.5
    assert targets["rope, 1 thread(s): float32 ≥ 2× fairseq-generate"] == ("2.50×", True)
    assert targets["rope, 1 thread(s): int8 ≥ 3× fairseq-generate"] == ("3.67×", True)
    assert targets["sinusoidal, 1 thread(s): int8 BLEU within 0.5"] == ("±1.00", False)
    # inside CTranslate2: sinusoidal's time over RoPE's, per round: 4/4, 4/5, 5/4 -> 1.0
    assert targets["ctranslate2 float32, 1 thread(s): RoPE ÷ sinusoidal sentences/s ≥ 0.97"] == ("1.000", True)
    assert targets["ctranslate2 int8, 1 thread(s): RoPE ÷ sinusoidal sentences/s ≥ 0.97"] == ("0.667", False)


def test_report_has_the_table_and_every_target():
    lines = bench.report(example(), "scripts/benchmark_ctranslate2.py", ["--runs", "3"])
    text = "\n".join(lines)
    assert text.startswith("# CTranslate2 against fairseq-generate on CPU")
    assert "`scripts/benchmark_ctranslate2.py --runs 3`" in text
    assert sum(line.startswith("| rope |") or line.startswith("| sinusoidal |") for line in lines) == 6
    targets = [line for line in lines if line.startswith(("| rope,", "| sinusoidal,", "| ctranslate2"))]
    verdicts = [line.rsplit("|", 2)[1].strip() for line in targets]
    assert sorted(verdicts) == ["**not met**"] * 3 + ["met"] * 9


@pytest.mark.slow
def test_script_end_to_end_on_a_tiny_model(trained, deploy_data, tmp_path):
    """One model, one thread, one round, eight sentences: the script's every step, not its numbers."""
    out = tmp_path / "ctranslate2-cpu.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_ctranslate2.py"), "--model", f"rope={trained('rope')}",
         "--data", str(deploy_data), "--threads", "1", "--runs", "1", "--limit", "8", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert "the first 8 only: a check of the script" in text and "| rope | ctranslate2 int8 | 1 |" in text
    results = json.loads(out.with_suffix(".json").read_text())
    assert results["sentences"] == 8 and len(results["runs"]) == 3
    assert results["summary"]["table"][f"rope/{bench.FLOAT32}/1"]["agreement"] == 1.0
