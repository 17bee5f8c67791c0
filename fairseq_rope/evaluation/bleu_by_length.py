"""BLEU by source length.

:func:`bleu_by_length` splits a test set's translations into buckets of source
length and scores each bucket with the paper's convention, tokenized BLEU with
compound splitting (:func:`fairseq_rope.evaluation.scoring.tokenized_bleu`). Bucket edges
``e1 < e2 < ... < ek`` give the buckets ``1..e1, e1+1..e2, ..., e(k-1)+1..ek``
(lengths ``lo < n <= hi``; an empty source counts in the first), plus ``>ek``
when some sentence is longer. Length is counted in whitespace-separated words
of either

* the source as fairseq-generate prints it (``S-`` lines: Moses-tokenized,
  BPE removed with ``--remove-bpe``; punctuation counts as words), the default, or
* a source file aligned with the test set (``--source-file``, line ``i`` for
  sentence id ``i``), e.g. the raw English ``DATA/raw/test.en``, whose words
  keep punctuation attached as :func:`fairseq_rope.data.demo_corpus.src_len` counts them.

``scripts/bleu_by_length.py GENERATE_OUTPUT|EVAL_DIR [--edges 10,20,30]
[--source-file FILE]`` prints the table and writes it as JSON.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, PathLike, read_lines, report_error
from fairseq_rope.evaluation.scoring import (
    TOKENIZED_CONVENTION,
    ScoringError,
    Translation,
    read_generate_output,
    tokenized_bleu,
)

DEFAULT_EDGES = (10, 20, 30, 40, 50, 60)
GENERATE_SOURCE_UNIT = (
    "words of the fairseq-generate source (S- lines: Moses-tokenized, BPE removed)"
)


@dataclass(frozen=True)
class Bucket:
    """Source lengths ``low < n <= high`` (``high`` None: no upper bound)."""

    low: int
    high: Optional[int]

    @property
    def label(self) -> str:
        if self.high is None:
            return f">{self.low}"
        return f"{self.low + 1}-{self.high}" if self.high > self.low + 1 else str(self.high)

    def contains(self, length: int) -> bool:
        return length > self.low and (self.high is None or length <= self.high)


def parse_edges(text: str) -> List[int]:
    """``"10,20,30"`` → ``[10, 20, 30]``; strictly increasing positive integers."""
    try:
        edges = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bucket edges must be comma-separated integers, got {text!r}") from None
    check_edges(edges)
    return edges


def check_edges(edges: Sequence[int]) -> None:
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket edges must be strictly increasing positive integers, got {list(edges)}")


def buckets_for(edges: Sequence[int], lengths: Sequence[int]) -> List[Bucket]:
    """The buckets of ``edges``, plus an open last one only if some length exceeds the last edge."""
    check_edges(edges)
    lows = [0, *edges[:-1]]
    buckets = [Bucket(lo, hi) for lo, hi in zip(lows, edges)]
    if any(n > edges[-1] for n in lengths):
        buckets.append(Bucket(edges[-1], None))
    return buckets


def source_lengths(
    translations: Sequence[Translation], source_lines: Optional[Sequence[str]] = None
) -> List[int]:
    """Source length in words of each translation: of ``source_lines[id]``, else of its ``S-`` line."""
    if source_lines is None:
        missing = [t.id for t in translations if t.source is None]
        if missing:
            raise ScoringError(f"no source (S-{missing[0]} line) in the generate output")
        return [len(t.source.split()) for t in translations]
    beyond = [t.id for t in translations if t.id >= len(source_lines)]
    if beyond:
        raise ScoringError(
            f"the source file has {len(source_lines)} lines, but the generate output has "
            f"sentence id {beyond[0]}: it is not this test set's source"
        )
    return [len(source_lines[t.id].split()) for t in translations]


def bleu_by_length(
    translations: Sequence[Translation],
    edges: Sequence[int] = DEFAULT_EDGES,
    source_lines: Optional[Sequence[str]] = None,
) -> List[Dict[str, Any]]:
    """Per bucket: label, bounds, number of sentences, tokenized compound-split BLEU and the
    hypotheses' length over the references' in the same tokens (both None if empty): a model that
    stops early on long inputs shows there, one that runs away shows above 1."""
    # An empty source counts as length 1, i.e. in the first bucket.
    lengths = [max(n, 1) for n in source_lengths(translations, source_lines)]
    if any(t.reference is None for t in translations):
        raise ScoringError("the generate output has hypotheses without references (T- lines)")
    rows = []
    for bucket in buckets_for(edges, lengths):
        members = [t for t, n in zip(translations, lengths) if bucket.contains(n)]
        rows.append({"bucket": bucket.label, "low": bucket.low, "high": bucket.high,
                     "sentences": len(members), **_bleu(members)})
    return rows


def _bleu(translations: Sequence[Translation]) -> Dict[str, Optional[float]]:
    if not translations:
        return {"bleu": None, "length_ratio": None}
    score, _ = tokenized_bleu([t.hypothesis for t in translations], [t.reference for t in translations])
    return {"bleu": score.score, "length_ratio": score.sys_len / score.ref_len if score.ref_len else None}


def format_table(rows: Sequence[Dict[str, Any]], unit: str) -> str:
    """A plain-text table of :func:`bleu_by_length`'s rows."""
    lines = [f"source length: {unit}", f"{'bucket':>10}  {'sentences':>9}  {'BLEU':>6}  {'hyp/ref':>7}"]
    for row in rows:
        bleu = "-" if row["bleu"] is None else f"{row['bleu']:.2f}"
        ratio = "-" if row.get("length_ratio") is None else f"{row['length_ratio']:.3f}"
        lines.append(f"{row['bucket']:>10}  {row['sentences']:>9}  {bleu:>6}  {ratio:>7}")
    return "\n".join(lines)


def length_report(
    generate_output: PathLike, edges: Sequence[int], source_file: Optional[PathLike] = None
) -> Dict[str, Any]:
    """BLEU by length of a fairseq-generate output file, with what was measured and how."""
    source_lines = read_lines(source_file) if source_file is not None else None
    unit = GENERATE_SOURCE_UNIT if source_file is None else f"whitespace words of {source_file}"
    return {
        "generate_output": str(Path(generate_output).resolve()),
        "length_unit": unit,
        "bleu_convention": TOKENIZED_CONVENTION,
        "edges": list(edges),
        "buckets": bleu_by_length(read_generate_output(generate_output), edges, source_lines),
    }


# --- Command line


def resolve_generate_output(path: PathLike, subset: str = "test") -> Path:
    """``path`` itself, or ``path/generate-<subset>.txt`` for an evaluation directory."""
    path = Path(path)
    if path.is_dir():
        path = path / f"generate-{subset}.txt"
    if not path.is_file():
        raise ScoringError(f"no fairseq-generate output at {path}")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bleu_by_length.py",
        description="Tokenized compound-split BLEU (the paper's convention) per source-length "
        "bucket of a fairseq-generate output.",
        epilog="Buckets: edges 10,20,30 give 1-10, 11-20, 21-30 and, if any sentence is longer, "
        ">30. Length is in words of the generate output's S- lines (Moses-tokenized, BPE "
        "removed; punctuation counts) unless --source-file names an aligned source file "
        "(e.g. DATA/raw/test.en: raw whitespace words).",
    )
    parser.add_argument("input", help="fairseq-generate output, or an evaluation directory "
                        "(scripts/evaluate.sh's SAVE_DIR/eval) holding generate-SUBSET.txt")
    parser.add_argument("--edges", type=parse_edges, default=list(DEFAULT_EDGES),
                        help="comma-separated upper bucket edges (default: %(default)s)")
    parser.add_argument("--source-file", help="measure length on this file (line i = sentence id i)")
    parser.add_argument("--subset", default="test", help="subset, for an evaluation directory")
    parser.add_argument("--output", help="JSON to write (default: bleu_by_length.json beside the input)")
    args = parser.parse_args(argv)
    try:
        generate_output = resolve_generate_output(args.input, args.subset)
        report = length_report(generate_output, args.edges, args.source_file)
    except (FairseqRopeError, OSError) as e:
        return report_error(e)
    output = Path(args.output) if args.output else generate_output.parent / "bleu_by_length.json"
    base.write_json(output, report)
    print(format_table(report["buckets"], report["length_unit"]))
    print(f"written to {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
