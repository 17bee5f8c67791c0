"""The runaway study: loops, beam objectives, forced decoding and decoding variants on a trained model."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import sacrebleu

from fairseq_rope.experiments import runaways
from fairseq_rope.evaluation.decoding import generate
from fairseq_rope.experiments.runaways import Scored, analyse, beam_objective, find_loop, loop_start
from fairseq_rope.evaluation.scoring import Translation


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


@pytest.mark.parametrize("hypothesis, expected", [
    ("Ein Hund läuft .", None),
    ("Die Schifffahrt auf dem Fluss .", None),  # three of a letter is spelling, not a loop
    ("Der Lignnnnnnnn", (1, 1, "character")),
    ("nahe eines Wahlkampfkampfkampfkampfk", (2, 5, "character")),
    ("am am am Wahlkampfkampfkampfkampf", (0, 1, "word")),  # a loop of words comes first
])
def test_find_loop_sees_loops_inside_a_word(hypothesis, expected):
    assert find_loop(hypothesis.split()) == expected


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


def test_analyse_studies_hypotheses_at_the_limit_that_are_no_runaways_by_words():
    translations = [Translation(0, "a b b b b b b b", -1.0, "s", "a b c", 8),
                    Translation(1, "Der Lignnnnnnnnnn", -1.0, "s", "Der Mann", 10)]
    scores = {i: Scored(i, (-0.1,) * 11) for i in (0, 1)}
    refs = {0: Scored(0, (-5.0,) * 4), 1: Scored(1, (-0.01,) * 3)}
    cases, _ = analyse(translations, [0], scores, refs, 0.6, at_limit_ids=[0, 1])
    assert [(c["id"], c["longer_than_ratio"], c["at_length_limit"], c["loop_start_word"], c["loop_unit"],
             c["error"]) for c in cases] == [(0, True, True, 1, "word", "model"),
                                             (1, False, True, 1, "character", "search")]
    assert [runaways.only_at_limit(c) for c in cases] == [False, True]


def read_decoded(path):
    """id → (source, reference, hypothesis, positional scores) of a fairseq-generate output,
    read here line by line (the first H-/P- line of an id is its best hypothesis)."""
    sentences = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"([STHP])-(\d+)\t(.*)", line)
        if match:
            tag, rest = match.group(1), match.group(3)
            entry = sentences.setdefault(int(match.group(2)), {})
            entry.setdefault(tag, rest.split("\t")[-1] if tag == "H" else rest)
    return {i: (e["S"], e["T"], e["H"], [float(x) for x in e["P"].split()]) for i, e in sentences.items()}


def expected_counts(decoded, max_len_a, max_len_b):
    """BLEU (sacrebleu called directly: whitespace tokens, no smoothing; the toy text has no
    hyphens to split), hypotheses longer than 1.5 x their reference in words, and hypotheses
    whose subwords before EOS reach int(max_len_a x source tokens with EOS + max_len_b)."""
    ids = sorted(decoded)
    hyps, refs = [decoded[i][2] for i in ids], [decoded[i][1] for i in ids]
    assert not any("-" in line for line in hyps + refs)
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none", force=True).score
    longer = [i for i in ids if len(decoded[i][2].split()) > 1.5 * len(decoded[i][1].split())]
    at_limit = [i for i in ids
                if len(decoded[i][3]) - 1 >= int(max_len_a * (len(decoded[i][0].split()) + 1) + max_len_b)]
    return bleu, longer, at_limit


@pytest.mark.slow  # 126 s on a quiet 2-core machine (2026-11-25): make test's budget
def test_study_of_an_evaluated_run(trained_rope_checkpoint, toy_data_bin, toy_corpus, tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "bpe").mkdir(parents=True)
    (data / "data-bin").symlink_to(toy_data_bin)
    for lang in ("en", "de"):
        shutil.copy(toy_corpus / f"train.{lang}", data / "bpe" / f"train.{lang}")
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "results.json").write_text(json.dumps(
        {"data": str(data / "data-bin"), "checkpoint": str(trained_rope_checkpoint)}))
    generate(trained_rope_checkpoint, data / "data-bin", run / "eval" / "generate-test.txt")

    # Keep a copy of what the study decodes (it decodes into a temporary directory), to recompute
    # its numbers here from the outputs themselves.
    copies = tmp_path / "decoded"
    copies.mkdir()

    def generate_and_keep(checkpoint, data_bin, out, subset="test", settings=None, score_reference=False):
        command = generate(checkpoint, data_bin, out, subset, settings, score_reference)
        name = "forced" if score_reference else next(n for n, v in runaways.VARIANTS.items() if v == settings)
        shutil.copy(out, copies / f"{name}.txt")
        return command

    monkeypatch.setattr(runaways, "generate", generate_and_keep)
    study = runaways.study_run(run)
    assert study["sentences"] == 40 and study["longest_training_target_words"] == 7
    assert study["longest_training_source_words"] == max(len(line.split()) for line in
                                                         (toy_corpus / "train.en").read_text().splitlines())
    assert study["run"] == str(run)  # not in the harness's layout: named by its path
    assert set(study["variants"]) == {"max-len 1.2x+10", "lenpen 0.2", "lenpen 1.0"}
    for name, variant in study["variants"].items():
        settings = runaways.VARIANTS[name]
        bleu, longer, at_limit = expected_counts(read_decoded(copies / f"{name}.txt"), settings["max_len_a"],
                                                 settings["max_len_b"])
        assert (variant["bleu_tokenized"], variant["ids"], variant["at_length_limit_ids"]) == (
            bleu, longer, at_limit), name
        assert (variant["longer_than_ratio"], variant["at_length_limit"]) == (len(longer), len(at_limit))
        assert bleu > 50  # the toy task is learned: these are translations, not noise
    # A source-tied limit of 1.2 x (2..7 words + EOS) + 10 subwords is far above these outputs.
    assert study["variants"]["max-len 1.2x+10"]["at_length_limit"] == 0

    baseline = read_decoded(run / "eval" / "generate-test.txt")
    bleu, longer, at_limit = expected_counts(baseline, 0.0, 200)
    assert (study["bleu_tokenized"], study["longer_than_ratio"], study["at_length_limit"]) == (
        bleu, len(longer), len(at_limit))
    assert study["cases_include_length_limit"]
    assert [c["id"] for c in study["cases"]] == sorted(set(longer) | set(at_limit))
    # Forced decoding scores each reference; beam search's objective Σ log p / length^0.6 (EOS counted).
    forced = read_decoded(copies / "forced.txt")
    assert [forced[i][2] for i in range(40)] == [baseline[i][1] for i in range(40)]
    preferred = sum(sum(forced[i][3]) / len(forced[i][3]) ** 0.6 > sum(baseline[i][3]) / len(baseline[i][3]) ** 0.6
                    for i in range(40))
    assert study["references_preferred_overall"] == preferred

    out = tmp_path / "report"
    assert runaways.main([str(run), "--out", str(out)]) == 0
    assert "# Runaway hypotheses" in out.with_suffix(".md").read_text()
    assert json.loads(out.with_suffix(".json").read_text())["runs"][0]["sentences"] == 40
    assert all(c["source_words"] >= 1 for c in study["cases"])


def write_binarized(prefix, lengths):
    """A fairseq-preprocess-style {prefix}.bin/.idx: one sentence of each length (EOS included)."""
    import torch
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=100)
    for n in lengths:
        builder.add_item(torch.IntTensor([4] * (n - 1) + [2]))
    builder.finalize(f"{prefix}.idx")


def generate_output(sentences):
    """fairseq-generate's lines for (source, reference, hypothesis, number of P- scores, score each)."""
    lines = []
    for i, (src, ref, hyp, n, each) in enumerate(sentences):
        lines += [f"S-{i}\t{src}", f"T-{i}\t{ref}", f"H-{i}\t{each}\t{hyp}", f"D-{i}\t{each}\t{hyp}",
                  "P-{}\t{}".format(i, " ".join([str(each)] * n))]
    return "\n".join(lines) + "\n"


SOURCES = ["s s s", "s s s s s", "s s"]  # 4, 6 and 3 tokens with EOS
REFERENCES = ["a b c", "d e", "f g h i"]
LOOP_IN_A_WORD = "f g Lignnnnnnnn"


def test_study_counts_exactly_on_constructed_decodings(tmp_path, monkeypatch):
    """study_run on decodings written here (no model): every count and verdict is known."""
    data_bin, bpe = tmp_path / "data" / "data-bin", tmp_path / "data" / "bpe"
    data_bin.mkdir(parents=True)
    bpe.mkdir()
    write_binarized(data_bin / "test.en-de.en", [4, 6, 3])
    write_binarized(data_bin / "test.en-de.de", [4, 3, 5])
    for lang in ("en", "de"):
        (data_bin / f"dict.{lang}.txt").write_text("s 1\n")
    (bpe / "train.en").write_text("s s s s s\nt@@ t s\n")  # longest: 5 words
    (bpe / "train.de").write_text("a@@ b@@ c d e\nx y z w\n")  # "abc d e" is 3 words: longest 4
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "results.json").write_text(json.dumps({"data": str(data_bin), "checkpoint": "avg.pt"}))
    # Baseline (limit 200 subwords): sentence 1 runs away by words (7 > 1.5 x 2) looping from
    # word 1; sentence 2 loops inside a word up to the limit (200 subwords + EOS: 201 scores).
    (run / "eval" / "generate-test.txt").write_text(generate_output([
        (SOURCES[0], REFERENCES[0], "a b c", 4, -0.1),
        (SOURCES[1], REFERENCES[1], "d e e e e e e", 8, -0.2),
        (SOURCES[2], REFERENCES[2], LOOP_IN_A_WORD, 201, -0.01)]))
    outputs = {
        # Forced decoding: references scored; sentence 1's beats its hypothesis (a search error),
        # sentence 2's does not (a model error), sentence 0's does not either.
        "forced": [(s, r, r, n, each) for s, r, n, each in zip(SOURCES, REFERENCES, (4, 3, 5), (-0.5, -0.1, -1.0))],
        # Limits int(1.2 x (4, 6, 3) + 10) = 14, 17, 13: sentence 2 stops at 13 subwords.
        "max-len 1.2x+10": [(SOURCES[0], REFERENCES[0], "a b c", 4, -0.1),
                            (SOURCES[1], REFERENCES[1], "d e", 3, -0.1),
                            (SOURCES[2], REFERENCES[2], LOOP_IN_A_WORD, 14, -0.1)],
        "lenpen 0.2": [(s, r, r, len(r.split()) + 1, -0.1) for s, r in zip(SOURCES, REFERENCES)],
        "lenpen 1.0": [(SOURCES[0], REFERENCES[0], "a b c c c c c", 8, -0.1),
                       (SOURCES[1], REFERENCES[1], "d e", 3, -0.1),
                       (SOURCES[2], REFERENCES[2], "f g h", 4, -0.1)],
    }

    def fake_generate(checkpoint, data_bin, out, subset="test", settings=None, score_reference=False):
        assert (str(checkpoint), subset) == ("avg.pt", "test")
        name = "forced" if score_reference else next(n for n, v in runaways.VARIANTS.items() if v == settings)
        out.write_text(generate_output(outputs[name]))
        return ["fairseq-generate"]

    monkeypatch.setattr(runaways, "generate", fake_generate)
    study = runaways.study_run(run)

    def bleu(hyps):
        return sacrebleu.corpus_bleu(hyps, [REFERENCES], tokenize="none", smooth_method="none", force=True).score

    assert study["bleu_tokenized"] == bleu(["a b c", "d e e e e e e", LOOP_IN_A_WORD])
    assert (study["sentences"], study["longer_than_ratio"], study["at_length_limit"]) == (3, 1, 1)
    assert (study["longest_training_source_words"], study["longest_training_target_words"]) == (5, 4)
    assert study["cases_include_length_limit"] and study["references_preferred_overall"] == 1
    assert study["cases"] == [
        {"id": 1, "longer_than_ratio": True, "at_length_limit": False, "source_words": 5,
         "hypothesis_words": 7, "reference_words": 2, "hypothesis_subwords": 7, "loop_start_word": 1,
         "loop_period": 1, "loop_unit": "word", "hypothesis_objective": pytest.approx(-0.2 * 8 / 8 ** 0.6),
         "reference_objective": pytest.approx(-0.1 * 3 / 3 ** 0.6), "error": "search"},
        {"id": 2, "longer_than_ratio": False, "at_length_limit": True, "source_words": 2,
         "hypothesis_words": 3, "reference_words": 4, "hypothesis_subwords": 200, "loop_start_word": 2,
         "loop_period": 1, "loop_unit": "character", "hypothesis_objective": pytest.approx(-0.01 * 201 / 201 ** 0.6),
         "reference_objective": pytest.approx(-1.0 * 5 / 5 ** 0.6), "error": "model"}]
    variants = {name: (v["bleu_tokenized"], v["longer_than_ratio"], v["ids"], v["at_length_limit"],
                       v["at_length_limit_ids"]) for name, v in study["variants"].items()}
    assert variants == {
        "max-len 1.2x+10": (bleu(["a b c", "d e", LOOP_IN_A_WORD]), 0, [], 1, [2]),
        "lenpen 0.2": (bleu(REFERENCES), 0, [], 0, []),
        "lenpen 1.0": (bleu(["a b c c c c c", "d e", "f g h"]), 1, [0], 0, []),
    }
    assert study["variants"]["lenpen 0.2"]["bleu_tokenized"] == pytest.approx(100.0)
    assert study["variants"]["lenpen 1.0"]["lenpen"] == 1.0


def _study(run_dir, count=1, **extra):
    case = {"id": 3, "source_words": 30, "reference_words": 10, "hypothesis_words": 50,
            "loop_start_word": 28, "loop_period": 2, "hypothesis_objective": -1.0,
            "reference_objective": -2.0, "error": "model"}
    return {**runaways.identify(run_dir), "bleu_tokenized": 30.0, "longer_than_ratio": count,
            "at_length_limit": 0, "longest_training_target_words": 25, "longest_training_source_words": 12,
            "cases": [case] * count, "references_preferred_overall": 2, "sentences": 100,
            "variants": {}, "command": "scripts/runaway_study.py ...", **extra}


def test_runs_are_named_as_the_table_names_them(tmp_path):
    assert runaways.identify(tmp_path / "work" / "multi30k-length" / "rope" / "seed2") == {
        "run_dir": str(tmp_path / "work" / "multi30k-length" / "rope" / "seed2"),
        "run": "multi30k-length rope seed 2", "scale": "multi30k-length", "row": "rope", "seed": 2}
    elsewhere = tmp_path / "checkpoints" / "mine"
    assert runaways.identify(elsewhere) == {"run_dir": str(elsewhere), "run": str(elsewhere)}


def test_a_report_accumulates_runs_across_invocations(tmp_path):
    """Runs studied earlier are kept (their checkpoints may be gone); a run studied again is replaced."""
    old = tmp_path / "old" / "multi30k"
    report = tmp_path / "runaways.json"
    # The format written before studies named their runs: one top-level command, no "run".
    legacy = [{k: v for k, v in _study(old / name / "seed1").items() if k not in ("run", "scale", "row", "seed",
                                                                                   "command")}
              for name in ("rope", "sinusoidal")]
    report.write_text(json.dumps({"command": "scripts/runaway_study.py OLD", "runs": legacy}))
    kept = runaways.load_studies(report)
    assert [(s["run"], s["command"]) for s in kept] == [
        ("multi30k rope seed 1", "scripts/runaway_study.py OLD"),
        ("multi30k sinusoidal seed 1", "scripts/runaway_study.py OLD")]

    new = [_study(tmp_path / "new" / "multi30k" / "rope" / "seed1", count=3, command="NEW"),
           _study(tmp_path / "new" / "multi30k" / "learned" / "seed2", command="NEW")]
    merged = runaways.merge(kept, new)
    assert [(s["run"], s["command"]) for s in merged] == [  # table order: sinusoidal, learned, rpe, rope
        ("multi30k sinusoidal seed 1", "scripts/runaway_study.py OLD"),
        ("multi30k learned seed 2", "NEW"), ("multi30k rope seed 1", "NEW")]
    assert merged[-1]["longer_than_ratio"] == 3


def test_row_summary_counts_what_lies_beyond_the_training_lengths(tmp_path):
    work = tmp_path / "multi30k-length"
    studies = [_study(work / "rope" / "seed1", count=2), _study(work / "rope" / "seed2", count=1)]
    studies[1]["cases"] = [{**studies[1]["cases"][0], "source_words": 12, "loop_start_word": None,
                            "loop_period": None, "hypothesis_words": 20, "error": "search"}]
    assert runaways.row_summary(studies) == [
        # scale, row, runs, runaways, at limit, at the limit only studied, with a loop, model, search,
        # source / loop / hypothesis beyond the training lengths, reference preferred
        ["multi30k-length", "rope", "2", "3", "0", "0 (0 of 2 runs studied)", "2", "2", "1", "2", "2", "2",
         "4/200"]]
    # A study made before source lengths were recorded cannot say: "—", not 0.
    del studies[0]["cases"][0]["source_words"]
    assert runaways.row_summary(studies)[0][9] == "—"
    text = runaways.render(studies, tmp_path / "runaways")
    assert "| multi30k-length | rope | 2 | 3 |" in text and "multi30k-length rope seed 2" in text
    # Scales are not pooled: the same row at another scale is another line.
    other = _study(tmp_path / "multi30k" / "rope" / "seed1")
    assert [line[:2] for line in runaways.row_summary([other, *studies])] == [
        ["multi30k", "rope"], ["multi30k-length", "rope"]]


def test_loops_inside_a_word_are_counted_apart_from_runaways(tmp_path):
    work = tmp_path / "multi30k"
    inside = {"id": 7, "longer_than_ratio": False, "at_length_limit": True, "source_words": 9,
              "reference_words": 8, "hypothesis_words": 2, "loop_start_word": 1, "loop_period": 1,
              "loop_unit": "character", "hypothesis_objective": -1.0, "reference_objective": -0.5,
              "error": "search"}
    new = _study(work / "sinusoidal" / "seed3", cases_include_length_limit=True, at_length_limit=1)
    new["cases"] = new["cases"] + [inside]
    old = _study(work / "sinusoidal" / "seed1")
    summary = runaways.row_summary([old, new])[0]
    assert summary[3:9] == ["2", "1", "1 (1 of 2 runs studied)", "3", "2", "1"]
    assert runaways.row_summary([new])[0][5] == "1"
    text = runaways.render([old, new], tmp_path / "runaways")
    assert "| multi30k sinusoidal seed 3 | 7 | at the limit only |" in text
    assert "1 (inside the word, period 1 characters)" in text
    assert "| multi30k sinusoidal seed 1 | 3 | runaway |" in text  # an old study's case: a runaway


def test_a_report_is_rewritten_from_its_json_without_runs(tmp_path, capsys):
    out = tmp_path / "runaways"
    with pytest.raises(SystemExit):
        runaways.main(["--out", str(out)])  # nothing to study, nothing to rewrite
    assert "no earlier report" in capsys.readouterr().err
    study = _study(tmp_path / "work" / "multi30k" / "rope" / "seed1")
    out.with_suffix(".json").write_text(json.dumps({"runs": [study]}))
    assert runaways.main(["--out", str(out)]) == 0
    assert "| multi30k rope seed 1 |" in out.with_suffix(".md").read_text()
    assert json.loads(out.with_suffix(".json").read_text())["runs"] == [study]
