"""Runaway hypotheses: where their loops start, what forced decoding says, what decoding limits change.

``scripts/runaway_study.py RUN_DIR... --out docs/results/NAME`` studies
finished runs (``scripts/evaluate.sh`` done: ``eval/generate-test.txt`` and the
averaged checkpoint). For each run:

1. **Counts** (:func:`fairseq_rope.evaluation.scoring.runaways`): hypotheses longer than
   1.5× their reference, and those stopped by the length limit. Both kinds are
   studied below: a subword loop inside one word (``Wahlkampfkampfkampf…``)
   runs to the limit without adding words, so it is no runaway by words.
2. **Where loops start**: :func:`find_loop` finds the first unit of words
   repeated three times in a row, or failing that the first word with a unit
   of characters repeated four times (four, so that ``Schifffahrt`` is no
   loop); the word where it starts is compared with the longest target the
   model saw in training (words of the de-BPE'd training targets) and with
   the sentence's reference length.
3. **Forced decoding**: ``fairseq-generate --score-reference`` scores each
   reference under the same model. Beam search maximises
   Σ log p / |y|^lenpen over hypotheses y with EOS (fairseq's ``finalize_hypos``);
   a reference with a higher value than the runaway was there to be found (a
   *search* error), a lower one means the model itself prefers the loop (a
   *model* error).
4. **Decoding variants**: the same checkpoint decoded again with a
   length limit tied to the source (``--max-len-a 1.2 --max-len-b 10``) and
   with length penalties 0.2 and 1.0, counting runaways and BLEU each time.

Every row keeps one recipe: the variants are measurements, not a fix.

A report accumulates: the studies already in ``NAME.json`` are kept and a run
studied again replaces its study, since checkpoints rarely outlive the session
that trained them. Runs are named as the tables name them (scale, row, seed),
and the report opens with a summary per row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.base import TABLE_DECODING, PathLike, command_line, report_error
from fairseq_rope.evaluation.report import markdown_table
from fairseq_rope.evaluation.decoding import generate
from fairseq_rope.evaluation.scoring import (
    ScoringError,
    Translation,
    check_test_set,
    length_limits,
    read_generate_output,
    runaways,
    subword_lengths,
    tokenized_bleu,
)
from fairseq_rope.experiments.table import ROWS, SCALES

BASELINE = TABLE_DECODING
VARIANTS = {
    "max-len 1.2x+10": {**BASELINE, "max_len_a": 1.2, "max_len_b": 10},
    "lenpen 0.2": {**BASELINE, "lenpen": 0.2},
    "lenpen 1.0": {**BASELINE, "lenpen": 1.0},
}
MAX_PERIOD = 8
MIN_REPEATS = 3
#: Repeats of a unit of characters that make a loop inside a word (three would catch ``Schifffahrt``).
MIN_CHARACTER_REPEATS = 4


def loop_start(tokens: Sequence[str], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS
               ) -> Optional[Tuple[int, int]]:
    """(index where the hypothesis first starts looping, the loop's period), or None if it never loops.

    A loop is a unit of at most ``max_period`` tokens repeated at least
    ``min_repeats`` times in a row, anywhere in the hypothesis (runaways loop,
    drift to another loop, and may stop at the limit or with EOS). Of the
    periods that qualify, the earliest start wins.
    """
    best: Optional[Tuple[int, int]] = None
    for period in range(1, max_period + 1):
        run = 0  # consecutive i with tokens[i] == tokens[i + period]
        for i in range(len(tokens) - period):
            run = run + 1 if tokens[i] == tokens[i + period] else 0
            if run >= (min_repeats - 1) * period:
                start = i - run + 1
                if best is None or start < best[0]:
                    best = (start, period)
                break
    return best


def find_loop(words: Sequence[str]) -> Optional[Tuple[int, int, str]]:
    """(word where the hypothesis starts looping, the loop's period, its unit: "word" or "character"),
    or None. Loops of words come first; only a hypothesis without one is searched for a loop of
    characters inside a word (a subword loop, invisible to a count of words)."""
    loop = loop_start(words)
    if loop is not None:
        return loop[0], loop[1], "word"
    for index, word in enumerate(words):
        inside = loop_start(list(word), min_repeats=MIN_CHARACTER_REPEATS)
        if inside is not None:
            return index, inside[1], "character"
    return None


def beam_objective(log_probs: Sequence[float], lenpen: float) -> float:
    """fairseq's beam-search score of a finished hypothesis: Σ log p (EOS included) / length^lenpen."""
    return sum(log_probs) / len(log_probs) ** lenpen


@dataclass(frozen=True)
class Scored:
    """A sequence's per-token log-probabilities (base 2, as fairseq-generate prints them; EOS last)."""

    id: int
    log_probs: Tuple[float, ...]


def read_positional_scores(path: Path) -> Dict[int, Scored]:
    """The first ``P-`` line of each id in a fairseq-generate output."""
    scored: Dict[int, Scored] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("P-"):
                tag, _, rest = line.rstrip("\n").partition("\t")
                sid = int(tag[2:])
                scored.setdefault(sid, Scored(sid, tuple(float(x) for x in rest.split())))
    return scored


def longest_training_words(data_dir: Path, lang: str) -> int:
    """Longest training sentence of ``lang`` in Moses words (the binarized training text with BPE removed)."""
    bpe = data_dir / "bpe"
    path = bpe / f"train.clean.{lang}" if (bpe / f"train.clean.{lang}").is_file() else bpe / f"train.{lang}"
    with open(path, encoding="utf-8") as f:
        return max(len(line.replace("@@ ", "").split()) for line in f)


def decode_summary(translations: Sequence[Translation], limits: Sequence[int]) -> Dict[str, Any]:
    counts = runaways(translations, limits)
    bleu, _ = tokenized_bleu([t.hypothesis for t in translations], [t.reference or "" for t in translations])
    return {"bleu_tokenized": bleu.score, "longer_than_ratio": counts["longer_than_ratio"],
            "at_length_limit": counts["at_length_limit"], "ids": counts["longer_than_ratio_ids"],
            "at_length_limit_ids": counts["at_length_limit_ids"] or []}


def study_run(run_dir: Path, variants: Dict[str, Dict[str, Any]] = VARIANTS) -> Dict[str, Any]:
    """Everything the module docstring lists, for one evaluated run."""
    eval_dir = run_dir / "eval"
    results = json.loads((eval_dir / "results.json").read_text(encoding="utf-8"))
    data_bin = Path(results["data"])
    checkpoint = Path(results["checkpoint"])
    src, tgt = check_test_set(data_bin, "test")
    sources = subword_lengths(data_bin, "test", src, tgt, src)
    longest = longest_training_words(data_bin.parent, tgt)
    baseline = read_generate_output(eval_dir / "generate-test.txt")
    hyp_scores = read_positional_scores(eval_dir / "generate-test.txt")
    summary = decode_summary(baseline, length_limits(sources, BASELINE["max_len_a"], BASELINE["max_len_b"]))

    with tempfile.TemporaryDirectory(prefix="runaways.") as tmp:
        forced_path = Path(tmp) / "forced.txt"
        generate(checkpoint, data_bin, forced_path, "test", BASELINE, score_reference=True)
        ref_scores = read_positional_scores(forced_path)
        decoded = {}
        for name, settings in variants.items():
            out = Path(tmp) / f"{name}.txt"
            generate(checkpoint, data_bin, out, "test", settings)
            decoded[name] = {**settings, **decode_summary(
                read_generate_output(out), length_limits(sources, settings["max_len_a"], settings["max_len_b"]))}

    cases, preferred = analyse(baseline, summary["ids"], hyp_scores, ref_scores, BASELINE["lenpen"],
                               summary["at_length_limit_ids"])
    return {**identify(run_dir), "bleu_tokenized": summary["bleu_tokenized"],
            "longer_than_ratio": summary["longer_than_ratio"], "at_length_limit": summary["at_length_limit"],
            # Without P- lines the limit cannot be told, and only runaways by words are studied.
            "cases_include_length_limit": summary["at_length_limit"] is not None,
            "longest_training_target_words": longest,
            "longest_training_source_words": longest_training_words(data_bin.parent, src), "cases": cases,
            "references_preferred_overall": preferred, "sentences": len(baseline),
            "variants": decoded}


def analyse(translations: Sequence[Translation], runaway_ids: Sequence[int], hyp_scores: Dict[int, Scored],
            ref_scores: Dict[int, Scored], lenpen: float, at_limit_ids: Sequence[int] = ()
            ) -> Tuple[List[Dict[str, Any]], int]:
    """Each runaway's and each hypothesis at the length limit's loop and search-or-model verdict;
    and over all sentences, how many references beam search's objective ranks above the
    hypothesis it returned."""
    by_id = {t.id: t for t in translations}
    cases = []
    for sid in sorted(set(runaway_ids) | set(at_limit_ids)):
        t = by_id[sid]
        words = t.hypothesis.split()
        loop = find_loop(words)
        hyp_obj = beam_objective(hyp_scores[sid].log_probs, lenpen)
        ref_obj = beam_objective(ref_scores[sid].log_probs, lenpen)
        cases.append({
            "id": sid, "longer_than_ratio": sid in runaway_ids, "at_length_limit": sid in at_limit_ids,
            "source_words": len((t.source or "").replace("@@ ", "").split()),
            "hypothesis_words": len(words), "reference_words": len((t.reference or "").split()),
            "hypothesis_subwords": t.subwords, "loop_start_word": None if loop is None else loop[0],
            "loop_period": None if loop is None else loop[1], "loop_unit": None if loop is None else loop[2],
            "hypothesis_objective": hyp_obj, "reference_objective": ref_obj,
            "error": "search" if ref_obj > hyp_obj else "model",
        })
    preferred = sum(beam_objective(ref_scores[i].log_probs, lenpen) > beam_objective(hyp_scores[i].log_probs, lenpen)
                    for i in by_id)
    return cases, preferred


def identify(run_dir: PathLike) -> Dict[str, Any]:
    """The run as the tables name it: scale, row and seed from the harness's layout
    ``WORK_DIR/SCALE/ROW/seedN``, or only its path for a run made elsewhere."""
    path = Path(run_dir)
    scale, row, seed = path.parent.parent.name, path.parent.name, path.name
    if seed.startswith("seed") and seed[4:].isdigit() and row in ROWS and scale in SCALES:
        return {"run_dir": str(path), "run": f"{scale} {row} seed {int(seed[4:])}",
                "scale": scale, "row": row, "seed": int(seed[4:])}
    return {"run_dir": str(path), "run": str(path)}


def merge(kept: Sequence[Dict[str, Any]], new: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Earlier studies with this invocation's added (a run studied again replaces its old study),
    in table order: scale, row as in the table, seed."""
    by_run = {s["run"]: s for s in kept}
    by_run.update({s["run"]: s for s in new})
    order = list(ROWS)
    return sorted(by_run.values(), key=lambda s: (
        s.get("scale", ""), order.index(s["row"]) if s.get("row") in ROWS else len(order),
        s.get("seed", 0), s["run"]))


def load_studies(path: Path) -> List[Dict[str, Any]]:
    """The studies of an earlier report (``NAME.json``), each with the command that made it.

    Reports written before studies named their run and command get both here
    (their top-level command; the run from its directory's layout).
    """
    if not path.is_file():
        return []
    report = json.loads(path.read_text(encoding="utf-8"))
    return [{**identify(study["run_dir"]), "command": report.get("command"), **study}
            for study in report["runs"]]


def _count(cases: Sequence[Dict[str, Any]], test: Callable[[Dict[str, Any]], bool]) -> str:
    return str(sum(map(test, cases)))


def _longer_than(key: str, limit_key: str) -> Callable[[Dict[str, Any], Dict[str, Any]], Optional[bool]]:
    """Whether a case's ``key`` exceeds its run's ``limit_key``: None where either was not
    recorded (studies made before it was), False where the case has none (no loop)."""
    def test(study: Dict[str, Any], case: Dict[str, Any]) -> Optional[bool]:
        if key not in case or study.get(limit_key) is None:
            return None
        return case[key] is not None and case[key] > study[limit_key]
    return test


BEYOND_TRAINING = {
    "source longer than any training source": _longer_than("source_words", "longest_training_source_words"),
    "loop starts beyond the longest training target": _longer_than(
        "loop_start_word", "longest_training_target_words"),
    "hypothesis longer than any training target": _longer_than(
        "hypothesis_words", "longest_training_target_words"),
}


def only_at_limit(case: Dict[str, Any]) -> bool:
    """A studied hypothesis stopped by the length limit that is no runaway by words (studies made
    before these were studied hold runaways only)."""
    return not case.get("longer_than_ratio", True)


def _at_limit_only_studied(runs: Sequence[Dict[str, Any]]) -> str:
    """How many hypotheses at the limit only were studied; where some of the runs' studies could
    not include them (made before they were studied), also how many runs' studies could."""
    count = str(sum(only_at_limit(c) for s in runs for c in s["cases"]))
    covered = sum(bool(s.get("cases_include_length_limit")) for s in runs)
    return count if covered == len(runs) else f"{count} ({covered} of {len(runs)} runs studied)"


def row_summary(studies: Sequence[Dict[str, Any]]) -> List[List[str]]:
    """Per scale and row, over its studied runs: runaways, hypotheses at the length limit, how many
    of the studied ones loop, model and search errors, and how many lie beyond the training lengths
    ("—" where a study predates that measurement)."""
    def group(study: Dict[str, Any]) -> Tuple[str, str]:
        return study.get("scale", "—"), study.get("row", study["run"])

    table = []
    for scale, row in dict.fromkeys(map(group, studies)):
        runs = [s for s in studies if group(s) == (scale, row)]
        cases = [(s, c) for s in runs for c in s["cases"]]
        beyond = []
        for test in BEYOND_TRAINING.values():
            verdicts = [test(s, c) for s, c in cases]
            beyond.append("—" if None in verdicts else str(sum(verdicts)))
        table.append([scale, row, str(len(runs)), str(sum(s["longer_than_ratio"] for s in runs)),
                      str(sum(s["at_length_limit"] or 0 for s in runs)), _at_limit_only_studied(runs),
                      _count([c for _, c in cases], lambda c: c["loop_start_word"] is not None),
                      _count([c for _, c in cases], lambda c: c["error"] == "model"),
                      _count([c for _, c in cases], lambda c: c["error"] == "search"), *beyond,
                      f"{sum(s['references_preferred_overall'] for s in runs)}/{sum(s['sentences'] for s in runs)}"])
    return table


def _kind(case: Dict[str, Any]) -> str:
    if only_at_limit(case):
        return "at the limit only"
    return "runaway at the limit" if case.get("at_length_limit") else "runaway"


def _loop(case: Dict[str, Any]) -> str:
    if case["loop_start_word"] is None:
        return "—"
    if case.get("loop_unit") == "character":
        return f"{case['loop_start_word']} (inside the word, period {case['loop_period']} characters)"
    return f"{case['loop_start_word']} (period {case['loop_period']})"


def render(studies: Sequence[Dict[str, Any]], out: Path) -> str:
    """The report: per row, per run, per studied hypothesis; and the commands that studied the runs."""
    text = [
        "# Runaway hypotheses",
        "",
        f"Written by `scripts/runaway_study.py RUN_DIR... --out {out}` on "
        f"{datetime.date.today().isoformat()} from the studies in `{out.name}.json`: each invocation "
        "adds the runs it is given (or replaces their earlier study) and keeps the others, whose run "
        "directories may be gone (commands at the end). `fairseq_rope/experiments/runaways.py` explains "
        "each measurement.",
        "",
        "## Per row",
        "",
        "Over the studied runs of each scale and row: runaways (hypotheses longer than 1.5× their reference), how "
        "many stopped at the length limit, and how many of those at the limit that are no runaways by words "
        "(loops inside a word) were studied too (studies made before 2026-11-24 hold runaways only). Of "
        "all studied hypotheses: how many contain a loop, model or search errors under forced "
        "decoding, how many lie beyond the training lengths (Moses words; per run, its own training "
        "data); and how often, over all test sentences, the reference outscores the beam's hypothesis.",
        "",
    ]
    text += markdown_table(["scale", "row", "runs", "runaways", "at length limit", "at the limit only: studied",
                            "with a loop", "model errors",
                            "search errors", *BEYOND_TRAINING, "reference preferred (all sentences)"],
                           row_summary(studies))
    text += ["", "## Counts and decoding variants", "",
             "Per run: test hypotheses longer than 1.5× their reference / stopped by the length limit, and "
             "tokenized BLEU, with the tables' decoding (beam 4, lenpen 0.6, max-len-b 200) and variants of it.",
             ""]
    names = list(studies[0]["variants"]) if studies else []
    header = ["run", "longest training source / target (words)", "beam 4, lenpen 0.6 (tables)"] + names
    rows = [[s["run"], f"{s.get('longest_training_source_words', '—')} / {s['longest_training_target_words']}",
             f"{s['longer_than_ratio']}/{s['at_length_limit']}, BLEU {s['bleu_tokenized']:.2f}"]
            + [f"{v['longer_than_ratio']}/{v['at_length_limit']}, BLEU {v['bleu_tokenized']:.2f}"
               for v in s["variants"].values()] for s in studies]
    text += markdown_table(header, rows) + ["", "## Each studied hypothesis", "",
            "Kind: a runaway by words, one that also stopped at the length limit, or one at the limit only. "
            "Loop start: first word of the first unit (≤ 8 words) repeated 3 times in a row (period in words), "
            "or else the word inside which a unit of ≤ 8 characters repeats 4 times (period in characters). "
            "Objective: fairseq's beam score Σ log₂ p / length^0.6 of the hypothesis and of the reference "
            "under forced decoding; `search` = the reference scores higher, so beam search missed it; "
            "`model` = the model prefers its hypothesis. Source words: Moses tokens of the source (— in studies "
            "made before they were recorded).", ""]
    rows = [[s["run"], str(c["id"]), _kind(c), str(c.get("source_words", "—")), str(c["reference_words"]),
             str(c["hypothesis_words"]), _loop(c),
             str(s["longest_training_target_words"]), f"{c['hypothesis_objective']:.3f}",
             f"{c['reference_objective']:.3f}", c["error"]]
            for s in studies for c in s["cases"]]
    text += markdown_table(["run", "id", "kind", "source words", "reference words", "hypothesis words",
                            "loop starts at word", "longest training target", "objective: hypothesis",
                            "objective: reference", "error"], rows) if rows else [
        "No runaways and no hypotheses at the length limit."]
    text += ["", "## Commands", ""]
    for command in dict.fromkeys(s["command"] for s in studies):
        runs = [s for s in studies if s["command"] == command]
        text += [f"- `{command}`: " + ", ".join(f"{s['run']} (`{s['run_dir']}`)" for s in runs)]
    return "\n".join(text + [""])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/runaway_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path,
                        help="evaluated run directories (SAVE_DIR); none: only rewrite NAME.md from NAME.json")
    parser.add_argument("--out", type=Path, required=True,
                        help="output path without suffix (.json, .md); the runs of an existing NAME.json "
                             "that are not given again are kept")
    args = parser.parse_args(argv)
    command = command_line("scripts/runaway_study.py", argv)
    report = args.out.with_suffix(".json")
    if not args.runs and not report.is_file():
        parser.error(f"no run directories given and no earlier report {report} to rewrite")
    try:
        studies = merge(load_studies(report), [{**study_run(run), "command": command} for run in args.runs])
    except (ScoringError, OSError, KeyError) as e:
        return report_error(e)
    base.write_json(report, {"runs": studies})
    text = render(studies, args.out)
    base.write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
