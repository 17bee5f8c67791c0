"""No input under the limits costs much more than text of its size: a sentence's source is
cut to the model's bound (its ``max_source_positions`` less the EOS, else 1,023 subwords),
the same source is what the search and the re-scoring at the length limit see, and the
sentences at the limit are decoded again in one call and their open hypotheses scored in one
(not one encoding of the source per hypothesis). Checked by counting CTranslate2's calls on
the toy export, deterministically; the cost itself is measured by
``python -m fairseq_rope_serve.benchmark_long`` (docs/benchmarks/serving-long-inputs.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, List, Tuple

import pytest

from fairseq_rope_serve.decoding import Decoding, max_source_subwords, translate, translate_nbest
from fairseq_rope_serve.model_dir import ModelDirectory
from fairseq_rope_serve.server.app import create_app
from fairseq_rope_serve.translate import main as translate_main
from fairseq_rope_serve.translator import TextTranslator
from tests.serve.conftest import app_server, post


class CountingTranslator:
    """A CTranslate2 translator whose calls are recorded: (kind, sources as given)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: List[Tuple[str, List[List[str]]]] = []

    def translate_batch(self, sources, **options) -> Any:
        self.calls.append(("translate", [list(s) for s in sources]))
        return self.inner.translate_batch(sources, **options)

    def score_batch(self, sources, targets, **options) -> Any:
        assert options.get("max_input_length") == 0  # the sources come cut: nothing cut again
        self.calls.append(("score", [list(s) for s in sources]))
        return self.inner.score_batch(sources, targets, **options)

    def kinds(self) -> List[str]:
        return [kind for kind, _ in self.calls]


@pytest.fixture(scope="module")
def model(exported) -> TextTranslator:
    return TextTranslator(exported("rope"), threads=1)


def test_the_default_bound_and_one_rescoring_call_for_every_sentence_at_the_limit(model):
    """Three sentences stopped by a length limit of 3 (one of 3,000 subwords): one search, one
    search again for the three, one scoring of all their open hypotheses; every source the
    model sees is at most 1,023 subwords, the same cut source in all three calls."""
    assert model.settings.max_source_positions is None and max_source_subwords(model.settings) == 1023
    long, medium, short = ["x"] * 3000, model.subwords(["The king writes the newspaper."])[0] * 30, ["x", "x"]
    counting = CountingTranslator(model.translator)
    nbest = translate_nbest(counting, [long, medium, short], Decoding(max_len_b=3), model.settings)
    assert counting.kinds() == ["translate", "translate", "score"]
    first, again, scored = (sources for _, sources in counting.calls)
    assert first == again == [long[:1023], medium, short]
    assert set(map(tuple, scored)) <= set(map(tuple, first)) and len(scored) >= 3  # open hypotheses of each
    assert [h[0].source_truncated for h in nbest] == [True, False, False]
    assert all(len(h[0].tokens) <= 3 for h in nbest)


def test_the_bound_is_the_exports_max_source_positions(model):
    """An export with a position table of 20 positions: sources cut to 19 subwords (its EOS is
    the 20th), in the search and in the scoring at the limit alike."""
    settings: ModelDirectory = replace(model.settings, max_source_positions=20)
    assert max_source_subwords(settings) == 19
    counting = CountingTranslator(model.translator)
    sentence = model.subwords(["The king writes the newspaper."])[0] * 4
    best = translate(counting, [sentence], Decoding(max_len_b=3), settings)[0]
    assert best.source_truncated and counting.kinds() == ["translate", "translate", "score"]
    assert all(sources == [sentence[:19]] * len(sources) for _, sources in counting.calls)


def test_a_cut_source_translates_as_its_first_subwords(model):
    """Cutting is translating the first 1,023 subwords: the same hypotheses, told as cut (the
    scores to float rounding: the two are other rows of one batch, which CTranslate2 may sum
    in another order)."""
    counting = CountingTranslator(model.translator)
    cut, head = translate(counting, [["x"] * 2000, ["x"] * 1023], Decoding(), model.settings)
    assert (cut.tokens, cut.source_truncated) == (head.tokens, True)
    assert cut.score == pytest.approx(head.score, rel=1e-6)
    assert not head.source_truncated


def test_the_server_says_which_text_was_cut(model):
    short = "The king writes the newspaper."
    with app_server(create_app(model)) as port:
        reply = post(port, {"q": [short, "x " * 1100], "source": "en", "target": "de"})
        assert reply.status == 200 and reply.body["truncated"] == [False, True]
        assert reply.body["translatedText"] == model.translate([short, "x " * 1100])
        reply = post(port, {"q": f"{short}\n" + "x " * 1100, "source": "en", "target": "de"})
        assert reply.status == 200 and reply.body["truncated"] is True
        reply = post(port, {"q": short, "source": "en", "target": "de"})
        assert reply.body == {"translatedText": model.translate([short])[0]}  # nothing cut: no field


def test_the_translate_command_warns_of_the_lines_it_cut(exported, tmp_path, capsys):
    (tmp_path / "in.en").write_text("Hello.\n" + "x " * 1100 + "\nBye.\n", encoding="utf-8")
    assert translate_main([str(exported("rope")), "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "out"),
                           "--threads", "1", "--quiet"]) == 0
    assert len((tmp_path / "out").read_text(encoding="utf-8").splitlines()) == 3
    assert capsys.readouterr().err == ("warning: 1 line(s) longer than the model's 1023 subwords were translated "
                                       "cut to them: line 2\n")


def test_the_long_input_benchmark_on_the_toy_export(exported, raw_test_set, tmp_path):
    """The benchmark's shapes are the ordinary text's size, each answered by a real server; its
    report is a section of the file, its figures a JSON list beside it (not timed here)."""
    from fairseq_rope_serve import benchmark_long

    (tmp_path / "text.en").write_text("\n".join(raw_test_set) + "\n", encoding="utf-8")
    out = tmp_path / "long.md"
    for label in ("first", "second"):
        assert benchmark_long.main([str(exported("rope")), str(tmp_path / "text.en"), "--rounds", "1",
                                    "--max-chars", "600", "--max-sentences", "8", "--out", str(out),
                                    "--label", label]) == 0
    runs = json.loads(out.with_suffix(".json").read_text())
    assert [run["label"] for run in runs] == ["first", "second"]
    rows = runs[0]["rows"]
    assert [r["shape"] for r in rows] == [benchmark_long.ORDINARY, "one long word", "letters, no spaces",
                                          "one-letter words", "8 short lines"]
    size = rows[0]["characters"]
    assert 550 <= size <= 600 and all(abs(r["characters"] - size) <= 0.05 * size for r in rows)
    assert [r["lines"] for r in rows] == [rows[0]["lines"], 1, 1, 1, 8]
    text = out.read_text(encoding="utf-8")
    assert text.startswith(benchmark_long.TITLE) and text.count("| ordinary text | ") == 2
    assert "## first" in text and "## second" in text
