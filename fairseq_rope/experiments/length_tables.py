"""A length study's tables: BLEU and output length per source-length bucket, and against the
same rows trained on all lengths (:mod:`fairseq_rope.experiments.collect`)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence

from fairseq_rope.evaluation.report import MISSING, NOT_RUN, markdown_table
from fairseq_rope.experiments.cells import bleu_cell, cell
from fairseq_rope.experiments.table import Runs, Scale


def length_buckets(runs: Runs) -> List[Dict[str, Any]]:
    """The bucket list of the first run that has BLEU by length (all runs share the test set)."""
    for rs in runs.values():
        for r in rs:
            if r.get("bleu_by_length"):
                return r["bleu_by_length"]["buckets"]
    return []


def per_bucket(runs: Sequence[Dict[str, Any]], key: str, labels: Sequence[str]) -> List[List[Optional[float]]]:
    """For each bucket label, every run's ``key`` (``bleu`` or ``length_ratio``) in the runs'
    order; None where a run did not measure it."""
    per_run = [{b["bucket"]: b.get(key) for b in (r.get("bleu_by_length") or {}).get("buckets", [])}
               for r in runs]
    return [[p.get(label) for p in per_run] for label in labels]


def length_table(scale: Scale, runs: Runs) -> List[str]:
    """BLEU per source-length bucket, one line per row; † marks buckets longer than any training sentence."""
    assert scale.bucket_edges
    buckets = length_buckets(runs)
    unit = ("source length in words of the raw English (whitespace-separated, punctuation "
            "attached), n = test sentences in the bucket. Tokenized compound-split BLEU per bucket")
    if scale.length_study is not None:
        intro = [f"Trained on sentences of at most {scale.max_train_len} source words; tested on "
                 f"{scale.length_study.per_bucket} sentences per bucket of {unit}; "
                 "† = longer than every training sentence.", ""]
    elif scale.max_train_words is not None:
        intro = [f"Trained on the training pairs of at most {scale.max_train_words} source words; "
                 f"tested on the whole test set, by {unit}; † = longer than every training sentence.", ""]
    else:
        intro = [f"The whole test set by {unit}.", ""]
    if not buckets:
        return intro + ["No finished runs with BLEU by length."]
    longer = scale.max_train_len
    header = ["row"] + [
        f"{b['bucket']}{' †' if longer is not None and b['low'] >= longer else ''} (n={b['sentences']})"
        for b in buckets
    ]
    labels = [b["bucket"] for b in buckets]

    def per_row(key: str, fmt: Callable[[float], str]) -> List[List[str]]:
        return [[name] + ([cell(values, fmt) for values in per_bucket(runs[name], key, labels)]
                          if runs[name] else [NOT_RUN] * len(buckets)) for name in runs]

    longest = _longest_training_pairs(runs)
    note = [f"Longest training pair in BPE tokens (with EOS): {longest}; the learned row's "
            "positions beyond it are untrained."] if longest else []
    ratios = ["", "Hypothesis length over reference length in the same tokens, per bucket (below 1: "
              "the outputs stop short, above 1: they run on; — for runs recorded before it was "
              "measured):", ""] + markdown_table(header, per_row("length_ratio", _ratio))
    return intro + markdown_table(header, per_row("bleu", bleu_cell)) + ratios + ([""] + note if note else [])


def _ratio(value: float) -> str:
    return f"{value:.3f}"


def length_against_full_data(scale: Scale, runs: Runs, full: Scale, full_runs: Runs) -> List[str]:
    """Per row and bucket, this length study's BLEU minus that of the same row trained on all
    lengths, and its output length over theirs.

    Long sentences are harder whatever the training lengths, and a model trained on all of them
    also shortens some, so a length study's BLEU and length ratio by bucket mix length
    extrapolation with difficulty; the same models trained on the full corpus and scored on the
    same test set and buckets take the difficulty out.
    """
    intro = [f"This study's models against the same row trained on all lengths "
             f"([{full.name}.md]({full.name}.md)), per bucket, means over each one's seeds (those "
             "that measured it): the buckets without † show what training on the shorter pairs "
             "only costs within the training lengths; how it grows past them is what each row "
             "loses to length alone.", ""]
    buckets = length_buckets(runs)
    if not buckets:
        return intro + ["No finished runs with BLEU by length."]
    header = ["row"] + [f"{b['bucket']}{' †' if b['low'] >= scale.max_train_len else ''}" for b in buckets]
    labels = [b["bucket"] for b in buckets]

    def per_row(key: str, compare: Callable[[float, float], str]) -> List[List[str]]:
        lines = []
        for name in runs:
            if not runs[name] or not full_runs.get(name):
                lines.append([name] + [NOT_RUN if not runs[name] else f"{full.name} {NOT_RUN}"] * len(buckets))
                continue
            pairs = zip(per_bucket(runs[name], key, labels), per_bucket(full_runs[name], key, labels))
            lines.append([name] + [_compared(study, reference, compare) for study, reference in pairs])
        return lines

    return (intro + ["BLEU minus the full-data model's BLEU:", ""]
            + markdown_table(header, per_row("bleu", lambda a, b: f"{a - b:+.2f}"))
            + ["", "Output length over the full-data model's output length (the hypothesis/reference "
                   "ratios divided; the references are the same): below 1, the study's model stops "
                   "shorter than the same row trained on all lengths:", ""]
            + markdown_table(header, per_row("length_ratio", lambda a, b: f"{a / b:.3f}")))


def _compared(values: Sequence[Optional[float]], reference: Sequence[Optional[float]],
              compare: Callable[[float, float], str]) -> str:
    """``compare`` of the means of the measured values of either side; — if a side has none."""
    ours, theirs = [v for v in values if v is not None], [v for v in reference if v is not None]
    if not ours or not theirs:
        return MISSING
    return compare(statistics.mean(ours), statistics.mean(theirs))


def _longest_training_pairs(runs: Runs) -> str:
    for rs in runs.values():
        for r in rs:
            longest = (r.get("bleu_by_length") or {}).get("longest_training_pair_tokens")
            if longest:
                return f"source {longest['source']}, target {longest['target']}"
    return ""
