"""scripts/profile_step.py: operator profiles of a training step and a beam search."""

from __future__ import annotations

import argparse

import torch

from fairseq_rope.benchmark import profile


def test_profiles_of_both_rows_show_where_the_encodings_differ(tmp_path, monkeypatch):
    results = profile.measure("tiny", length=4, steps=1)
    for phase in ("train", "decode"):
        (stock_ops, stock_wall), (rope_ops, rope_wall) = (results[phase][row] for row in profile.ROWS)
        assert stock_wall > 0 and rope_wall > 0
        # On the CPU no operator has device time.
        assert all(seconds >= 0 and calls > 0 and device == 0
                   for seconds, calls, device in {**stock_ops, **rope_ops}.values())
    # RoPE rotates through complex views; the stock model never does.
    assert "aten::view_as_complex" in results["train"]["rope"][0]
    assert "aten::view_as_complex" not in results["train"]["sinusoidal"][0]
    monkeypatch.setattr(profile, "measure", lambda *args, **kwargs: results)
    out = tmp_path / "profile.md"
    assert profile.main(["--length", "4", "--steps", "1", "--top", "5", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Operator profile, CPU, fp32: tiny, T = 4")
    assert "## Training step" in text and "## Beam search" in text and "**all operators**" in text
    assert text.count("other operators") == 2
    # view_as_complex is called by one row only: it is among the operators whose calls differ.
    differing = text.split("## Beam search")[0].split("Operators called a different number")[1]
    assert "`aten::view_as_complex` | — |" in differing
    assert "device ms" not in text


def test_a_gpu_report_adds_each_rows_device_time_and_totals():
    ms = 1e-3
    stock = {"aten::mm": (2 * ms, 10.0, 5 * ms), "aten::add": (1 * ms, 4.0, 1 * ms)}
    rope = {"aten::mm": (2 * ms, 10.0, 5 * ms), "aten::mul": (3 * ms, 6.0, 2 * ms)}
    lines = profile.report({"sinusoidal": (stock, 4 * ms), "rope": (rope, 6 * ms)}, top=1, on_device=True)
    text = "\n".join(lines)
    header = lines[0]
    assert header.count("|") == 6 and "sinusoidal: device ms per step" in header and "rope: device ms per step" in header
    # Sorted by self CPU time: mul (rope's 3 ms) first; mm and add fall into "other operators".
    assert lines[2] == "| `aten::mul` | — | 3.00 (6) | 0.00 | 2.00 |"
    assert "| 2 other operators | 3.00 | 2.00 | 6.00 | 5.00 |" in text
    assert "| **all operators** | **3.00** | **5.00** | **6.00** | **7.00** |" in text
    assert "| wall − operators: Python, between operators | 1.00 | 1.00 |  |  |" in text
    # mm is called as often by both rows; add and mul are not.
    differing = text.split("Operators called a different number of times per step (2)")[1]
    assert "`aten::mul`" in differing and "`aten::add`" in differing and "`aten::mm`" not in differing


def test_reports_other_than_fp32_on_the_cpu_are_named_by_device_and_dtype(tmp_path):
    parser_args = argparse.Namespace(out=None, out_dir=tmp_path, size="base", dtype="bf16")
    assert profile.out_path(parser_args, torch.device("cpu")) == tmp_path / "profile-base-cpu-bf16.md"
    parser_args.dtype = "fp32"
    assert profile.out_path(parser_args, torch.device("cpu")) == tmp_path / "profile-base.md"
