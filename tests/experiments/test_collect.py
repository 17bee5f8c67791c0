"""What collect adds to a results page beyond the scores: the model each row trained, the
seed-level comparison at each budget, and the runs that are not independent replications."""

from __future__ import annotations

import math
import statistics

from fairseq_rope.evaluation.significance_tables import seed_table
from fairseq_rope.experiments import cells, collect
from fairseq_rope.experiments.table import (
    BASELINE,
    DEFAULT_RESULTS_DIR,
    RECORDS,
    ROWS,
    SCALES,
    at_equal_budget,
    recorded_runs,
)
from tests.experiments.test_reproduce import table_line, write_converged_run, write_outputs, write_run

MULTI30K_SHAPE = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
                  "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
                  "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]


def test_the_model_is_the_architecture_with_the_shape_its_command_set():
    argv = ["data-bin", "--arch", "transformer_wmt_en_de", *MULTI30K_SHAPE, "--dropout", "0.3"]
    assert cells.trained_model(argv) == "`transformer_wmt_en_de` with 3+3 layers, d=256, FFN 1024, 4 heads"
    assert cells.trained_model(["data-bin", "--arch=transformer_wmt_en_de"]) == "`transformer_wmt_en_de`"
    assert cells.trained_model(["--arch", "a", "--encoder-embed-dim", "256", "--decoder-embed-dim", "512",
                                "--decoder-layers", "2"]) == "`a` with default+2 layers, d=256/512"


def test_a_row_not_run_names_the_model_of_its_config():
    cell = cells.model_cell(ROWS["alibi"], SCALES["multi30k-converged"], [])
    assert cell == ("Transformer + ALiBi (Press et al. 2022): `transformer_alibi_wmt_en_de` with 3+3 layers, "
                    "d=256, FFN 1024, 4 heads")


def test_the_table_names_the_model_each_run_trained(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    write_run(work, "multi30k", "rope", 1, bleu=30.0, extra=MULTI30K_SHAPE)  # command.txt: --arch arch_rope + shape
    collect.collect(SCALES["multi30k"], work, out)
    line = table_line((out / "multi30k.md").read_text(), "rope")
    assert "| RoFormer (RoPE): `arch_rope` with 3+3 layers, d=256, FFN 1024, 4 heads |" in line


def cauchy_p(differences):
    """The paired t-test's two-sided p over 2 seed pairs (1 degree of freedom: Cauchy)."""
    t = statistics.fmean(differences) / (statistics.stdev(differences) / math.sqrt(2))
    return 1 - 2 / math.pi * math.atan(abs(t))


def test_a_converged_page_compares_over_seeds_at_both_budgets(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    reference = tmp_path / "test.de"
    refs = [f"ein Hund {i} läuft über die Wiese ." for i in range(20)]
    reference.write_text("\n".join(refs) + "\n")
    text = "\n".join(refs) + "\n"
    curve = {199 * k: 30.0 + k for k in range(1, 10)}
    # sacreBLEU is BLEU - 0.5 in these runs, at convergence and at the budget; chrF is 50 at the
    # budget and not measured at convergence.
    for seed, (sinusoidal, rope) in enumerate([((40.0, 35.0), (39.0, 37.0)), ((40.1, 35.2), (39.5, 37.4))], 1):
        write_converged_run(work, "sinusoidal", seed, *sinusoidal, curve, 1791, text, text, reference)
        write_converged_run(work, "rope", seed, *rope, curve, 1791, text, text, reference)
    collect.collect(SCALES["multi30k-converged"], work, out)
    converged, budget = (out / "multi30k-converged.md").read_text().split("## The same runs at the equal budget")
    chrf = {"converged": ["—, —", "—"],
            "budget": ["+0.00, +0.00", "— (every seed pair differs by the same amount)"]}
    for page, differences, chrf in ((converged, [-1.0, -0.6], chrf["converged"]),
                                    (budget, [2.0, 2.2], chrf["budget"])):
        seeds = page.split("Over training seeds (paired t-test)")[1]
        cells_ = table_line(seeds, "rope").split(" | ")
        assert cells_[2] == ", ".join(f"{d:+.2f}" for d in differences)
        assert cells_[4].split()[0] == f"{cauchy_p(differences):.3f}"
        assert cells_[5:7] == chrf


def test_an_equal_budget_run_identical_to_the_fixed_budget_table_says_so(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    reference = tmp_path / "test.de"
    refs = [f"ein Hund {i} läuft ." for i in range(10)]
    reference.write_text("\n".join(refs) + "\n")
    at_budget = [f"ein Hund {i}" for i in range(10)]
    curve = {199 * k: 30.0 + k for k in range(1, 10)}
    write_converged_run(work, "rope", 3, 39.0, 37.0, curve, 1791, "\n".join(refs) + "\n",
                        "\n".join(at_budget) + "\n", reference)
    write_converged_run(work, "rope", 2, 39.0, 37.0, curve, 1791, "x\n" * 10, "\n".join(at_budget) + "\n", reference)
    write_outputs(write_run(work, "multi30k", "rope", 3, bleu=37.5), at_budget, reference)
    write_outputs(write_run(work, "multi30k", "rope", 2, bleu=37.5), refs, reference)  # another decoding
    collect.collect(SCALES["multi30k"], work, out)
    collect.collect(SCALES["multi30k-converged"], work, out)
    md = (out / "multi30k-converged.md").read_text()
    assert ("At the equal budget, rope seed 3 decoded every test sentence as the same row and seed of "
            "[multi30k.md](multi30k.md) does") in md
    assert "rope seed 2" not in md


def test_the_committed_converged_runs_over_seeds():
    """Issue 46's independent rescoring of the committed runs, seed pair by seed pair: converged
    sacreBLEU +0.92, -0.22, +0.15 (p ≈ 0.49), chrF ahead in every seed (+0.34 to +0.81,
    p ≈ 0.05), at the equal budget +1.37, +1.07, +1.85 (p ≈ 0.02)."""
    runs = recorded_runs(DEFAULT_RESULTS_DIR / RECORDS, SCALES["multi30k-converged"])

    def rope_line(runs):
        baseline = {r["seed"]: r for r in runs[BASELINE]}
        rows = {"rope": [(r, baseline[r["seed"]]) for r in runs["rope"]]}
        return table_line("\n".join(seed_table(rows, BASELINE)), "rope").split(" | ")

    converged = rope_line(runs)
    assert converged[1:3] == ["1, 2, 3", "+0.92, -0.22, +0.15"] and converged[4] == "0.489"
    assert converged[5] == "+0.81, +0.34, +0.66" and converged[7].startswith("0.050")
    budget = rope_line({name: [at_equal_budget(r) for r in rs] for name, rs in runs.items()})
    assert budget[2] == "+1.37, +1.07, +1.85" and budget[4] == "0.024 *"

