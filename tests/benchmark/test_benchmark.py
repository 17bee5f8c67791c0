"""The benchmark suite (scripts/benchmark.py): its smoke run end to end, as a
subprocess, and its pure parts. Timings are never asserted; structure,
correctness of the compared operators and the memory accounting are."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

from fairseq_rope.benchmark import cli, report
from fairseq_rope.benchmark.memory import peak_during, tensor_bytes
from fairseq_rope.benchmark.ops import OP_CANDIDATES
from fairseq_rope.benchmark.timing import interleaved, paired_speedup, summarize

from tests.conftest import REPO

ROWS = ["sinusoidal", "learned", "rpe", "rope"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--smoke", "--out-dir", str(out),
         "--threads", "1", "--name", "smoke"],
        cwd=REPO, capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "rope÷naive" in result.stdout and "# targets" in result.stdout
    return out


def _load(smoke: Path) -> dict:
    return json.loads((smoke / "smoke.json").read_text())


def test_smoke_ops_structure_and_same_operator(smoke: Path) -> None:
    ops = _load(smoke)["ops"]["fp32"]
    assert [e["length"] for e in ops] == [32, 64]
    for e in ops:
        assert set(e["candidates"]) == set(OP_CANDIDATES)
        assert e["bytes_moved"] == 4 * e["batch"] * e["heads"] * e["length"] * e["head_dim"] * 4
        for c in e["candidates"].values():
            assert c["n"] == 2 and 0 < c["min"] <= c["q1"] <= c["median"] <= c["q3"] <= c["max"]
            assert c["bytes_per_s"] == pytest.approx(e["bytes_moved"] / c["median"])
        # The compared rotations compute the same operator as the reference.
        errors = e["max_abs_error_vs_naive"]
        assert errors["rope"] < 1e-5 and errors["rope_half"] < 1e-5 and errors["fairseq"] < 1e-4
        t = {n: c["median"] for n, c in e["candidates"].items()}
        assert e["ratios"]["rope_over_naive"] == pytest.approx(t["rope"] / t["naive"])
        assert e["ratios"]["rope_bytes_per_s_over_copy"] == pytest.approx(t["copy"] / t["rope"])


def test_smoke_models_structure(smoke: Path) -> None:
    models = _load(smoke)["models"]["fp32"]
    assert list(models["rows"]) == ROWS
    params = {n: r["params"] for n, r in models["rows"].items()}
    assert params["rope"] == params["sinusoidal"] < params["learned"]  # identical dims
    assert [e["length"] for e in models["train"]] == [8, 16]
    for e in models["train"]:
        assert list(e["rows"]) == ROWS
        for r in e["rows"].values():
            assert r["tokens_per_s"] > 0 and r["n"] == 2
            assert r["launches_per_step"] > 100  # forward, backward and Adam: kernels counted
            assert r["peak_bytes"] == r["persistent_bytes"] + r["step_peak_bytes"]
            assert r["persistent_bytes"] > 0 and r["step_peak_bytes"] > 0
        assert set(e["ratios"]) == {"learned_over_stock", "rpe_over_stock", "rope_over_stock"}
        # Speed ratios pair the repetitions: stock's time over the row's, repetition by repetition.
        rope, stock = e["rows"]["rope"]["samples"], e["rows"]["sinusoidal"]["samples"]
        paired = sorted(b / a for a, b in zip(rope, stock))
        ratio = e["ratios"]["rope_over_stock"]
        assert ratio["tokens_per_s"] == pytest.approx((paired[0] + paired[1]) / 2)  # n = 2
        q1, _, q3 = statistics.quantiles(paired, n=4, method="inclusive")
        assert ratio["tokens_per_s_quartiles"] == pytest.approx([q1, q3])
    (decode,) = models["decode"]
    for r in decode["rows"].values():
        assert r["output_lengths"] == [decode["length"] + 1]  # forced length + EOS, every row
        assert r["sentences_per_s"] > 0 and r["launches"] > 0
    # Launches are deterministic: the same batch shape, the same count at every length.
    assert len({e["rows"]["rope"]["launches_per_step"] for e in models["train"]}) == 1


def test_smoke_report_files(smoke: Path) -> None:
    data = _load(smoke)
    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["torch_threads"] == 1
    assert data["command"].split()[:2] == ["scripts/benchmark.py", "--smoke"]
    targets = data["targets"]
    assert len(targets) == 5
    assert all(t["status"] in {"met", "not met"} for t in targets)
    md = (smoke / "smoke.md").read_text()
    for section in ("## Machine", "## Targets", "## Op level", "## Model level", data["command"]):
        assert section in md
    assert all(t["target"] in md for t in targets)
    assert "kernel launches per training step" in md and "kernel launches per beam search" in md
    assert set(data["plots"]) == {"ops", "train", "decode"}
    for png in data["plots"].values():
        assert f"]({png})" in md
        assert (smoke / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_time_box_skips_what_it_cannot_start_and_still_writes_the_report(tmp_path, capsys) -> None:
    assert cli.main(["--smoke", "--out-dir", str(tmp_path), "--name", "boxed", "--max-seconds", "0"]) == 0
    data = json.loads((tmp_path / "boxed.json").read_text())
    assert data["skipped"] == ["op level, fp32", "model level, fp32"] and not data["models"]
    assert "Not measured within `--max-seconds`: op level, fp32; model level, fp32." in (
        tmp_path / "boxed.md").read_text()
    assert data["targets"] == []  # nothing measured, nothing judged


def test_rows_choose_the_model_rows_but_keep_stock_and_rope() -> None:
    args = cli.build_parser("x").parse_args(["--rows", "learned"])
    assert args.rows == ("sinusoidal", "learned", "rope")
    assert cli.build_parser("x").parse_args(["--rows", "rope_pytorch"]).rows == ("sinusoidal", "rope", "rope_pytorch")
    with pytest.raises(SystemExit):
        cli.build_parser("x").parse_args(["--rows", "alibi"])


def test_smoke_requires_out_dir(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--smoke"])
    assert exit_info.value.code == 2 and "--out-dir" in capsys.readouterr().err


def test_summarize_quartiles() -> None:
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0], calls_per_sample=3)
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n, s.calls_per_sample) == (3, 2, 4, 1, 5, 5, 3)


def test_interleaved_rotates_the_order() -> None:
    calls: List[str] = []
    candidates = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    stats = interleaved(candidates, reps=3, device=torch.device("cpu"), warmup=1)
    assert calls[:3] == list("abc")  # warmup
    assert calls[3:] == list("abc" "bca" "cab")
    assert all(s.n == 3 for s in stats.values())


def test_cpu_peak_memory_counts_live_tensors() -> None:
    x = torch.ones(1 << 20)  # 4 MiB, allocated before: not counted

    def step() -> None:
        y = x * 2  # 4 MiB live …
        z = y + 1  # … 8 MiB live
        del y
        del z

    peak = peak_during(step, torch.device("cpu"))
    assert 8 << 20 <= peak < (8 << 20) + 4096
    assert tensor_bytes([x, x.view(2, -1), x[:10]]) == 4 << 20  # views counted once


def test_targets_statuses() -> None:
    def ratios(rope: float, learned: float = 1.0) -> dict:
        return {"rope_over_stock": {"tokens_per_s": rope, "peak_bytes": 1.0, "sentences_per_s": rope},
                "learned_over_stock": {"tokens_per_s": learned, "peak_bytes": 1.0,
                                       "sentences_per_s": learned}}

    def evaluate(train: list, decode: list) -> dict:
        results = {"ops": {"fp32": [{"length": 32, "ratios": {"rope_over_naive": 0.4,
                                                              "rope_bytes_per_s_over_copy": 0.3}}]},
                   "models": {"fp32": {"train": [{"length": 16 * (i + 1), "ratios": ratios(*r)}
                                                 for i, r in enumerate(train)],
                                       "decode": [{"length": 16 * (i + 1), "ratios": ratios(r)}
                                                  for i, r in enumerate(decode)]}}}
        return {t["target"]: t for t in report.evaluate_targets(results)}

    # Median over lengths >= 1.00 and no length below 0.97: met, though one length is below 1.
    targets = evaluate(train=[(1.02, 0.96), (0.98, 1.04), (1.01, 1.0)], decode=[0.99, 0.975, 1.03])
    train = targets["training tokens/s, RoPE ÷ stock"]
    assert (train["status"], train["median"], train["worst"]) == ("met", 1.01, 0.98)
    assert train["control"] == {"16": 0.96, "32": 1.04, "48": 1.0}  # learned ÷ stock beside it
    assert train["against_control"] == "inside the control's range (0.96–1.04) at every length"
    decode = targets["beam-4 decoding sentences/s, RoPE ÷ stock"]
    assert (decode["status"], decode["median"]) == ("not met", 0.99)  # the median is below 1.00
    # The decoding control (learned ÷ stock) reads 1.00 at every length: RoPE lies below it at two.
    assert decode["against_control"] == "below the control's range (1.00–1.00) at 16, 32, by up to 0.025"
    assert targets["peak training memory, RoPE ÷ stock"]["against_control"] is None  # no control
    assert targets["peak training memory, RoPE ÷ stock"]["status"] == "met"
    assert targets["RoPE apply time ÷ naive rotate-half"]["status"] == "met"
    assert targets["RoPE apply bytes/s ÷ copy bytes/s"]["status"] == "not met"
    # One length below 0.97 fails the target whatever the median.
    assert evaluate(train=[(1.1,), (1.1,), (0.96,)], decode=[])[
        "training tokens/s, RoPE ÷ stock"]["status"] == "not met"
    nothing = evaluate(train=[], decode=[])["beam-4 decoding sentences/s, RoPE ÷ stock"]
    assert (nothing["status"], nothing["median"], nothing["worst"]) == ("not measured", None, None)


def test_paired_speedup_divides_out_what_both_rows_share() -> None:
    # The machine slows down by 2x in the second half of the run, for both rows alike.
    stock = summarize([1.0, 1.0, 2.0, 2.0])
    rope = summarize([0.9, 1.0, 1.8, 2.0])  # 10 % faster in two repetitions, equal in two
    speedup = paired_speedup(rope.as_dict(), stock.as_dict())
    assert speedup.median == pytest.approx((1 / 0.9 + 1.0) / 2)
    assert speedup.min == pytest.approx(1.0) and speedup.max == pytest.approx(1 / 0.9)
    # The ratio of the medians would mix the slow phase into it; the samples keep their order.
    assert rope.samples == (0.9, 1.0, 1.8, 2.0)
    with pytest.raises(ValueError, match="paired samples"):
        paired_speedup(summarize([1.0]).as_dict(), stock.as_dict())
