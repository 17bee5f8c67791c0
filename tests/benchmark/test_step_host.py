"""scripts/decoding_step_host_cost.py: a decoding step's wall time and host split, RoPE against stock."""

from __future__ import annotations

from fairseq_rope.benchmark import step_host
from fairseq_rope.benchmark.timing import summarize


def test_the_ratio_is_the_rows_time_over_stocks_in_each_repetition():
    """A row 10 % slower than stock in every repetition reads 1.100, however slow the repetition."""
    stock = summarize([1.0, 2.0, 3.0])
    rope = summarize([1.1, 2.2, 3.3])
    ops = {"aten::mm": (0.5, 4.0, 0.0)}
    lines = step_host.report(({"sinusoidal": stock, "rope": rope}, {"sinusoidal": (ops, 2.0), "rope": (ops, 2.4)}),
                             length=2)
    assert lines[2].startswith("| sinusoidal | 1000000 | 1.000 [1.000, 1.000] | 1000000 | 2 | 250000 | 750000 |")
    assert lines[3].startswith("| rope | 1100000 | 1.100 [1.100, 1.100] | 1200000 | 2 | 250000 | 950000 |")


def test_the_script_measures_both_rows_and_writes_its_report(tmp_path):
    out = tmp_path / "step.md"
    assert step_host.main(["--size", "tiny", "--length", "2", "--reps", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Host cost of a decoding step, CPU: tiny, T = 2")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert {"sinusoidal", "rope"} <= rows.keys()
    assert rows["sinusoidal"].split(" | ")[2] == "1.000 [1.000, 1.000]"
    assert float(rows["rope"].split(" | ")[1]) > 0
