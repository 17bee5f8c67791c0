"""The multi30k scales end to end on a tiny synthetic corpus of the release's layout:
prepare, one command per cell, collect (significance, chrF, runaways, BLEU by length)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from fairseq_rope.experiments import reproduce
from fairseq_rope.data.prepare import multi30k
from fairseq_rope.experiments.config import load_experiment
from fairseq_rope.experiments.device import CPU
from fairseq_rope.experiments.table import SCALES, TableError, recorded_runs

from tests.data.prepare.conftest import TINY_VOCAB, run_cli, write_multi30k_release

# A few updates, an update checkpoint after each (evaluate.sh averages the last 5), and a
# narrower model than the recipe's (test_reproduce checks the recipe's): the harness is tested here.
SHORT_RUN = ["--", "--max-update", "6", "--save-interval-updates", "1", "--max-tokens", "1024",
             "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "64",
             "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]


@pytest.mark.slow  # minutes: cells trained and decoded end to end (make test-slow)
def test_cells_of_both_multi30k_scales_and_their_tables(tmp_path, monkeypatch):
    table, _ = write_multi30k_release(tmp_path / "raw")
    monkeypatch.setattr(multi30k, "TASK1", table)  # the tiny files' own checksums
    work, results = tmp_path / "work", tmp_path / "results"
    # The recipe reproduce_table.sh runs (scripts/prepare_multi30k.sh), in-process for the checksums.
    prepared = run_cli("multi30k", "--raw-dir", tmp_path / "raw", "--offline", "--vocab-size", TINY_VOCAB,
                       "--workers", 1, work / "multi30k" / "data")
    assert prepared.rc == 0, prepared.err

    for row in ("sinusoidal", "rope"):
        assert reproduce.main([row, "--scale", "multi30k", "--seed", "1", "--work-dir", str(work),
                               *SHORT_RUN]) == 0
    summary = json.loads((work / "multi30k" / "rope" / "seed1" / "eval" / "run.json").read_text())
    assert summary["arch"] == "transformer_rope_wmt_en_de" and summary["num_test_sentences"] == 25
    assert summary["chrf"] is not None and summary["raw_reference_sha256"]
    assert summary["runaways"]["at_length_limit"] is not None
    assert [b["bucket"] for b in summary["bleu_by_length"]["buckets"]][:2] == ["1-8", "9-12"]

    reproduce.collect.collect(SCALES["multi30k"], work, results)
    md = (results / "multi30k.md").read_text()
    assert "## Significance" in md and "## BLEU by source length" in md
    significance = md.split("## Significance")[1].split("\n## ")[0]
    bootstrap, seeds = significance.split("### Over training seeds", 1)
    rope_p = [line for line in bootstrap.splitlines() if line.startswith("| rope | 1 |")]
    assert len(rope_p) == 1 and "unavailable" not in rope_p[0]
    assert "— (one seed pair: no spread over seeds)" in next(line for line in seeds.splitlines()
                                                            if line.startswith("| rope | 1 |"))
    assert (results / "runs" / "multi30k" / "rope" / "seed1" / "hyps.detok.de.gz").is_file()

    # The length study: the short training pairs of the same prepared corpus, the whole test set.
    assert reproduce.main(["rope", "--scale", "multi30k-length", "--seed", "1", "--work-dir", str(work),
                           *SHORT_RUN]) == 0
    corpus = work / "multi30k-length" / "corpus"
    limit = SCALES["multi30k-length"].max_train_words
    assert all(len(line.split()) <= limit for line in (corpus / "train.en").read_text().splitlines())
    assert len((corpus / "test.en").read_text().splitlines()) == 25
    reproduce.collect.collect(SCALES["multi30k-length"], work, results)
    assert "## Length extrapolation" in (results / "multi30k-length.md").read_text()


@pytest.mark.slow  # minutes: cells trained and decoded end to end (make test-slow)
def test_a_converged_cell_scores_the_equal_budget_on_the_fixed_budget_trajectory(tmp_path, monkeypatch):
    """multi30k-converged, shrunk to an equal budget of 6 updates and a cap of 9: its eval-budget/
    is the multi30k cell of the same seed trained for 6 updates (the same hypotheses: one
    trajectory, stopped and resumed), and its eval/ averages the last 5 checkpoints up to the cap."""
    table, _ = write_multi30k_release(tmp_path / "raw")
    monkeypatch.setattr(multi30k, "TASK1", table)
    monkeypatch.setitem(SCALES, "multi30k-converged", replace(SCALES["multi30k-converged"], equal_budget=6))
    work, results = tmp_path / "work", tmp_path / "results"
    prepared = run_cli("multi30k", "--raw-dir", tmp_path / "raw", "--offline", "--vocab-size", TINY_VOCAB,
                       "--workers", 1, work / "multi30k" / "data")
    assert prepared.rc == 0, prepared.err
    assert reproduce.main(["rope", "--scale", "multi30k", "--seed", "1", "--work-dir", str(work), *SHORT_RUN]) == 0
    converged_run = [*SHORT_RUN, "--max-update", "9", "--patience", "0", "--validate-interval-updates", "1"]
    assert reproduce.main(["rope", "--scale", "multi30k-converged", "--seed", "1", "--work-dir", str(work),
                           *converged_run]) == 0

    run = work / "multi30k-converged" / "rope" / "seed1"
    summary = json.loads((run / "eval" / "run.json").read_text())
    assert [u for u, _ in summary["valid_bleu"]] == list(range(1, 10))  # every validation, scored
    assert summary["convergence"]["reason"] == "cap" and summary["updates_at_convergence"] == 9
    assert summary["num_updates"] == 9 and summary["equal_budget"]["updates"] == 6
    # fairseq's own training time, to the budget and to the cap; what each invocation trained with.
    assert 0 < summary["equal_budget"]["train_wall_seconds"] < summary["train_wall_seconds"]
    assert summary["equal_budget"]["train_tokens_per_second"] > 0  # its epochs to the budget
    assert summary["train_device"] == "cpu" and summary["train_invocations_recorded"] == 2
    averaged = {where: [line.rsplit("_", 1)[1] for line in (run / where / "averaged_checkpoints.txt").read_text().split()]
                for where in ("eval", "eval-budget")}
    assert averaged == {"eval": ["5.pt", "6.pt", "7.pt", "8.pt", "9.pt"],
                        "eval-budget": ["2.pt", "3.pt", "4.pt", "5.pt", "6.pt"]}
    fixed_budget = work / "multi30k" / "rope" / "seed1" / "eval"
    assert (run / "eval-budget" / "hyps.detok.de").read_text() == (fixed_budget / "hyps.detok.de").read_text()
    assert summary["equal_budget"]["bleu_tokenized"] == json.loads((fixed_budget / "run.json").read_text())["bleu_tokenized"]

    # A rerun trains nothing (converged by the cap): train.sh heads the log once per invocation.
    assert reproduce.main(["rope", "--scale", "multi30k-converged", "--seed", "1", "--work-dir", str(work),
                           *converged_run]) == 0
    invocations = re.findall(r"^# \d{4}-\d\d-\d\dT.* fairseq-train ", (run / "train.log").read_text(), re.MULTILINE)
    assert len(invocations) == 2  # to the budget, then on to the cap
    reproduce.collect.collect(SCALES["multi30k-converged"], work, results)
    md = (results / "multi30k-converged.md").read_text()
    assert "## Convergence" in md and "## The same runs at the equal budget (6 updates)" in md
    assert (results / "runs" / "multi30k-converged" / "rope" / "seed1" / "budget.hyps.detok.de.gz").is_file()


# --- The second language pair (English→French): fast checks of the option, no training


def test_the_french_scales_prepare_their_own_en_fr_data_once(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(reproduce, "run_step", lambda command, device=CPU: ran.append(command))
    for name in ("multi30k-fr", "multi30k-fr-converged"):
        data_bin = reproduce.prepare_data(SCALES[name], tmp_path, "/shared/multi30k")
        assert data_bin == tmp_path / "multi30k-fr" / "data" / "data-bin"  # one preparation for both
    assert ran[0][3:7] == ["multi30k", "--tgt", "fr", "--raw-dir"]
    reproduce.prepare_data(SCALES["multi30k"], tmp_path, "/shared/multi30k")
    assert ran[-1][3:6] == ["multi30k", "--tgt", "de"] and ran[-1][-1] == tmp_path / "multi30k" / "data"


def test_the_french_recipe_is_the_german_one_but_for_the_detokenizer_of_valid_bleu():
    for row in ("sinusoidal", "learned", "rope", "rpe", "alibi"):
        german, french = (load_experiment(f"{row}_{size}").train
                          for size in ("multi30k-converged", "multi30k-fr-converged"))
        assert json.loads(french.pop("eval-bleu-detok-args")) == {"target_lang": "fr"}
        assert json.loads(german.pop("eval-bleu-detok-args")) == {"target_lang": "de"}
        assert french == german
    assert (SCALES["multi30k-fr-converged"].equal_budget, SCALES["multi30k-fr"].size) == (1791, "multi30k")


def test_a_scale_refuses_data_of_another_language_pair(tmp_path):
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    for lang in ("en", "de"):
        (data_bin / f"test.en-de.{lang}.idx").write_bytes(b"")
    reproduce.check_language_pair(SCALES["multi30k-converged"], data_bin)
    with pytest.raises(TableError, match="holds en-de data, but scale multi30k-fr-converged is en-fr"):
        reproduce.check_language_pair(SCALES["multi30k-fr-converged"], data_bin)


def test_collect_never_pools_language_pairs(tmp_path):
    """A record lying under a scale of another pair is refused, not tabulated with its runs; records
    made before runs recorded their pair are English→German."""
    def record(scale: str, seed: int, **summary: str) -> None:
        path = tmp_path / "runs" / scale / "rope" / f"seed{seed}" / "run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"row": "rope", "scale": scale, "seed": seed, **summary}))

    record("multi30k-fr-converged", 1, language_pair="en-fr")
    record("multi30k-converged", 1)  # recorded before 2026-11-27: no pair, English→German
    assert [run["seed"] for run in recorded_runs(tmp_path / "runs", SCALES["multi30k-fr-converged"])["rope"]] == [1]
    assert len(recorded_runs(tmp_path / "runs", SCALES["multi30k-converged"])["rope"]) == 1
    record("multi30k-fr-converged", 2)
    with pytest.raises(TableError, match="seed2/run.json is a run on en-de, but scale multi30k-fr-converged is "
                       "en-fr: runs of different language pairs are never pooled"):
        recorded_runs(tmp_path / "runs", SCALES["multi30k-fr-converged"])
    record("multi30k-converged", 2, language_pair="en-fr")
    with pytest.raises(TableError, match="is a run on en-fr, but scale multi30k-converged is en-de"):
        recorded_runs(tmp_path / "runs", SCALES["multi30k-converged"])
