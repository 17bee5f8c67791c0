"""Parsing fairseq-generate output and the two BLEU conventions."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU

from fairseq_rope.evaluation import scoring
from fairseq_rope.evaluation.scoring import (
    ScoringError,
    compound_split,
    evaluate_translations,
    parse_generate_output,
    tokenized_bleu,
)

# Batch order, log lines interleaved, nbest 2 for id 2, an empty hypothesis (id 3).
GENERATE_OUTPUT = """\
2024-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model(s) from avg.pt
S-2\tthe front @-@ door is red .
T-2\tdie Haus @-@ Tür ist rot .
H-2\t-0.25\tdie Haus @-@ Tür ist rot .
D-2\t-0.25\tdie Haus @-@ Tür ist rot .
P-2\t-0.1 -0.2 -0.3 -0.1 -0.2 -0.3 -0.4
H-2\t-0.90\tdie Tür ist rot .
D-2\t-0.90\tdie Tür ist rot .
S-0\tthe house .
T-0\tdas Haus .
H-0\t-0.10\tdas Haus .
D-0\t-0.10\tdas Haus .
P-0\t-0.1 -0.1 -0.1 -0.1
S-3\tyes\t(tab in source)
T-3\tja
H-3\t-3.5\t
D-3\t-3.5\t
S-1\tI see &quot; it &quot; .
T-1\tich sehe &quot; es &quot; .
H-1\t-0.50\tich sehe &quot; es &quot; .
D-1\t-0.50\tich sehe &quot; es &quot; .
P-1\t-0.5 -0.5 -0.5 -0.5 -0.5 -0.5
2024-01-01 00:00:01 | INFO | fairseq_cli.generate | Translated 4 sentences (30 tokens) in 0.1s
Generate test with beam=4: BLEU4 = 80.00, 90.0/80.0/70.0/60.0 (BP=1.000, ratio=1.000)
"""
RAW_REFS = ['Das Haus.', 'Ich sehe "es".', "Die Haus-Tür ist rot.", "Ja"]


def test_parse_generate_output_restores_original_order():
    translations = parse_generate_output(GENERATE_OUTPUT.splitlines(keepends=True))
    assert [t.id for t in translations] == [0, 1, 2, 3]
    assert [t.reference for t in translations] == [
        "das Haus .", "ich sehe &quot; es &quot; .", "die Haus @-@ Tür ist rot .", "ja"]
    # The first H- line of an id is the best hypothesis.
    assert translations[2].hypothesis == "die Haus @-@ Tür ist rot ."
    assert translations[2].score == -0.25
    assert translations[3].hypothesis == ""
    assert translations[3].source == "yes\t(tab in source)"
    assert translations[0].source == "the house ."


def test_parse_rejects_output_without_hypotheses():
    with pytest.raises(ScoringError, match="no hypotheses"):
        parse_generate_output(["S-0\tx\n", "T-0\ty\n"])


@pytest.mark.parametrize("line, expected", [
    ("Haus-Tür", "Haus ##AT##-##AT## Tür"),
    ("die Haus-Tür ist rot", "die Haus ##AT##-##AT## Tür ist rot"),
    ("a - b", "a - b"),  # a free-standing dash is not a compound
    ("-a b-", "-a b-"),
    ("x-y z-w", "x ##AT##-##AT## y z ##AT##-##AT## w"),
])
def test_compound_split(line, expected):
    assert compound_split(line) == expected


def test_compound_splitting_changes_tokenized_bleu_as_expected():
    hyp, ref = ["A B-C D E"], ["A B-C D F"]
    # Unsplit: 4 tokens, the 4-gram "A B-C D E" does not match -> BLEU 0 (no smoothing).
    unsplit = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyp, [ref])
    assert unsplit.score == 0.0
    # Split: "A B ##AT##-##AT## C D E" -> precisions 5/6, 4/5, 3/4, 2/3, brevity penalty 1.
    score, signature = tokenized_bleu(hyp, ref)
    assert score.score == pytest.approx(100 * (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25)
    assert "tok:none" in signature and "smooth:none" in signature


def test_tokenized_bleu_equals_fairseq_scorer():
    """Convention (a) is what fairseq-score (multi-bleu.perl) computes on the split text."""
    from fairseq.data import Dictionary
    from fairseq.scoring import bleu

    rng = random.Random(0)
    words = [f"w{i}" for i in range(12)] + ["x-y", "p-q-r"]
    refs = [" ".join(rng.choices(words, k=rng.randint(3, 15))) for _ in range(40)]
    hyps = [" ".join(w if rng.random() < 0.7 else rng.choice(words) for w in r.split()[: rng.randint(2, 16)])
            for r in refs]
    dictionary = Dictionary()
    scorer = bleu.Scorer(bleu.BleuConfig(pad=dictionary.pad(), eos=dictionary.eos(), unk=dictionary.unk()))
    for h, r in zip(hyps, refs):
        scorer.add(dictionary.encode_line(compound_split(r)), dictionary.encode_line(compound_split(h)))
    assert tokenized_bleu(hyps, refs)[0].score == pytest.approx(scorer.score(), abs=1e-9)


def test_results_json_has_both_scores(tmp_path):
    raw_ref = tmp_path / "test.de"
    raw_ref.write_text("".join(line + "\n" for line in RAW_REFS))
    translations = parse_generate_output(GENERATE_OUTPUT.splitlines())
    results = evaluate_translations(translations, tmp_path / "eval", "de", raw_reference=raw_ref,
                                    metadata={"checkpoint": "avg.pt"})

    assert (tmp_path / "eval" / "hyps.detok.de").read_text().splitlines() == [
        "das Haus.", 'ich sehe "es".', "die Haus-Tür ist rot.", ""]
    assert (tmp_path / "eval" / "hyps.tok.de").read_text().splitlines()[2] == "die Haus @-@ Tür ist rot ."
    saved = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert saved == results
    assert 0 < saved["bleu_tokenized"] < 100
    assert saved["bleu_tokenized"] == pytest.approx(tokenized_bleu(
        [t.hypothesis for t in translations], [t.reference for t in translations])[0].score)
    # sacreBLEU's defaults (13a, exp smoothing, mixed case), called directly on the detokenized
    # hypotheses written above and the raw references: the same score, to the last bit.
    detok = (tmp_path / "eval" / "hyps.detok.de").read_text(encoding="utf-8").splitlines()
    expected = sacrebleu.corpus_bleu(detok, [RAW_REFS])
    assert saved["sacrebleu"] == expected.score and 0 < expected.score < 100
    assert saved["sacrebleu_details"] == str(expected)
    assert re.fullmatch(r"nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[\d.]+",
                        saved["sacrebleu_signature"])
    assert saved["checkpoint"] == "avg.pt" and saved["num_sentences"] == 4 and saved["date"]
    summary = scoring.summary(saved).splitlines()
    assert summary[0] == f"BLEU (tokenized, compound-split): {saved['bleu_tokenized']:.2f}"
    assert summary[1].startswith(f"sacreBLEU (detokenized): {expected.score:.2f}  nrefs:1|")


def test_sacrebleu_is_unavailable_without_raw_references(tmp_path):
    translations = parse_generate_output(GENERATE_OUTPUT.splitlines())
    results = evaluate_translations(translations, tmp_path, "de", raw_reference=tmp_path / "missing.de")
    assert results["sacrebleu"] is None and results["sacrebleu_signature"] is None
    assert "missing.de not found" in results["sacrebleu_unavailable"]
    assert math.isfinite(results["bleu_tokenized"])
    assert "unavailable" in scoring.summary(results).splitlines()[1]


def test_raw_references_must_match_the_test_set(tmp_path):
    raw_ref = tmp_path / "test.de"
    raw_ref.write_text("only one line\n")
    with pytest.raises(ScoringError, match="has 1 lines but the generate output has 4 sentences"):
        evaluate_translations(parse_generate_output(GENERATE_OUTPUT.splitlines()), tmp_path, "de",
                              raw_reference=raw_ref)


def test_incomplete_translation_is_an_error(tmp_path):
    translations = parse_generate_output(GENERATE_OUTPUT.splitlines())
    with pytest.raises(ScoringError, match=r"4 sentences translated, but the test set has 6 "
                                           r"\(missing ids 4, 5\).*--required-batch-size-multiple 1"):
        evaluate_translations(translations, tmp_path, "de", expected_sentences=6)
    assert not (tmp_path / "results.json").exists()


def write_binarized(prefix: Path, num_sentences: int) -> None:
    """A fairseq-preprocess-style {prefix}.bin/.idx with ``num_sentences`` sentences."""
    import torch
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=100)
    for i in range(num_sentences):
        builder.add_item(torch.IntTensor([4 + i, 2]))
    builder.finalize(f"{prefix}.idx")


def test_cli_infers_language_and_records_decoding(tmp_path, capsys):
    data_bin, raw = tmp_path / "data-bin", tmp_path / "raw"
    data_bin.mkdir()
    raw.mkdir()
    for name in ("test.en-de.en", "test.en-de.de", "valid.en-de.de"):
        write_binarized(data_bin / name, len(RAW_REFS))
    for lang in ("en", "de"):
        (data_bin / f"dict.{lang}.txt").write_text("haus 1\n")
    (raw / "test.de").write_text("".join(line + "\n" for line in RAW_REFS))
    generated = tmp_path / "generate-test.txt"
    generated.write_text(GENERATE_OUTPUT)

    code = scoring.main([str(generated), "--out-dir", str(tmp_path / "eval"), "--data-bin", str(data_bin),
                         "--averaged-checkpoints", "c1.pt", "c2.pt", "--",
                         "fairseq-generate", str(data_bin), "--beam", "4", "--lenpen", "0.6", "--remove-bpe"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("BLEU (tokenized, compound-split): ")
    assert lines[1].startswith("sacreBLEU (detokenized): ")
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["target_lang"] == "de" and results["raw_reference"] == str(raw / "test.de")
    assert results["averaged_checkpoints"] == [str(Path.cwd() / "c1.pt"), str(Path.cwd() / "c2.pt")]
    assert results["decoding"]["beam"] == 4 and results["decoding"]["lenpen"] == 0.6
    assert results["decoding"]["remove_bpe"] == "@@ "
    assert (tmp_path / "eval" / "hyps.detok.de").exists()


@pytest.mark.parametrize("lines, message", [
    (None, "error: --raw-ref {ref}: no such file"),
    (["nur eine Zeile"], "error: raw reference file {ref} has 1 lines but the test set has 40 sentences; "
                         "pass the untokenized references of this test set with --raw-ref"),
])
def test_check_refuses_raw_references_that_do_not_fit(toy_data_bin, tmp_path, capsys, lines, message):
    """What scripts/evaluate.sh runs before averaging and decoding."""
    ref = tmp_path / "refs.de"
    if lines is not None:
        ref.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    before = sorted(tmp_path.iterdir())
    assert scoring.main(["--check", "--data-bin", str(toy_data_bin), "--raw-ref", str(ref)]) == 1
    assert message.format(ref=ref) in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == before
    assert scoring.main(["--check", "--data-bin", str(toy_data_bin)]) == 0  # the default raw/test.de is optional


def test_positional_scores_give_each_hypothesis_its_subwords_before_eos():
    translations = parse_generate_output(GENERATE_OUTPUT.splitlines())
    assert [t.subwords for t in translations] == [3, 5, 6, None]  # H-3 has no P- line


def test_chrf_is_reported_beside_sacrebleu(tmp_path):
    raw_ref = tmp_path / "test.de"
    raw_ref.write_text("".join(line + "\n" for line in RAW_REFS))
    results = evaluate_translations(parse_generate_output(GENERATE_OUTPUT.splitlines()), tmp_path / "eval",
                                    "de", raw_reference=raw_ref)
    # sacreBLEU's chrF defaults (character 6-grams, no word n-grams, beta 2), called directly on
    # the detokenized hypotheses and the raw references.
    detok = (tmp_path / "eval" / "hyps.detok.de").read_text(encoding="utf-8").splitlines()
    expected = sacrebleu.corpus_chrf(detok, [RAW_REFS])
    assert results["chrf"] == expected.score and 0 < expected.score < 100
    assert "nc:6|nw:0" in results["chrf_signature"]
    assert f"chrF (detokenized): {expected.score:.2f}  {results['chrf_signature']}" in scoring.summary(results)


def translation(sid: int, hyp_words: int, ref_words: int, subwords: int) -> scoring.Translation:
    return scoring.Translation(sid, " ".join(["x"] * hyp_words), -1.0, "s", " ".join(["y"] * ref_words), subwords)


def test_runaways_count_long_hypotheses_and_those_stopped_by_the_limit():
    translations = [translation(0, 10, 10, 12), translation(1, 16, 10, 200), translation(2, 15, 10, 30),
                    translation(3, 40, 10, 45)]
    counts = scoring.runaways(translations, scoring.length_limits([5, 5, 5, 5], 0.0, 200))
    assert counts["longer_than_ratio_ids"] == [1, 3]  # 16 and 40 words > 1.5 x 10; 15 is not
    assert counts["at_length_limit_ids"] == [1] and counts["at_length_limit"] == 1
    # A limit tied to the source: 1.2 x 30 + 10 = 46 subwords; sentence 3 stopped at 45 < 46.
    assert scoring.length_limits([30], 1.2, 10) == [46]
    tied = scoring.runaways(translations, [20, 20, 20, 46])
    assert tied["at_length_limit_ids"] == [1, 2]
    assert scoring.runaways(translations)["at_length_limit"] is None  # no limits known


def test_paired_bootstrap_is_sacrebleus_and_needs_equal_counts():
    from fairseq_rope.evaluation.significance import paired_bootstrap

    refs = [f"Ein Hund {i} läuft über die Wiese." for i in range(40)]
    # Equally good systems, each wrong on other sentences: no significant difference.
    one = [r if i % 4 else f"Ein Hund {i} rennt." for i, r in enumerate(refs)]
    other = [r if (i + 2) % 4 else f"Ein Hund {i} rennt." for i, r in enumerate(refs)]
    same = paired_bootstrap(one, other, refs)
    assert same["BLEU"]["baseline"] == pytest.approx(same["BLEU"]["system"])
    assert same["BLEU"]["p_value"] > 0.05 and same["chrF2"]["p_value"] > 0.05
    worse = paired_bootstrap(refs, [f"Eine Katze {i}." for i in range(40)], refs)
    assert worse["BLEU"]["p_value"] < 0.01 and "bs:1000" in worse["BLEU"]["signature"]
    with pytest.raises(ValueError, match="counts must be equal"):
        paired_bootstrap(refs, refs[:-1], refs)


def test_paired_bootstrap_of_identical_outputs_is_not_significant():
    """sacrebleu gives a system tested against itself its smallest p (1/1001); identical
    hypotheses get p = 1, and one changed sentence gets sacrebleu's own p again."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from fairseq_rope.evaluation.significance import paired_bootstrap

    refs = [f"Ein Hund {i} läuft über die Wiese." for i in range(40)]
    hyps = [r if i % 4 else f"Ein Hund {i} rennt." for i, r in enumerate(refs)]
    _, raw = PairedTest([("baseline", hyps), ("system", hyps)], {"BLEU": BLEU()}, [refs],
                        test_type="bs", n_samples=1000)()
    assert raw["BLEU"][1].p_value == pytest.approx(1 / 1001)  # what the override is for
    same = paired_bootstrap(hyps, list(hyps), refs)
    assert same["BLEU"]["p_value"] == same["chrF2"]["p_value"] == 1.0
    assert same["BLEU"]["system"] == same["BLEU"]["baseline"]
    changed = hyps[:-1] + ["Eine Katze."]
    _, raw = PairedTest([("baseline", hyps), ("system", changed)], {"BLEU": BLEU()}, [refs],
                        test_type="bs", n_samples=1000)()
    assert paired_bootstrap(hyps, changed, refs)["BLEU"]["p_value"] == raw["BLEU"][1].p_value
