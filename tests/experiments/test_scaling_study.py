"""The RoPE scaling study on fake decodings: buckets, runaways and paired tests, against
sacrebleu computed directly; and the decodings it asks fairseq-generate for."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import List, Sequence

import numpy as np
from sacrebleu.metrics import BLEU

from fairseq_rope.experiments import scaling_study
from fairseq_rope.experiments.scaling_study import PLAIN, Variant

WORDS = "ein der die das Hund Mann Frau Kind läuft sitzt auf dem Gras Straße rot blau".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_generate(path: Path, sources: Sequence[str], refs: Sequence[str], hyps: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"S-{i}\t{s}\nT-{i}\t{r}\nH-{i}\t-0.5\t{h}\n"
                            for i, (s, r, h) in enumerate(zip(sources, refs, hyps))), encoding="utf-8")


def fake_runs(tmp_path: Path, seeds: int = 2):
    """Two rope runs: 20 short sources (5 words) and 60 past the training length (14 words).
    Plain RoPE drops the second half of each long hypothesis; linear-2 translates perfectly;
    ntk-2 doubles every long hypothesis (a runaway); the other variants equal plain."""
    rng = random.Random(0)
    sources = [sentence(rng, 5) for _ in range(20)] + [sentence(rng, 14) for _ in range(60)]
    refs = [sentence(rng, len(s.split())) for s in sources]
    data = tmp_path / "data"
    (data / "raw").mkdir(parents=True)
    (data / "data-bin").mkdir()
    (data / "raw" / "test.en").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (data / "raw" / "test.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    short = [r if len(s.split()) <= 12 else " ".join(r.split()[:7]) for s, r in zip(sources, refs)]
    runs = []
    for seed in range(1, seeds + 1):
        run = tmp_path / "work" / "multi30k-length" / "rope" / f"seed{seed}"
        (run / "eval").mkdir(parents=True)
        (run / "eval" / "results.json").write_text(json.dumps({
            "checkpoint": str(run / "checkpoint_avg_last5.pt"), "data": str(data / "data-bin"),
            "raw_reference": str(data / "raw" / "test.de"), "target_lang": "de"}))
        for variant in scaling_study.variants():
            hyps = {"linear-2": refs, "ntk-2": [r if len(s.split()) <= 12 else r + " " + r
                                                 for s, r in zip(sources, refs)]}.get(variant.name, short)
            write_generate(run / "scaling" / variant.name / "generate-test.txt", sources, refs, hyps)
        runs.append(run)
    sinusoidal = tmp_path / "work" / "multi30k-length" / "sinusoidal" / "seed1"
    write_generate(sinusoidal / "eval" / "generate-test.txt", sources, refs, short)
    return runs, sinusoidal, sources, refs, short


def fake_corpus_lengths(monkeypatch) -> None:
    """Token lengths of the fake runs' data-bin: 19 training pairs of 12 tokens and one of 18/20
    (longest pair 20, 95 % of pairs 12); the test sets' sources and references: words + EOS."""
    def corpus_lengths(data_bin, split="train"):
        if split == "train":
            return {"source": np.array([12] * 19 + [18]), "target": np.array([11] * 19 + [20])}
        raw = Path(data_bin).parent / "raw"
        return {side: np.array([len(line.split()) + 1 for line in (raw / f"test.{lang}").read_text().splitlines()])
                for side, lang in (("source", "en"), ("target", "de"))}

    from fairseq_rope.experiments import length_corpus

    monkeypatch.setattr(scaling_study, "corpus_lengths", corpus_lengths)
    monkeypatch.setattr(length_corpus, "corpus_lengths", corpus_lengths)  # its longest_training_pair


def bleu(hyps: List[str], refs: List[str]) -> float:
    return BLEU(tokenize="none").corpus_score(hyps, [refs]).score


def test_study_measures_each_bucket_and_tests_past_the_training_length(tmp_path, monkeypatch):
    runs, sinusoidal, sources, refs, short = fake_runs(tmp_path)
    fake_corpus_lengths(monkeypatch)
    monkeypatch.setattr(scaling_study, "generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("decoded")))
    report = scaling_study.study(runs, factors=(2.0,), baselines=[sinusoidal])

    assert set(report["variants"]) == {v.name for v in scaling_study.variants((2.0,))}
    assert set(map(tuple, (l.values() for l in report["original_length"].values()))) == {(20, 12)}
    positions = {row["bucket"]: row for row in report["positions"]}
    # Long sources: 15 tokens, past the 95 % length (12), not past the longest source (18).
    assert positions["13-16"]["median_source_tokens"] == 15 and positions["13-16"]["sources_past_typical"] == 60
    assert positions["13-16"]["sources_past_longest"] == positions["13-16"]["references_past_longest"] == 0
    assert positions["1-8"]["sources_past_typical"] == 0 and positions["9-12"]["median_source_tokens"] is None
    long = slice(20, 80)
    plain = {row["bucket"]: row for row in report["variants"][PLAIN][0]}
    assert plain["1-8"]["sentences"] == 20 and plain["13-16"]["sentences"] == 60
    assert abs(plain["13-16"]["bleu"] - bleu(short[long], refs[long])) < 1e-9
    assert abs(plain["1-8"]["bleu"] - 100.0) < 1e-9
    assert plain["13-16"]["length_ratio"] == sum(len(h.split()) for h in short[long]) / (60 * 14)
    perfect = {row["bucket"]: row for row in report["variants"]["linear-2"][1]}
    assert abs(perfect["13-16"]["bleu"] - 100.0) < 1e-9 and perfect["13-16"]["length_ratio"] == 1.0
    doubled = {row["bucket"]: row for row in report["variants"]["ntk-2"][0]}
    assert doubled["13-16"]["runaways"] == 60 and doubled["1-8"]["runaways"] == 0
    assert report["baselines"]["sinusoidal"][0][0]["bucket"] == "1-8"

    # Paired tests: only past the training length (12 words), both runs pooled.
    tests = report["significance"]
    assert set(tests["linear-2"]) == {"13-16"}
    better = tests["linear-2"]["13-16"]
    assert better["sentences"] == 120 and abs(better["system"] - 100.0) < 1e-9 and better["p_value"] < 0.05
    assert abs(better["baseline"] - BLEU().corpus_score(short[long] * 2, [refs[long] * 2]).score) < 1e-9
    same = tests["yarn-2"]["13-16"]  # decodes as plain RoPE does
    assert same["system"] == same["baseline"] == better["baseline"]

    md = scaling_study.render(report, "scripts/rope_scaling_study.py X")
    assert "`scripts/rope_scaling_study.py X`" in md and "13-16† (n=60)" in md
    assert "| rope, linear-2 |" in md and "| sinusoidal (no scaling) |" in md
    assert "| sources the `-p95` rules scale (longer than 12) | 0 | 0 | 60 |" in md
    assert "| median source length (tokens with EOS) | 6 | — | 15 |" in md
    assert "100.00 (p " in md.split("## Against plain RoPE")[1]


def test_variants_reach_fairseq_generate_as_model_overrides(tmp_path, monkeypatch):
    runs, *_ = fake_runs(tmp_path, seeds=1)
    calls = []
    decoded = (runs[0] / "scaling" / PLAIN / "generate-test.txt").read_text()

    def fake_generate(checkpoint, data_bin, out, extra=()):
        calls.append((Path(checkpoint).name, list(extra)))
        Path(out).write_text(decoded)

    monkeypatch.setattr(scaling_study, "generate", fake_generate)
    run = scaling_study.EvaluatedRun.read(runs[0])
    lengths = {scaling_study.LONGEST: 31, scaling_study.TYPICAL: 19}
    typical = Variant("dynamic-linear", length=scaling_study.TYPICAL)
    assert typical.name == "dynamic-linear-p95" and typical in scaling_study.variants()
    for variant in (Variant(PLAIN), Variant("dynamic-ntk"), typical, Variant("yarn", 2.0)):
        (runs[0] / "scaling" / variant.name / "generate-test.txt").unlink()
        run.decode(variant, lengths)
    assert calls == [
        ("checkpoint_avg_last5.pt", []),
        ("checkpoint_avg_last5.pt", ["--model-overrides", "{'rope_scaling': 'dynamic-ntk', 'rope_original_length': 31}"]),
        ("checkpoint_avg_last5.pt", ["--model-overrides",
                                     "{'rope_scaling': 'dynamic-linear', 'rope_original_length': 19}"]),
        ("checkpoint_avg_last5.pt", ["--model-overrides", "{'rope_scaling': 'yarn', 'rope_original_length': 31, "
                                     "'rope_scaling_factor': 2.0}"]),
    ]
    run.decode(Variant("yarn", 2.0), lengths)  # decoded already: not again
    assert len(calls) == 4


def test_original_lengths_are_the_longest_pair_and_the_95th_percentile(tmp_path):
    """On a binarized corpus of 40 pairs, against its raw text: a pair's length is its longer
    side in words plus EOS; 95 % of 40 pairs is 38."""
    from tests.conftest import fairseq_cli

    rng = random.Random(1)
    sides = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(38)] + [(3, 14), (21, 5)]
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang, side in (("en", 0), ("de", 1)):
        (raw / f"train.{lang}").write_text("".join(sentence(rng, n[side]) + "\n" for n in sides), encoding="utf-8")
    fairseq_cli("fairseq-preprocess", ["--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
                                       "--workers", "1", "--trainpref", raw / "train", "--destdir", tmp_path / "bin"])
    pairs = [max(n) + 1 for n in sides]
    # The smallest length that 95 % of the pairs do not exceed: numpy's inverted-CDF percentile,
    # the longest of the 38 short pairs (10: a side of 9 words and EOS), not the two long ones.
    p95 = int(np.percentile(pairs, 95, method="inverted_cdf"))
    assert p95 == max(pairs[:38]) == 10
    assert scaling_study.original_lengths(tmp_path / "bin") == {"longest": 22, "p95": p95}


def test_collect_shows_the_study_in_the_length_table(tmp_path, monkeypatch):
    """main() writes the report where collect looks for it by default (docs/results/rope_scaling_SCALE),
    and the length study's table shows it; the full-data scale's does not."""
    from fairseq_rope.experiments import collect
    from fairseq_rope.experiments.table import SCALES

    runs, sinusoidal, *_ = fake_runs(tmp_path)
    results = tmp_path / "results"
    fake_corpus_lengths(monkeypatch)
    monkeypatch.setattr(scaling_study, "generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("decoded")))
    default_path = scaling_study.report_path
    monkeypatch.setattr(scaling_study, "report_path", lambda scale, results_dir=results: default_path(scale, results_dir))
    assert scaling_study.main([*map(str, runs), "--factors", "2", "--baselines", str(sinusoidal)]) == 0
    assert (results / "rope_scaling_multi30k-length.md").is_file()

    collect.collect(SCALES["multi30k-length"], tmp_path / "work", results)
    md = (results / "multi30k-length.md").read_text()
    section = md.split("## RoPE scaling at decoding time")[1].split("\n## ")[0]
    assert "[rope_scaling_multi30k-length.md](rope_scaling_multi30k-length.md)" in section
    assert "`scripts/rope_scaling_study.py " in section
    bleu = section.split("### BLEU (tokenized, compound-split)")[1].split("### ")[0]
    assert "| decoding | 1-8 (n=20) | 9-12 (n=0) | 13-16† (n=60) |" in bleu
    assert "| rope, linear-2 | 100.00 | — | 100.00 |" in bleu  # both runs decode it perfectly
    assert "| sinusoidal (no scaling) |" in bleu
    assert "(p " in section.split("### Against plain RoPE past the training length")[1]

    collect.collect(SCALES["multi30k"], tmp_path / "work", results)
    assert "RoPE scaling" not in (results / "multi30k.md").read_text()


def test_a_baseline_can_be_a_committed_record(tmp_path, monkeypatch):
    """A run whose work directory is gone is shown from its record (docs/results/runs/...):
    the BLEU and length per bucket that reproduce recorded, and its runaways per bucket from
    the sentence ids the evaluation listed; a record listing none shows —."""
    import pytest

    from fairseq_rope.base import FairseqRopeError
    from fairseq_rope.evaluation.bleu_by_length import length_report
    from fairseq_rope.evaluation.scoring import read_generate_output, runaways
    from fairseq_rope.experiments.table import MULTI30K_EDGES

    runs, sinusoidal, sources, refs, short = fake_runs(tmp_path, seeds=1)
    # Runaways in two buckets: sentence 3 (5 words) and 25, 30 (14 words) run on to twice their reference.
    hyps = [f"{r} {r}" if i in (3, 25, 30) else h for i, (r, h) in enumerate(zip(refs, short))]
    decoded = sinusoidal / "eval" / "generate-test.txt"
    write_generate(decoded, sources, refs, hyps)
    data = tmp_path / "data"
    record = tmp_path / "docs" / "results" / "runs" / "multi30k-length" / "sinusoidal" / "seed2"
    record.mkdir(parents=True)
    by_length = length_report(decoded, MULTI30K_EDGES, data / "raw" / "test.en")
    (record / "run.json").write_text(json.dumps({"row": "sinusoidal", "bleu_by_length": by_length,
                                                 "runaways": runaways(read_generate_output(decoded))}))
    fake_corpus_lengths(monkeypatch)

    evaluated = scaling_study.study(runs, factors=(2.0,), baselines=[sinusoidal])["baselines"]["sinusoidal"][0]
    report = scaling_study.study(runs, factors=(2.0,), baselines=[record])
    recorded = report["baselines"]["sinusoidal"][0]
    assert recorded == evaluated
    # Both against sacrebleu on each bucket's sentences: the 20 of 5 words, the 60 of 14.
    members = {"1-8": slice(0, 20), "13-16": slice(20, 80)}
    assert {b["bucket"]: b["sentences"] for b in recorded if b["sentences"]} == {"1-8": 20, "13-16": 60}
    for bucket in recorded:
        if bucket["sentences"]:
            rows = members[bucket["bucket"]]
            assert abs(bucket["bleu"] - bleu(hyps[rows], refs[rows])) < 1e-9
            words = lambda lines: sum(len(line.split()) for line in lines)  # noqa: E731
            assert bucket["length_ratio"] == pytest.approx(words(hyps[rows]) / words(refs[rows]), rel=1e-12)
    assert {b["bucket"]: b["runaways"] for b in recorded if b["runaways"]} == {"1-8": 1, "13-16": 2}

    # A record from before the evaluation listed its runaways' ids: the cells are —, with a note.
    older = json.loads((record / "run.json").read_text())
    del older["runaways"]["longer_than_ratio_ids"]
    (record / "run.json").write_text(json.dumps(older))
    report = scaling_study.study(runs, factors=(2.0,), baselines=[record])
    assert all(b["runaways"] is None for b in report["baselines"]["sinusoidal"][0])
    md = scaling_study.render(report, "scripts/rope_scaling_study.py X")
    table = md.split("## Hypotheses longer than 1.5x")[1].split("\n## ")[0]
    assert "| sinusoidal (no scaling) | — | — | — |" in table and "committed record" in table

    other = json.loads((record / "run.json").read_text())
    other["bleu_by_length"]["buckets"][0]["sentences"] -= 1
    (record / "run.json").write_text(json.dumps(other))
    with pytest.raises(FairseqRopeError, match="another test set"):
        scaling_study.study(runs, factors=(2.0,), baselines=[record])
    other["bleu_by_length"]["edges"] = [10, 20]
    (record / "run.json").write_text(json.dumps(other))
    with pytest.raises(FairseqRopeError, match="buckets"):
        scaling_study.study(runs, factors=(2.0,), baselines=[record])
    with pytest.raises(FairseqRopeError, match="neither an evaluated run"):
        scaling_study.study(runs, factors=(2.0,), baselines=[tmp_path / "missing" / "seed1"])
