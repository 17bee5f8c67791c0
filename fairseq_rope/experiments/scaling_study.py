"""Inference-time RoPE scaling on the length study (issue 28): every scaling decoded on
the same trained RoPE models, per source-length bucket against plain RoPE.

``scripts/rope_scaling_study.py RUN_DIR [RUN_DIR ...] [--out docs/results/rope_scaling_multi30k-length]
[--factors 1.5,2,3] [--baselines RUN_DIR ...]``

Each RUN_DIR is an evaluated ``rope`` run of a length study (``multi30k-length``): its
averaged checkpoint (``checkpoint_avg_last5.pt``) decodes the test set once per
:class:`Variant`, with the scaling passed through ``fairseq-generate --model-overrides``
(the checkpoint is not changed), into ``RUN_DIR/scaling/<variant>/generate-test.txt``; a
rerun decodes only what is missing. The original length ``L`` that the rules scale from
is the run's longest training pair, in subword tokens with EOS (source or target,
whichever is longer): the longest position the model saw in training. The dynamic rules
are decoded a second time from the length that 95 % of the training pairs do not exceed
(``-p95`` variants), since the positions near the longest were seen in a handful of pairs
only (:func:`original_lengths`).

Per variant and bucket (:data:`~fairseq_rope.experiments.table.MULTI30K_EDGES`, raw English
words): tokenized BLEU and hypothesis/reference length (means over the runs), hypotheses
longer than 1.5x their reference, and, for buckets past the training length with enough
sentences, sacrebleu's paired bootstrap of the variant against plain RoPE on the runs'
test sets pooled. ``--baselines`` adds other runs of the same study (sinusoidal, alibi) as
rows, without scaling: evaluated runs from their own decoding, or committed records
(``docs/results/runs/<scale>/<row>/seedN``) from the BLEU by length they keep (:func:`baseline`).

The report goes to ``--out`` (``.json`` and ``.md``), by default
``docs/results/rope_scaling_<scale>`` (:func:`report_path`), where
``reproduce_table.sh collect --scale <scale>`` finds it and shows its tables in
``<scale>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, command_line, read_lines, report_error
from fairseq_rope.evaluation.bleu_by_length import Bucket, bleu_by_length, buckets_for
from fairseq_rope.evaluation.decoding import generate
from fairseq_rope.evaluation.report import markdown_table
from fairseq_rope.evaluation.scoring import (
    RUNAWAY_RATIO,
    Translation,
    detokenize,
    read_generate_output,
    runaways,
)
from fairseq_rope.evaluation.significance import paired_bootstrap
from fairseq_rope.experiments.length_corpus import corpus_lengths, longest_training_pair
from fairseq_rope.experiments.table import DEFAULT_RESULTS_DIR, MULTI30K_EDGES, MULTI30K_MAX_TRAIN_WORDS

#: Scalings whose factor the rule derives from lengths (no sweep): each method at the
#: scale of the sentence's source length (--rope-scaling dynamic-*, issue 28's source rule);
#: and those swept over S.
RULE_SCALINGS = ("dynamic-linear", "dynamic-ntk", "dynamic-yarn")
SWEPT_SCALINGS = ("linear", "ntk", "yarn")
DEFAULT_FACTORS = (1.5, 2.0, 3.0)
#: Fewest pooled sentences in a bucket for a paired bootstrap (fewer: not tested).
MIN_BOOTSTRAP_SENTENCES = 50
PLAIN = "none"
#: The original lengths L a variant can scale from (:func:`original_lengths`): the longest
#: training pair, and the length that 95 % of training pairs do not exceed.
LONGEST, TYPICAL = "longest", "p95"
TYPICAL_QUANTILE = 0.95


@dataclass(frozen=True)
class Variant:
    """One decoding of a RoPE model: a ``--rope-scaling`` mode, its factor if swept, and the
    original length it scales from (the name says which when it is not the longest)."""

    scaling: str
    factor: Optional[float] = None
    length: str = LONGEST

    @property
    def name(self) -> str:
        name = self.scaling if self.factor is None else f"{self.scaling}-{self.factor:g}"
        return name if self.length == LONGEST else f"{name}-{self.length}"

    def overrides(self, original_length: int) -> Dict[str, Any]:
        """The model arguments this decoding overrides (plain RoPE: none)."""
        if self.scaling == PLAIN:
            return {}
        values: Dict[str, Any] = {"rope_scaling": self.scaling, "rope_original_length": original_length}
        if self.factor is not None:
            values["rope_scaling_factor"] = self.factor
        return values


def variants(factors: Sequence[float] = DEFAULT_FACTORS) -> List[Variant]:
    """Plain RoPE, the length-derived rules from each original length, then each swept
    scaling at each factor."""
    return ([Variant(PLAIN)] + [Variant(s, length=length) for length in (LONGEST, TYPICAL) for s in RULE_SCALINGS]
            + [Variant(s, f) for s in SWEPT_SCALINGS for f in factors])


def original_lengths(data_bin: Path) -> Dict[str, int]:
    """The original lengths L, in tokens with EOS, of pairs measured by their longer side:
    the longest training pair (the longest position the model saw), and the smallest length
    that at least :data:`TYPICAL_QUANTILE` of the training pairs do not exceed (positions
    past it were seen in few pairs: in the multi30k length study, 2 % of the sources reach
    18 tokens)."""
    lengths = corpus_lengths(data_bin)
    pairs = np.sort(np.maximum(lengths["source"], lengths["target"]))
    return {LONGEST: int(pairs[-1]), TYPICAL: int(pairs[math.ceil(TYPICAL_QUANTILE * len(pairs)) - 1])}


@dataclass(frozen=True)
class EvaluatedRun:
    """What a study needs of an evaluated run (its ``eval/results.json``)."""

    run_dir: Path
    checkpoint: Path
    data_bin: Path
    raw_reference: Path
    target_lang: str

    @classmethod
    def read(cls, run_dir: Path) -> "EvaluatedRun":
        path = run_dir / "eval" / "results.json"
        if not path.is_file():
            raise FairseqRopeError(f"{run_dir} is not evaluated (no {path})")
        results = json.loads(path.read_text(encoding="utf-8"))
        return cls(run_dir, Path(results["checkpoint"]), Path(results["data"]),
                   Path(results["raw_reference"]), results["target_lang"])

    def decode(self, variant: Variant, lengths: Dict[str, int]) -> Path:
        """``RUN_DIR/scaling/<variant>/generate-test.txt``, decoded unless it exists, with the
        variant's original length from ``lengths`` (:func:`original_lengths`)."""
        out = self.run_dir / "scaling" / variant.name / "generate-test.txt"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            overrides = variant.overrides(lengths[variant.length])
            print(f"decoding {self.run_dir} with {variant.name}", file=sys.stderr)
            with base.atomic_path(out) as tmp:
                generate(self.checkpoint, self.data_bin, tmp,
                         extra=["--model-overrides", repr(overrides)] if overrides else ())
        return out


def bucket_ids(sources: Sequence[str]) -> List[Tuple[Bucket, List[int]]]:
    """The study's buckets of the test set and the sentence ids in each, by the raw English
    words of each source (an empty line counts as one word, as in :func:`measure`)."""
    words = [max(1, len(line.split())) for line in sources]
    return [(bucket, [i for i, n in enumerate(words) if bucket.contains(n)])
            for bucket in buckets_for(MULTI30K_EDGES, words)]


def positions(test: Dict[str, np.ndarray], sources: Sequence[str], longest: Dict[str, int],
              typical: int) -> List[Dict[str, Any]]:
    """Per bucket, how far the test sentences (``test``: their token lengths, from
    :func:`corpus_lengths`) reach past the positions training covered: median source length
    in tokens (with EOS), sources longer than the longest training source, references longer
    than the longest training target (``longest``: :func:`longest_training_pair`), and sources
    the ``-p95`` rules scale (longer than ``typical``)."""
    rows = []
    for bucket, ids in bucket_ids(sources):
        src, ref = test["source"][ids], test["target"][ids]
        rows.append({"bucket": bucket.label, "low": bucket.low, "sentences": len(ids),
                     "median_source_tokens": float(np.median(src)) if ids else None,
                     "sources_past_longest": int((src > longest["source"]).sum()),
                     "references_past_longest": int((ref > longest["target"]).sum()),
                     "sources_past_typical": int((src > typical).sum())})
    return rows


def measure(translations: Sequence[Translation], sources: Sequence[str]) -> List[Dict[str, Any]]:
    """The length study's buckets (BLEU, hypothesis/reference length), with runaways per bucket."""
    return _with_runaways(bleu_by_length(translations, MULTI30K_EDGES, sources),
                          set(runaways(translations)["longer_than_ratio_ids"]), sources)


def _with_runaways(rows: Sequence[Dict[str, Any]], runaway_ids: Optional[Set[int]],
                   sources: Sequence[str]) -> List[Dict[str, Any]]:
    """Bucket rows with the number of runaways (``runaway_ids``, test sentence ids) in each;
    None for all where the ids are unknown."""
    ids = {bucket.label: set(members) for bucket, members in bucket_ids(sources)}
    return [{**row, "runaways": None if runaway_ids is None else len(ids[row["bucket"]] & runaway_ids)}
            for row in rows]


def study(run_dirs: Sequence[Path], factors: Sequence[float] = DEFAULT_FACTORS,
          baselines: Sequence[Path] = ()) -> Dict[str, Any]:
    """Decode every variant of every run (what is missing) and measure it; JSON-ready."""
    runs = [EvaluatedRun.read(r) for r in run_dirs]
    if not runs:
        raise FairseqRopeError("no runs to study")
    sources = read_lines(runs[0].data_bin.parent / "raw" / "test.en")
    decoded: Dict[str, List[List[Translation]]] = {}
    report: Dict[str, Any] = {"length_unit": "raw English words of test.en", "original_length": {},
                              "variants": {}, "baselines": {}}
    for run in runs:
        lengths = original_lengths(run.data_bin)
        report["original_length"][str(run.run_dir)] = lengths
        for variant in variants(factors):
            decoded.setdefault(variant.name, []).append(read_generate_output(run.decode(variant, lengths)))
    # The runs of a study share its data: where its test sentences lie, once.
    data_bin = runs[0].data_bin
    report["longest_training_pair"] = longest_training_pair(data_bin)
    report["positions"] = positions(corpus_lengths(data_bin, "test"), sources, report["longest_training_pair"],
                                    report["original_length"][str(runs[0].run_dir)][TYPICAL])
    for name, per_run in decoded.items():
        report["variants"][name] = [measure(t, sources) for t in per_run]
    for run_dir in baselines:
        row = run_dir.parent.name  # WORK/SCALE/ROW/seedN or docs/results/runs/SCALE/ROW/seedN
        report["baselines"].setdefault(row, []).append(baseline(run_dir, sources))
    report["significance"] = significance(decoded, sources, read_lines(runs[0].raw_reference),
                                          runs[0].target_lang)
    return report


def baseline(run_dir: Path, sources: Sequence[str]) -> List[Dict[str, Any]]:
    """The buckets of a row shown without scaling: an evaluated run's own decoding, measured as
    the variants are; or, where only its record is left (``docs/results/runs/SCALE/ROW/seedN``,
    written by ``collect``), the BLEU and length ratio per bucket that its ``run.json`` keeps,
    and its runaways per bucket from the sentence ids it lists (None where it lists none)."""
    decoded = run_dir / "eval" / "generate-test.txt"
    if decoded.is_file():
        return measure(read_generate_output(decoded), sources)
    record = run_dir / "run.json"
    if not record.is_file():
        raise FairseqRopeError(f"{run_dir} is neither an evaluated run (no {decoded}) nor a run's record (no {record})")
    recorded = json.loads(record.read_text(encoding="utf-8"))
    by_length = recorded.get("bleu_by_length") or {}
    if list(by_length.get("edges", [])) != list(MULTI30K_EDGES):
        raise FairseqRopeError(f"{record} has no BLEU by length at the study's buckets (edges {list(MULTI30K_EDGES)})")
    if sum(bucket["sentences"] for bucket in by_length["buckets"]) != len(sources):
        raise FairseqRopeError(f"{record} was scored on another test set "
                               f"({sum(b['sentences'] for b in by_length['buckets'])} sentences, not {len(sources)})")
    return _with_runaways(by_length["buckets"], _recorded_runaway_ids(recorded), sources)


def _recorded_runaway_ids(record: Dict[str, Any]) -> Optional[Set[int]]:
    """The test sentences a record counts as runaways by the study's own measure (longer than
    ``RUNAWAY_RATIO`` × the reference), or None where it does not list them by that measure."""
    recorded = record.get("runaways") or {}
    if recorded.get("ratio") != RUNAWAY_RATIO or recorded.get("longer_than_ratio_ids") is None:
        return None
    return set(recorded["longer_than_ratio_ids"])


def significance(decoded: Dict[str, List[List[Translation]]], sources: Sequence[str],
                 references: Sequence[str], target_lang: str) -> Dict[str, Dict[str, Any]]:
    """Per variant and bucket past the training length: sacrebleu's paired bootstrap against
    plain RoPE on the runs' test sets pooled (detokenized hypotheses, raw references)."""
    tests: Dict[str, Dict[str, Any]] = {}
    for bucket, ids in bucket_ids(sources):
        if bucket.low < MULTI30K_MAX_TRAIN_WORDS or len(ids) * len(decoded[PLAIN]) < MIN_BOOTSTRAP_SENTENCES:
            continue
        for name, per_run in decoded.items():
            if name == PLAIN:
                continue
            texts: List[List[str]] = [[], [], []]
            for plain, run in zip(decoded[PLAIN], per_run):
                hyps = [{t.id: t.hypothesis for t in translations} for translations in (plain, run)]
                texts[0] += detokenize([hyps[0][i] for i in ids], target_lang)
                texts[1] += detokenize([hyps[1][i] for i in ids], target_lang)
                texts[2] += [references[i] for i in ids]
            test = paired_bootstrap(*texts)["BLEU"]
            tests.setdefault(name, {})[bucket.label] = {"sentences": len(texts[2]), **test}
    return tests


# --- The report


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def _cells(per_run: Sequence[List[Dict[str, Any]]], key: str, fmt: str) -> List[str]:
    """One cell per bucket: the mean over the runs of ``key``."""
    cells = []
    for i in range(len(per_run[0])):
        value = _mean([rows[i][key] for rows in per_run])
        cells.append("—" if value is None else format(value, fmt))
    return cells


def _lengths(report: Dict[str, Any], which: str) -> str:
    """The runs' original lengths of one kind, e.g. ``34`` or ``33, 34``."""
    return ", ".join(map(str, sorted({lengths[which] for lengths in report["original_length"].values()})))


def _positions_table(report: Dict[str, Any], columns: List[str], heading: str) -> List[str]:
    """Where the test sentences of each bucket lie against the positions training covered."""
    rows, longest = report["positions"], report["longest_training_pair"]
    lines = [["median source length (tokens with EOS)",
              *("—" if r["median_source_tokens"] is None else f"{r['median_source_tokens']:g}" for r in rows)],
             [f"sources longer than the longest training source ({longest['source']})",
              *(str(r["sources_past_longest"]) for r in rows)],
             [f"references longer than the longest training target ({longest['target']})",
              *(str(r["references_past_longest"]) for r in rows)],
             [f"sources the `-{TYPICAL}` rules scale (longer than {_lengths(report, TYPICAL)})",
              *(str(r["sources_past_typical"]) for r in rows)]]
    return [f"{heading} Test sentences against the training positions", "",
            "Subword tokens of the binarized test set, per bucket of raw English words: how many "
            "sentences need positions that no training pair had, and how many the dynamic rules "
            f"scale from the `-{TYPICAL}` length (from the longest pair, only sources longer than "
            f"{_lengths(report, LONGEST)}).", "",
            *markdown_table(["test sentences", *columns], lines), ""]


def report_path(scale: str, results_dir: Path = DEFAULT_RESULTS_DIR) -> Path:
    """The study of a length scale's runs, without suffix (``.json``, ``.md``): the default
    ``--out``, and where ``collect`` finds the study to show it in ``<scale>.md``."""
    return results_dir / f"rope_scaling_{scale}"


def render(report: Dict[str, Any], command: str) -> str:
    """The study as markdown: what was decoded, then :func:`tables`."""
    plain = report["variants"][PLAIN]
    out = ["# RoPE scaling on the length study", "",
           f"Written by `{command}` on {datetime.date.today().isoformat()}. Every rope row decodes the "
           f"same {len(plain)} trained RoPE model(s) (their averaged checkpoints) with the scaling "
           "given to fairseq-generate by `--model-overrides`; beam 4, length penalty 0.6. Original "
           f"length L (subword tokens with EOS, a pair's longer side): the longest training pair, "
           f"{_lengths(report, LONGEST)}; for the `-{TYPICAL}` rows the length "
           f"{TYPICAL_QUANTILE:.0%} of the training pairs do not exceed, {_lengths(report, TYPICAL)}. Buckets: "
           f"{report['length_unit']}; † past the training length ({MULTI30K_MAX_TRAIN_WORDS} words). "
           "Means over the runs.", ""]
    return "\n".join(out + tables(report, "##"))


def tables(report: Dict[str, Any], heading: str) -> List[str]:
    """BLEU, length ratio and runaways per bucket, one line per decoding, then the paired tests
    against plain RoPE; each under a ``heading`` (markdown, e.g. ``##``)."""
    plain = report["variants"][PLAIN]
    labels = [row["bucket"] + ("†" if row["low"] >= MULTI30K_MAX_TRAIN_WORDS else "") for row in plain[0]]
    sizes = [str(row["sentences"]) for row in plain[0]]
    rows = {**{f"rope, {name}": runs for name, runs in report["variants"].items()},
            **{f"{name} (no scaling)": runs for name, runs in report["baselines"].items()}}
    header = ["decoding", *(f"{label} (n={n})" for label, n in zip(labels, sizes))]
    out: List[str] = []
    if report.get("positions"):
        out += _positions_table(report, header[1:], heading)
    for title, key, fmt in (("BLEU (tokenized, compound-split)", "bleu", ".2f"),
                            ("Hypothesis / reference length", "length_ratio", ".3f"),
                            ("Hypotheses longer than 1.5x their reference (per run)", "runaways", ".1f")):
        out += [f"{heading} {title}", ""]
        out += markdown_table(header, [[name, *_cells(runs, key, fmt)] for name, runs in rows.items()]) + [""]
        if key == "runaways" and any(b[key] is None for runs in rows.values() for buckets in runs for b in buckets):
            out += ["—: a row read from a committed record that does not list its runaways' sentences "
                    "(the run's own table has its runaways over the whole test set).", ""]
    out += [f"{heading} Against plain RoPE past the training length", "",
            "sacrebleu's paired bootstrap (sacreBLEU on detokenized hypotheses and raw references), "
            f"the runs' sentences of each bucket pooled; buckets with fewer than {MIN_BOOTSTRAP_SENTENCES} "
            "pooled sentences are not tested.", ""]
    tested = sorted({label for tests in report["significance"].values() for label in tests})
    lines = [[name, *(f"{t['baseline']:.2f} → {t['system']:.2f} (p {t['p_value']:.3f})"
                      if (t := tests.get(label)) else "—" for label in tested)]
             for name, tests in report["significance"].items()]
    out += (markdown_table(["decoding", *tested], lines) if lines else ["No bucket to test."]) + [""]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/rope_scaling_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="evaluated rope runs of a length study (SAVE_DIR)")
    parser.add_argument("--out", type=Path,
                        help="output path without suffix (.json, .md); default: docs/results/rope_scaling_SCALE, "
                        "SCALE the runs' (WORK_DIR/SCALE/rope/seedN), which `collect --scale SCALE` shows")
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in DEFAULT_FACTORS),
                        help="factors S swept for linear, ntk and yarn (default: %(default)s)")
    parser.add_argument("--baselines", nargs="*", type=Path, default=[],
                        help="other runs of the study shown without scaling: evaluated runs (WORK_DIR/SCALE/ROW/seedN) "
                        "or their records (docs/results/runs/SCALE/ROW/seedN)")
    args = parser.parse_args(argv)
    out = args.out or report_path(args.runs[0].resolve().parent.parent.name)
    command = command_line("scripts/rope_scaling_study.py", argv)
    try:
        factors = [float(f) for f in args.factors.split(",")]
        report = study(args.runs, factors, args.baselines)
    except (FairseqRopeError, OSError, ValueError) as e:
        return report_error(e)
    base.write_json(out.with_suffix(".json"), {"command": command, **report})
    base.write_text(out.with_suffix(".md"), render(report, command))
    print(f"wrote {out.with_suffix('.md')}", file=sys.stderr)
    return 0
