"""The corpora of the length-extrapolation studies.

:func:`write_short_pairs` keeps a real corpus's training and validation pairs
of at most ``N`` source words and its whole test set (the ``multi30k-length``
scale).

:func:`write_length_corpus` draws, from the demo corpus's grammar at one
``max_depth``, a training and validation set of sentences of at most ``L``
source words and a test set with the same number of sentences in each length
bucket up to ``3L``; test sentences never occur in training. Trained on short
sentences only, a model's BLEU on the longer buckets measures how its position
encoding extrapolates.

:func:`longest_training_pair` reads back, from a binarized corpus, the longest
position its training pairs reach: where "past the training length" begins.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from fairseq_rope import base
from fairseq_rope.base import PathLike, read_lines
from fairseq_rope.data.demo_corpus import Pair, generate_pairs
from fairseq_rope.data.prepare.pipeline import sha256_file
from fairseq_rope.data.data_bin import infer_language_pair

CORPUS_SETTINGS = "corpus.json"  # written last: its presence marks a complete corpus


@dataclass(frozen=True)
class LengthCorpus:
    """Settings of the length-extrapolation corpus (lengths in raw English whitespace words).

    Training and validation sentences have at most ``max_train_len`` words; the
    test set has ``per_bucket`` sentences in each bucket of ``bucket_width``
    words up to ``num_buckets * bucket_width``. ``max_depth`` 4 reaches 3x14 = 42
    words often enough (~1% of draws at 36-42 words) while keeping the short
    sentences' distribution the demo's.
    """

    max_train_len: int = 14
    bucket_width: int = 7
    num_buckets: int = 6
    per_bucket: int = 150
    train: int = 20000
    valid: int = 500
    max_depth: int = 4
    seed: int = 0

    @property
    def edges(self) -> List[int]:
        return [self.bucket_width * (i + 1) for i in range(self.num_buckets)]


def length_corpus_splits(spec: LengthCorpus) -> Dict[str, List[Pair]]:
    """``{"train", "valid", "test"}`` pairs of the corpus; test sources are absent from train/valid."""
    test: List[Pair] = []
    for i, (low, high) in enumerate(zip([0, *spec.edges[:-1]], spec.edges)):
        # One stream per bucket (seed + 1 + i): each bucket is drawn independently.
        test += generate_pairs(spec.per_bucket, spec.seed + 1 + i, spec.max_depth,
                               min_len=low + 1, max_len=high)
    held_out = {src for src, _ in test}
    need = spec.valid + spec.train
    # Prefix-stable stream: drawing extra for the pairs dropped as test sentences
    # leaves the kept ones the same whatever the test size.
    pool = generate_pairs(need + len(held_out), spec.seed, spec.max_depth,
                          max_len=spec.max_train_len)
    pool = [p for p in pool if p[0] not in held_out][:need]
    return {"train": pool[spec.valid:], "valid": pool[:spec.valid], "test": test}


def write_length_corpus(out_dir: PathLike, spec: LengthCorpus = LengthCorpus()) -> Path:
    """Write ``{train,valid,test}.{en,de}`` and ``corpus.json`` (last) unless already there with ``spec``."""
    out = Path(out_dir)
    settings = {**asdict(spec), "edges": spec.edges}
    marker = out / CORPUS_SETTINGS
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == settings:
        return out
    for split, pairs in length_corpus_splits(spec).items():
        base.write_lines(out / f"{split}.en", [en for en, _ in pairs])
        base.write_lines(out / f"{split}.de", [de for _, de in pairs])
    base.write_json(marker, settings)
    return out


def write_short_pairs(raw_dir: PathLike, out_dir: PathLike, max_words: int) -> Path:
    """Copy a prepared corpus's raw splits, keeping only the training and validation pairs
    of at most ``max_words`` source words; the test set stays whole.

    Reads ``raw_dir/{train,valid,test}.{en,de}`` (a preparation's ``raw/``) and
    writes the same names plus ``corpus.json`` (last) into ``out_dir``, unless
    they are there already from the same inputs and ``max_words``.
    """
    raw, out = Path(raw_dir), Path(out_dir)
    settings = {"source": str(raw.resolve()), "max_train_words": max_words,
                "sha256": {f.name: sha256_file(f) for f in sorted(raw.glob("*.en")) + sorted(raw.glob("*.de"))}}
    marker = out / CORPUS_SETTINGS
    if marker.is_file() and _without(json.loads(marker.read_text(encoding="utf-8")), "pairs") == settings:
        return out
    kept = {}
    for split in ("train", "valid", "test"):
        pairs = list(zip(read_lines(raw / f"{split}.en"), read_lines(raw / f"{split}.de")))
        if split != "test":
            pairs = [(en, de) for en, de in pairs if len(en.split()) <= max_words]
        base.write_lines(out / f"{split}.en", [en for en, _ in pairs])
        base.write_lines(out / f"{split}.de", [de for _, de in pairs])
        kept[split] = len(pairs)
    base.write_json(marker, {**settings, "pairs": kept})
    return out


def _without(mapping: Dict[str, Any], key: str) -> Dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def corpus_lengths(data_bin: Path, split: str = "train") -> Dict[str, np.ndarray]:
    """Length of every source and target of a binarized split, in tokens (with EOS), in pair
    order (a pair's index is its line number, fairseq-generate's sentence id)."""
    from fairseq.data import data_utils

    src, tgt = infer_language_pair(data_bin, split)
    lengths = {}
    for side, lang in (("source", src), ("target", tgt)):
        # Copy the sizes before the dataset goes: they are a view of its mmap, which it
        # unmaps when garbage-collected (a segfault, not an exception).
        dataset = data_utils.load_indexed_dataset(str(data_bin / f"{split}.{src}-{tgt}.{lang}"))
        lengths[side] = np.array(dataset.sizes, dtype=np.int64)
        del dataset
    return lengths


def longest_training_pair(data_bin: Path) -> Dict[str, int]:
    """Longest source and target of the binarized training set, in tokens (with EOS)."""
    return {side: int(sizes.max()) for side, sizes in corpus_lengths(data_bin).items()}
