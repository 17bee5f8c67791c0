"""The serving benchmarks run end to end on the toy export (their figures are not timed here):
``fairseq_rope_serve.benchmark`` with its serving-floor control, and ``benchmark_memory``."""

from __future__ import annotations

import json
import re

from fairseq_rope_serve import benchmark, benchmark_memory


def test_the_serving_benchmark_compares_the_server_with_offline_and_with_its_floor(exported, raw_test_set, tmp_path):
    (tmp_path / "in.en").write_text("\n".join(raw_test_set[:12]) + "\n", encoding="utf-8")
    out = tmp_path / "serving.md"
    assert benchmark.main([str(exported("rope")), str(tmp_path / "in.en"), "--rounds", "1", "--out", str(out)]) == 0
    results = json.loads(out.with_suffix(".json").read_text())
    assert [level["identical_to_offline"] for level in results["server"]["levels"]] == [12, 12, 12]
    assert [level["clients"] for level in results["floor"]] == list(benchmark.CLIENT_LEVELS)
    # The floor is the same app with a model that answers each line with itself: every answer
    # came back from it, at every level (its speed is measured, not asserted: this is no timed test).
    assert [level["echoed"] for level in results["floor"]] == [12, 12, 12]
    assert all(level["sentences_per_s"] > 0 for level in results["floor"])
    assert "## Serving floor (the control)" in out.read_text(encoding="utf-8")


def test_the_memory_benchmark_reads_each_servers_rss(exported, raw_test_set, tmp_path):
    (tmp_path / "in.en").write_text("\n".join(raw_test_set[:6]) + "\n", encoding="utf-8")
    out = tmp_path / "memory.md"
    assert benchmark_memory.main([str(exported("rope")), "--input", str(tmp_path / "in.en"), "--out", str(out)]) == 0
    rows = [line.split(" | ") for line in out.read_text(encoding="utf-8").splitlines()
            if re.match(r"\| rope-float32-True \| ", line)]
    assert [int(row[2]) for row in rows] == list(benchmark_memory.INTER_THREADS)
    rss, peak = ([float(row[k].strip(" |")) for row in rows] for k in (3, 4))
    assert all(20 < r <= p < 2000 for r, p in zip(rss, peak))  # MiB: a process with a model, not bytes or KiB
