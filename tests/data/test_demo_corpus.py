"""Tests for the synthetic EN→DE demo corpus: determinism, splits, German
grammar on hand-built trees, depth/length control and the CLI."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from fairseq_rope.data import demo_corpus as dc
from fairseq_rope.data.demo_corpus import NP, Clause, Sentence, render

from tests.conftest import REPO

SUBORDINATORS_EN = {"who", "that", "because", "when", "while", "although"}
SUBORDINATORS_DE = {"dass", "weil", "wenn", "während", "obwohl"}


# --- helpers to build trees by English lemma ------------------------------------


def np_(en: str, det: str = "the", plural: bool = False, adj: Optional[str] = None,
        rel: Optional[Clause] = None) -> NP:
    noun = next(n for n in dc.NOUNS + dc.NAMES if n.en == en)
    adjective = next(a for a in dc.ADJECTIVES if a.en == adj) if adj else None
    return NP(noun, "name" if noun in dc.NAMES else det, plural, adjective, rel)


def verb(en: str, subj_cat: str = "P") -> dc.Verb:
    return next(v for v in dc.VERBS if v.en == en and subj_cat in v.subj)


def word(en: str) -> dc.Word:
    table = dc.TIME_ADVERBS + dc.FREQ_ADVERBS + dc.CONJUNCTIONS
    if en in dc.MANNER:
        return dc.Word(en, dc.MANNER[en], "manner")
    return next(w for w in table if w.en == en)


# --- grammar on hand-built sentences ------------------------------------------------

CASES = {
    "V2 after fronted time adverb": (
        Sentence(Clause(verb("sees"), np_("man"), np_("dog"), adv=word("today"))),
        "Today the man sees the dog.", "Heute sieht der Mann den Hund."),
    "verb-final subordinate clause": (
        Sentence(Clause(verb("sleeps"), np_("child"), sub=(word("because"), Clause(
            verb("reads"), np_("woman"), np_("book", "a"))))),
        "The child sleeps because the woman reads a book.",
        "Das Kind schläft, weil die Frau ein Buch liest."),
    "V2 after fronted subordinate clause": (
        Sentence(Clause(verb("plays", "A"), np_("cat")),
                 pre=(word("when"), Clause(verb("sleeps", "A"), np_("dog")))),
        "When the dog sleeps, the cat plays.", "Wenn der Hund schläft, spielt die Katze."),
    "accusative masculine, mixed/weak adjective endings": (
        Sentence(Clause(verb("sees"), np_("man", adj="old"), np_("man", "a", adj="old"))),
        "The old man sees an old man.", "Der alte Mann sieht einen alten Mann."),
    "neuter indefinite, feminine, müde + ending": (
        Sentence(Clause(verb("buys"), np_("woman", "a", adj="tired"), np_("house", "a", adj="old"))),
        "A tired woman buys an old house.", "Eine müde Frau kauft ein altes Haus."),
    "plural possessive (weak) and bare plural (strong)": (
        Sentence(Clause(verb("likes", "A"), np_("dog", "my", True, "tired"),
                        np_("cat", "a", True, "old"))),
        "My tired dogs like old cats.", "Meine müden Hunde mögen alte Katzen."),
    "subject relative clause with commas": (
        Sentence(Clause(verb("reads"), np_("man", rel=Clause(verb("sees"), obj=np_("dog"),
                                                             gap="subj")), np_("book", "a"))),
        "The man who sees the dog reads a book.",
        "Der Mann, der den Hund sieht, liest ein Buch."),
    "object relative clause, neuter pronoun, plural verb": (
        Sentence(Clause(verb("sleeps"), np_("child", rel=Clause(verb("sees"), np_("woman", plural=True),
                                                                gap="obj")))),
        "The child that the women see sleeps.", "Das Kind, das die Frauen sehen, schläft."),
    "frequency adverb and extraposed relative in verb-final clause": (
        Sentence(Clause(verb("sleeps", "A"), np_("dog"), sub=(word("because"), Clause(
            verb("sees"), np_("man"), np_("cat", rel=Clause(verb("plays", "A"), gap="subj")),
            adv=word("often"))))),
        "The dog sleeps because the man often sees the cat that plays.",
        "Der Hund schläft, weil der Mann oft die Katze sieht, die spielt."),
    "that-clause, name subject, frequency adverb, animals fressen": (
        Sentence(Clause(verb("says"), np_("Anna"), comp=Clause(
            verb("eats", "A"), np_("cow", plural=True), np_("cake", "a")), adv=word("often"))),
        "Anna often says that the cows eat a cake.",
        "Anna sagt oft, dass die Kühe einen Kuchen fressen."),
    "manner adverb after inverted subject": (
        Sentence(Clause(verb("sings"), np_("girl", "a"), adv=word("happily")),
                 pre=(word("while"), Clause(verb("works"), np_("Peter")))),
        "While Peter works, a girl sings happily.", "Während Peter arbeitet, singt ein Mädchen fröhlich."),
}


@pytest.mark.parametrize("name", list(CASES))
def test_grammar_hand_built(name: str) -> None:
    sentence, en, de = CASES[name]
    assert render(sentence) == (en, de)


# --- determinism, splits, files ---------------------------------------------------


def test_deterministic_and_seed_dependent() -> None:
    a = dc.generate_pairs(300, seed=1)
    assert a == dc.generate_pairs(300, seed=1)
    assert a != dc.generate_pairs(300, seed=2)
    assert a[:100] == dc.generate_pairs(100, seed=1)  # prefix-stable
    assert len({en for en, _ in a}) == 300


def test_write_corpus_files_aligned_and_disjoint(tmp_path: Path) -> None:
    res = dc.write_corpus(tmp_path / "a", train=200, valid=30, test=40, seed=3)
    pairs = dict(dc.generate_pairs(270, seed=3))
    sources = {}
    for split, n in (("train", 200), ("valid", 30), ("test", 40)):
        info = res[split]
        assert info["lines"] == n
        en_text = Path(info["en"]).read_text(encoding="utf-8")
        de_text = Path(info["de"]).read_text(encoding="utf-8")
        assert en_text.endswith("\n") and de_text.endswith("\n")
        en_lines, de_lines = en_text.splitlines(), de_text.splitlines()
        assert len(en_lines) == len(de_lines) == n
        assert all(pairs[en] == de for en, de in zip(en_lines, de_lines))  # aligned
        for line in en_lines + de_lines:
            assert re.fullmatch(r"[A-ZÄÖÜ][^ ]*( [^ ]+)*\.", line), line
        sources[split] = set(en_lines)
    assert not sources["train"] & (sources["valid"] | sources["test"])
    assert not sources["valid"] & sources["test"]
    assert not list(tmp_path.glob("a/.*"))  # no temp files left behind
    # Same arguments -> byte-identical files.
    dc.write_corpus(tmp_path / "b", train=200, valid=30, test=40, seed=3)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes()


def test_test_split_stable_when_train_grows(tmp_path: Path) -> None:
    small = dc.write_corpus(tmp_path / "s", train=50, valid=20, test=20, seed=4)
    big = dc.write_corpus(tmp_path / "b", train=500, valid=20, test=20, seed=4)
    for split in ("valid", "test"):
        assert Path(small[split]["de"]).read_bytes() == Path(big[split]["de"]).read_bytes()


# --- depth and length ---------------------------------------------------------------


def test_depth_zero_has_no_subordinate_clauses() -> None:
    for en, de in dc.generate_pairs(500, seed=5, max_depth=0):
        assert "," not in de and "," not in en
        assert not SUBORDINATORS_EN & set(en.lower().rstrip(".").split()), en
        assert not SUBORDINATORS_DE & set(de.lower().rstrip(".").split()), de


def test_deeper_means_longer_and_clauses_appear() -> None:
    means = [statistics.mean(map(dc.src_len, dc.generate_pairs(1000, seed=6, max_depth=d)))
             for d in (0, 1, 2, 4)]
    assert means == sorted(means) and means[0] + 3 < means[2], means
    de_text = " ".join(de for _, de in dc.generate_pairs(1000, seed=6, max_depth=2))
    for marker in (", dass ", ", weil ", ", der ", ", den ", ", die ", ", das "):
        assert marker in de_text


def test_length_filters_and_buckets() -> None:
    pairs = dc.generate_pairs(200, seed=7, min_len=8, max_len=12)
    assert all(8 <= dc.src_len(p) <= 12 for p in pairs)
    long = dc.generate_pairs(3, seed=7, max_depth=8, min_len=60)
    assert all(dc.src_len(p) >= 60 for p in long)
    mixed = dc.generate_pairs(300, seed=7)
    assert dc.filter_by_length(mixed, 5, 9) == [p for p in mixed if 5 <= len(p[0].split()) <= 9]
    buckets = dc.bucket_by_length(mixed, width=5)
    assert sum(map(len, buckets.values())) == 300
    assert all(k <= dc.src_len(p) < k + 5 for k, ps in buckets.items() for p in ps)
    with pytest.raises(ValueError):
        dc.generate_pairs(1, max_depth=0, min_len=30)


def test_vocabulary_is_small() -> None:
    pairs = dc.generate_pairs(3000, seed=8)
    for side in (0, 1):
        types = {w for p in pairs for w in re.findall(r"\w+", p[side])}
        assert 100 < len(types) < 400, len(types)


# --- CLI ------------------------------------------------------------------------------


def test_cli_writes_same_files_as_api(tmp_path: Path) -> None:
    args = ["--train", "60", "--valid", "10", "--test", "10", "--seed", "9", "--max-depth", "1"]
    proc = subprocess.run([sys.executable, "-m", "fairseq_rope.data.demo_corpus", "--out-dir",
                           str(tmp_path / "cli"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "train: 60 pairs" in proc.stdout and "test.de" in proc.stdout
    dc.write_corpus(tmp_path / "api", 60, 10, 10, seed=9, max_depth=1)
    names = sorted(f.name for f in (tmp_path / "cli").iterdir())
    assert names == sorted(f"{s}.{l}" for s in ("train", "valid", "test") for l in ("en", "de"))
    for name in names:
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes()
