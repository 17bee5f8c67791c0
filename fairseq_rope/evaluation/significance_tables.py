"""The significance tables of a results page: each row against the baseline, in the runs of
equal training seed, over test sentences (:func:`bootstrap_table`) and over seeds
(:func:`seed_table`); :mod:`fairseq_rope.evaluation.significance` computes both tests.

A run is its ``run.json`` (``seed``, ``sacrebleu``, ``chrf``, ``raw_reference`` and its
checksum); the caller pairs each row's runs with the baseline's of the same seed and says
where a run's detokenized test hypotheses are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from fairseq_rope.base import read_lines
from fairseq_rope.data.prepare.pipeline import sha256_file
from fairseq_rope.evaluation.report import MISSING, NOT_RUN, markdown_table
from fairseq_rope.evaluation.significance import CONFIDENCE, N_SAMPLES, paired_bootstrap, seed_difference

Run = Mapping[str, Any]
#: (a row's run, the baseline's run of the same seed), in seed order.
Pairs = Sequence[Tuple[Run, Run]]
Hypotheses = Callable[[Run], Optional[List[str]]]
#: run.json's scores tested over seeds, and their names in the tables.
SEED_METRICS = (("sacrebleu", "sacreBLEU"), ("chrf", "chrF"))


def p_cell(value: float) -> str:
    return f"{value:.3f}" + (" *" if value < 0.05 else "")


class References:
    """Raw references, read once, checked against the checksum each run recorded: at the path
    the run recorded, or, where that is gone (a record of another checkout or machine), a file
    of the same checksum where another of ``runs`` recorded its reference, or of the same name
    in any scale's data under ``work_dir`` (``shown``: how messages name it). Which runs find
    their reference does not depend on the order they are asked for."""

    def __init__(self, work_dir: Path, shown: str, runs: Iterable[Run] = ()) -> None:
        self._work_dir, self._shown = work_dir, shown
        self._lines: Dict[str, List[str]] = {}
        self._checksums: Dict[Path, str] = {}
        self._recorded: Dict[str, List[Path]] = {}
        for run in runs:  # a path recorded twice costs nothing: its checksum is computed once
            if run.get("raw_reference") and run.get("raw_reference_sha256"):
                self._recorded.setdefault(run["raw_reference_sha256"], []).append(Path(run["raw_reference"]))

    def _checksum(self, path: Path) -> str:
        if path not in self._checksums:
            self._checksums[path] = sha256_file(path)
        return self._checksums[path]

    def get(self, run: Run) -> Tuple[Optional[List[str]], str]:
        path, expected = run.get("raw_reference"), run.get("raw_reference_sha256")
        if not path or not expected:
            return None, "the run recorded no raw reference"
        if expected not in self._lines:
            if Path(path).is_file():
                candidates = [Path(path)]
            else:
                others = [p for p in self._recorded.get(expected, []) if p.is_file()]
                candidates = others + sorted(self._work_dir.glob(f"*/data/raw/{Path(path).name}"))
            found = next((c for c in candidates if self._checksum(c) == expected), None)
            if found is None:
                if Path(path).is_file():
                    return None, f"{path} is not the reference the run was scored against (checksum)"
                return None, (f"reference {path} not found, nor one with its checksum in "
                              f"{self._shown}/*/data/raw: prepare the scale's data")
            self._lines[expected] = read_lines(found)
        return self._lines[expected], ""


def paired_texts(pairs: Pairs, references: References, hypotheses: Hypotheses
                 ) -> Tuple[Optional[Tuple[List[str], List[str], List[str]]], str]:
    """(baseline hypotheses, row hypotheses, references), concatenated over ``pairs``; or (None, why)."""
    base, system, refs = [], [], []
    for run, base_run in pairs:
        if run.get("raw_reference_sha256") != base_run.get("raw_reference_sha256"):
            return None, f"seed {run['seed']}: the runs were scored against different references"
        ref, why = references.get(run)
        hyps = [hypotheses(r) for r in (base_run, run)]
        if ref is None:
            return None, why
        if any(h is None for h in hyps):
            return None, f"seed {run['seed']}: no saved hypotheses"
        if any(len(h) != len(ref) for h in hyps):
            return None, f"seed {run['seed']}: hypotheses and references differ in number"
        base += hyps[0]
        system += hyps[1]
        refs += ref
    return (base, system, refs), ""


def bootstrap_table(rows: Mapping[str, Pairs], baseline: str, references: References,
                    hypotheses: Hypotheses) -> List[str]:
    """sacrebleu's paired bootstrap of every row against ``baseline``.

    Per seed: a row's seed-N run against the baseline's seed-N run. Pooled: the test sets of
    all the seeds both have, concatenated (each system's seed-N hypotheses against the same
    references), so that a difference that holds across training seeds gets one p-value.
    """
    intro = [
        f"sacrebleu's paired bootstrap resampling (`--paired-bs`, {N_SAMPLES} resamples, "
        f"its fixed seed) of each row against `{baseline}`, on detokenized test hypotheses and "
        "raw references; p-values for sacreBLEU and chrF. Per seed: the runs of equal seed. "
        "Pooled: the test sets of all the seeds both rows have, concatenated. It resamples the "
        "test sentences of trained models: the p-values say nothing of how much another "
        "training seed would change (the next table does).",
        "",
    ]
    header = ["row", "seeds", f"sacreBLEU ({baseline} → row)", "p (sacreBLEU)",
              f"chrF ({baseline} → row)", "p (chrF)"]
    lines, notes = [], []
    for name, pairs in rows.items():
        if not pairs:
            lines.append([name, MISSING, NOT_RUN, MISSING, NOT_RUN, MISSING])
            continue
        groups = [([pair], str(pair[0]["seed"])) for pair in pairs]
        if len(pairs) > 1:
            groups.append((pairs, "pooled " + "+".join(str(r["seed"]) for r, _ in pairs)))
        for group, label in groups:
            texts, why = paired_texts(group, references, hypotheses)
            if texts is None:
                lines.append([name, label, f"unavailable ({why})", MISSING, MISSING, MISSING])
                continue
            test = paired_bootstrap(*texts)
            bleu, chrf = test["BLEU"], test["chrF2"]
            lines.append([name, label, f"{bleu['baseline']:.2f} → {bleu['system']:.2f}",
                          p_cell(bleu["p_value"]), f"{chrf['baseline']:.2f} → {chrf['system']:.2f}",
                          p_cell(chrf["p_value"])])
            notes = [f"Signatures: BLEU `{bleu['signature']}`, chrF `{chrf['signature']}`."]
    return intro + markdown_table(header, lines) + ([""] + notes if notes else [])


def seed_table(rows: Mapping[str, Pairs], baseline: str) -> List[str]:
    """Per row and metric: the row's score minus ``baseline``'s in each seed pair, their mean,
    its confidence interval and the paired t-test's p (— and why, with fewer than two pairs)."""
    intro = [
        f"Each row's test score minus `{baseline}`'s in the runs of equal seed (run.json's "
        f"sacreBLEU and chrF), then over those seed pairs: the mean difference, its "
        f"{CONFIDENCE:.0%} confidence interval (t distribution, n − 1 degrees of freedom) and the "
        "two-sided paired t-test's p-value (scipy's `ttest_rel`). Training seeds move a model's "
        "score; a mean difference whose interval includes 0 is within that seed noise. Few seeds "
        "make a weak test: 3 pairs leave 2 degrees of freedom.",
        "",
    ]
    header = ["row", "seed pairs"] + [column for _, metric in SEED_METRICS for column in (
        f"{metric}: row − {baseline}, per seed", f"{metric}: mean [{CONFIDENCE:.0%} CI]", f"p ({metric}, paired t)")]
    lines = []
    for name, pairs in rows.items():
        if not pairs:
            lines.append([name, NOT_RUN] + [MISSING] * (len(header) - 2))
            continue
        line = [name, ", ".join(str(run["seed"]) for run, _ in pairs)]
        for key, _ in SEED_METRICS:
            line += _seed_cells([(run.get(key), base.get(key)) for run, base in pairs])
        lines.append(line)
    return intro + markdown_table(header, lines)


def _seed_cells(scores: Sequence[Tuple[Optional[float], Optional[float]]]) -> List[str]:
    """(per seed, mean [CI], p) of one metric over the seed pairs that measured it."""
    measured = [(s, b) for s, b in scores if s is not None and b is not None]
    per_seed = ", ".join(MISSING if s is None or b is None else f"{s - b:+.2f}" for s, b in scores)
    if not measured:
        return [per_seed, MISSING, MISSING]
    result = seed_difference([b for _, b in measured], [s for s, _ in measured])
    if result.p_value is None:
        return [per_seed, f"{MISSING} ({result.why})", MISSING]
    low, high = result.interval
    return [per_seed, f"{result.mean:+.2f} [{low:+.2f}, {high:+.2f}]", p_cell(result.p_value)]
