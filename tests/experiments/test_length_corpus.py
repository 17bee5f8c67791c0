"""The length-extrapolation corpus: short training sentences, bucketed test sentences."""

from __future__ import annotations

import json

from fairseq_rope.data.demo_corpus import src_len
from fairseq_rope.evaluation.bleu_by_length import buckets_for
from fairseq_rope.experiments.length_corpus import LengthCorpus, length_corpus_splits, write_length_corpus


def test_length_corpus_is_short_in_training_bucketed_in_test_and_disjoint():
    spec = LengthCorpus(max_train_len=6, bucket_width=3, num_buckets=4, per_bucket=20,
                        train=300, valid=30, max_depth=3)
    splits = length_corpus_splits(spec)
    assert (len(splits["train"]), len(splits["valid"]), len(splits["test"])) == (300, 30, 80)
    assert max(src_len(p) for p in splits["train"] + splits["valid"]) <= 6
    lengths = [src_len(p) for p in splits["test"]]
    assert [(b.label, sum(map(b.contains, lengths))) for b in buckets_for(spec.edges, lengths)] == [
        ("1-3", 20), ("4-6", 20), ("7-9", 20), ("10-12", 20)]
    train_sources = {src for src, _ in splits["train"] + splits["valid"]}
    assert not train_sources & {src for src, _ in splits["test"]}


def test_write_length_corpus_is_written_once(tmp_path):
    spec = LengthCorpus(max_train_len=6, bucket_width=3, num_buckets=2, per_bucket=5,
                        train=20, valid=5, max_depth=2)
    out = write_length_corpus(tmp_path / "corpus", spec)
    assert sorted(p.name for p in out.iterdir()) == [
        "corpus.json", "test.de", "test.en", "train.de", "train.en", "valid.de", "valid.en"]
    assert len((out / "test.en").read_text().splitlines()) == 10
    stamp = (out / "train.en").stat().st_mtime_ns
    write_length_corpus(out, spec)
    assert (out / "train.en").stat().st_mtime_ns == stamp  # unchanged settings: not rewritten
    assert json.loads((out / "corpus.json").read_text())["edges"] == [3, 6]
