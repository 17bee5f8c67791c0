"""scripts/profile_step.py: operator profiles of a training step and a beam search."""

from __future__ import annotations

from fairseq_rope.benchmark import profile


def test_profiles_of_both_rows_show_where_the_encodings_differ(tmp_path, monkeypatch):
    results = profile.measure("tiny", length=4, steps=1)
    for phase in ("train", "decode"):
        (stock_ops, stock_wall), (rope_ops, rope_wall) = (results[phase][row] for row in profile.ROWS)
        assert stock_wall > 0 and rope_wall > 0
        assert all(seconds >= 0 and calls > 0 for seconds, calls in {**stock_ops, **rope_ops}.values())
    # RoPE rotates through complex views; the stock model never does.
    assert "aten::view_as_complex" in results["train"]["rope"][0]
    assert "aten::view_as_complex" not in results["train"]["sinusoidal"][0]
    monkeypatch.setattr(profile, "measure", lambda size, length, steps: results)
    out = tmp_path / "profile.md"
    assert profile.main(["--length", "4", "--steps", "1", "--top", "5", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Training step" in text and "## Beam search" in text and "**all operators**" in text
    assert text.count("other operators") == 2
