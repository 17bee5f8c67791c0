"""BLEU by source length on handmade generate output."""

from __future__ import annotations

import json

import pytest

from fairseq_rope.evaluation import bleu_by_length as length_study
from fairseq_rope.evaluation.bleu_by_length import bleu_by_length, buckets_for, parse_edges
from fairseq_rope.evaluation.scoring import ScoringError, parse_generate_output

# Sources of 3, 3, 6 and 12 tokenized words. Short sentences are translated
# perfectly, the 6-word one badly, the 12-word one perfectly but for one word.
GENERATE_OUTPUT = """\
S-0\ta b c
T-0\tdas ist gut und schön
H-0\t-0.1\tdas ist gut und schön
S-1\td e f
T-1\tder Hund-Besitzer schläft heute sehr tief
H-1\t-0.2\tder Hund-Besitzer schläft heute sehr tief
2024-01-01 12:00:00 | INFO | fairseq_cli.generate | a log line between sentences
S-2\ta b c d e f
T-2\tdie Katze sieht den kleinen Vogel im Garten
H-2\t-0.9\tein Pferd liest
S-3\ta b c d e f g h i j k l
T-3\tder alte Mann liest heute ein langes Buch , weil er Zeit hat
H-3\t-0.3\tder alte Mann liest heute ein kurzes Buch , weil er Zeit hat
"""


@pytest.fixture
def translations():
    return parse_generate_output(GENERATE_OUTPUT.splitlines())


def test_buckets_counts_and_a_perfect_bucket_scores_100(translations):
    rows = bleu_by_length(translations, edges=[4, 8])
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("1-4", 2), ("5-8", 1), (">8", 1)]
    assert rows[0]["bleu"] == pytest.approx(100.0)
    assert rows[1]["bleu"] == pytest.approx(0.0)  # no 4-gram match: 0 without smoothing
    assert 0 < rows[2]["bleu"] < 100


def test_each_bucket_says_how_long_its_hypotheses_are_against_the_references(translations):
    rows = bleu_by_length(translations, edges=[4, 8])
    assert rows[0]["length_ratio"] == pytest.approx(1.0)
    assert rows[1]["length_ratio"] == pytest.approx(3 / 8)
    assert rows[2]["length_ratio"] == pytest.approx(1.0)
    empty = bleu_by_length(translations, edges=[3, 5, 6, 12])[1]
    assert empty["sentences"] == 0 and empty["length_ratio"] is None


def test_empty_buckets_are_reported_without_a_score(translations):
    rows = bleu_by_length(translations, edges=[3, 5, 6, 12])
    assert [(r["bucket"], r["sentences"], r["bleu"] is None) for r in rows] == [
        ("1-3", 2, False), ("4-5", 0, True), ("6", 1, False), ("7-12", 1, False)]


def test_lengths_from_an_aligned_source_file(translations):
    # The raw source: sentence 2 is long here, sentence 3 short.
    raw = ["one two", "one two three", " ".join(["w"] * 20), "x y"]
    rows = bleu_by_length(translations, edges=[5, 10], source_lines=raw)
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("1-5", 3), ("6-10", 0), (">10", 1)]
    with pytest.raises(ScoringError, match="source file has 2 lines"):
        bleu_by_length(translations, edges=[5], source_lines=raw[:2])


@pytest.mark.parametrize("text", ["", "10,5", "0,4", "a,b", "4,4"])
def test_bad_edges_are_errors(text):
    with pytest.raises(ValueError, match="bucket edges"):
        parse_edges(text)


def test_open_bucket_only_when_needed():
    assert [b.label for b in buckets_for([7, 14], [1, 14])] == ["1-7", "8-14"]
    assert [b.label for b in buckets_for([7, 14], [15])] == ["1-7", "8-14", ">14"]


def test_cli_on_an_eval_dir_prints_and_writes_json(tmp_path, capsys):
    (tmp_path / "generate-test.txt").write_text(GENERATE_OUTPUT, encoding="utf-8")
    assert length_study.main([str(tmp_path), "--edges", "4,8"]) == 0
    out = capsys.readouterr().out
    assert "1-4" in out and "100.00" in out and "S- lines" in out
    report = json.loads((tmp_path / "bleu_by_length.json").read_text())
    assert [b["sentences"] for b in report["buckets"]] == [2, 1, 1]
    assert report["edges"] == [4, 8] and "compound splitting" in report["bleu_convention"]


def test_cli_missing_input_is_an_error(tmp_path, capsys):
    assert length_study.main([str(tmp_path)]) == 1
    assert "no fairseq-generate output" in capsys.readouterr().err


def test_cli_non_utf8_source_file_names_the_line(tmp_path, capsys):
    generate = tmp_path / "generate-test.txt"
    generate.write_text("S-0\tein Haus\nT-0\ta house\nH-0\t-0.1\ta house\n", encoding="utf-8")
    source = tmp_path / "test.de"
    source.write_bytes(b"\xffein Haus\n")
    assert length_study.main([str(generate), "--source-file", str(source)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(source) in err and "line 1" in err
    assert not (tmp_path / "bleu_by_length.json").exists()
