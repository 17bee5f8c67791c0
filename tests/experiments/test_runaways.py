"""The runaway study: loops, beam objectives, forced decoding and decoding variants on a trained model."""

from __future__ import annotations

import json
import shutil

import pytest

from fairseq_rope.experiments import runaways
from fairseq_rope.evaluation.decoding import generate
from fairseq_rope.experiments.runaways import Scored, analyse, beam_objective, loop_start
from fairseq_rope.evaluation.scoring import Translation, read_generate_output


@pytest.mark.parametrize("words, expected", [
    ("a dog runs on the grass .".split(), None),
    ("a dog runs on on on".split(), (3, 1)),
    ("a man and a woman and a woman and a woman and a".split(), (2, 3)),  # "and a woman", cut short
    ("a b c c c c c d e f".split(), (2, 1)),  # a loop the hypothesis leaves again
    ("x y x y".split(), None),  # two repeats are not a loop
    ("the the the".split(), (0, 1)),
])
def test_loop_start(words, expected):
    assert loop_start(words) == expected


def test_beam_objective_is_fairseqs_length_normalised_score():
    assert beam_objective([-1.0, -1.0, -2.0, -4.0], 0.0) == -8.0
    assert beam_objective([-1.0, -1.0, -2.0, -4.0], 1.0) == -2.0
    assert beam_objective([-2.0] * 4, 0.5) == pytest.approx(-8.0 / 2)


def test_analyse_tells_search_from_model_errors():
    translations = [Translation(0, "a b b b b b b b", -1.0, "s", "a b c", 8),
                    Translation(1, "c d d d d d d d", -1.0, "s", "c e", 8),
                    Translation(2, "f g", -1.0, "s", "f g", 2)]
    hyps = {0: Scored(0, (-0.1,) * 9), 1: Scored(1, (-0.1,) * 9), 2: Scored(2, (-0.5, -0.5, -0.5))}
    refs = {0: Scored(0, (-0.01,) * 4), 1: Scored(1, (-5.0,) * 3), 2: Scored(2, (-0.5, -0.5, -0.5))}
    cases, preferred = analyse(translations, [0, 1], hyps, refs, 0.6)
    assert [(c["id"], c["error"], c["loop_start_word"], c["loop_period"]) for c in cases] == [
        (0, "search", 1, 1), (1, "model", 1, 1)]
    assert preferred == 1  # only sentence 0's reference beats its hypothesis


def test_study_of_an_evaluated_run(trained_rope_checkpoint, toy_data_bin, toy_corpus, tmp_path):
    data = tmp_path / "data"
    (data / "bpe").mkdir(parents=True)
    (data / "data-bin").symlink_to(toy_data_bin)
    shutil.copy(toy_corpus / "train.de", data / "bpe" / "train.de")
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "results.json").write_text(json.dumps(
        {"data": str(data / "data-bin"), "checkpoint": str(trained_rope_checkpoint)}))
    generate(trained_rope_checkpoint, data / "data-bin", run / "eval" / "generate-test.txt")

    study = runaways.study_run(run)
    assert study["sentences"] == 40 and study["longest_training_target_words"] == 7
    assert set(study["variants"]) == {"max-len 1.2x+10", "lenpen 0.2", "lenpen 1.0"}
    for variant in study["variants"].values():
        assert 0 <= variant["bleu_tokenized"] <= 100 and variant["at_length_limit"] is not None
    # A source-tied limit of 1.2 x (2..7 words + EOS) + 10 subwords is far above these outputs.
    assert study["variants"]["max-len 1.2x+10"]["at_length_limit"] == 0
    assert 0 <= study["references_preferred_overall"] <= 40
    translations = read_generate_output(run / "eval" / "generate-test.txt")
    assert len(study["cases"]) == study["longer_than_ratio"] <= len(translations)

    out = tmp_path / "report"
    assert runaways.main([str(run), "--out", str(out)]) == 0
    assert "# Runaway hypotheses" in out.with_suffix(".md").read_text()
    assert json.loads(out.with_suffix(".json").read_text())["runs"][0]["sentences"] == 40
