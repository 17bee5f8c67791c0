"""``reproduce_table.sh collect``: the finished runs of a scale → a markdown table and plots.

Reads every ``<work>/<scale>/<row>/seed<N>/eval/run.json`` (written by
:mod:`fairseq_rope.experiments.reproduce`) and the run's ``command.txt``, and writes, each
file atomically, into ``docs/results/``:

* ``<scale>.md``: one line per row (mean ± sample std over seeds, and every
  seed's value) of BLEU in both conventions, parameters, training tokens/s and
  wall time, beside the paper's numbers; rows without a finished run say
  "not run". Then a line per run, the length-extrapolation table (``demo-length``;
  ``multi30k-length`` also against the same rows trained on all lengths, and the
  RoPE scaling study of its rope runs where ``scripts/rope_scaling_study.py`` has
  written one) and the commands that produced the runs;
* ``<scale>_valid_loss.png``: validation loss against updates, every run;
* ``<scale>_bleu.png``: BLEU per row, error bars over seeds;
* ``<scale>_bleu_by_length.png`` (``demo-length``): BLEU per source-length bucket;
* at a scale trained to convergence (``multi30k-converged``), the same tables
  again at the equal budget (the same runs' average of their last 5 checkpoints
  up to the budget), a convergence table (updates at convergence, updates to
  95 % and 99 % of sinusoidal's converged valid BLEU) and
  ``<scale>_valid_bleu.png``: valid BLEU against updates, mean and range over
  seeds per row.
"""

from __future__ import annotations

import datetime
import json
import shlex
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.experiments.config import ConfigError, load_experiment
from fairseq_rope.data.prepare.pipeline import sha256_file
from fairseq_rope.base import portable, read_lines
from fairseq_rope.evaluation.report import finish, markdown_table, new_axes, pyplot
from fairseq_rope.evaluation.scoring import RUNAWAY_RATIO
from fairseq_rope.evaluation.significance import N_SAMPLES, paired_bootstrap
from fairseq_rope.experiments import scaling_study
from fairseq_rope.experiments.convergence import updates_to_reach
from fairseq_rope.experiments.table import (
    RECORDS,
    REPO,
    ROWS,
    SCALES,
    Row,
    Scale,
    at_equal_budget,
    config_name,
    finished_runs,
    full_length_scale,
    record_hypotheses,
    recorded_runs,
    same_models,
    scale_dir,
)

Runs = Dict[str, List[Dict[str, Any]]]  # row name -> its runs' run.json, in seed order
NOT_RUN = "not run"
MISSING = "—"
BASELINE = "sinusoidal"
BLEU_NOTE = (
    "BLEU of the average of the last 5 checkpoints, beam 4, length penalty 0.6: tokenized "
    "BLEU with compound splitting (the paper's convention), sacreBLEU and chrF (sacrebleu's "
    "defaults) on detokenized output. Runaways: per seed, hypotheses longer than "
    f"{RUNAWAY_RATIO}× their reference (tokenized words) / hypotheses stopped by the decoder's "
    "length limit (fairseq's max-len-b 200 subwords) instead of EOS. "
    "Each cell: mean ± sample standard deviation over seeds, then every seed's value in seed "
    "order in brackets (one value when there is one seed, or all seeds agree; — for a run "
    "that did not measure it, the mean then being over the others). Parameters: "
    "elements of the averaged checkpoint's model state, tied embeddings once, buffers excluded. "
    "Train tokens/s: mean over epochs of fairseq's wps (target tokens per second), an epoch cut short "
    "by the end of training to under half the updates of the longest left out (records without "
    "train_tokens_per_second_epochs, made before 2026-11-26, took every epoch); each run's "
    "threads, CPU and commit are under Runs. Wall time: fairseq's training time up to the newest "
    "averaged checkpoint, which it saves in each checkpoint and carries across resumes (validation "
    "included; runs recorded before 2026-11-25: the sum of fairseq-train's 'done training in' over the "
    "run's invocations; each record's train_wall_source says which). Updates: those trained, or for a "
    "run trained to convergence the update where its rule stopped it."
)


# --- Numbers and cells


def mean_std(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """Mean and sample standard deviation (None for fewer than two values)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def cell(values: Sequence[Optional[float]], fmt: Callable[[float], str]) -> str:
    """``mean ± std [v1, v2, ...]`` over the values that are not None, every value in its seed's place
    (``—`` for a run that did not measure it, so a mean over fewer seeds shows as one); ``—`` when
    none was measured, the value alone when every run measured the same."""
    present = [v for v in values if v is not None]
    if not present:
        return MISSING
    if len(present) == len(values) and len(set(present)) == 1:
        return fmt(present[0])
    listed = ", ".join(MISSING if v is None else fmt(v) for v in values)
    if len(present) == 1:
        return f"{fmt(present[0])} [{listed}]"
    mean, std = mean_std(present)
    return f"{fmt(mean)} ± {fmt(std)} [{listed}]"


def _bleu(value: float) -> str:
    return f"{value:.2f}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def wall_time_unit(runs: Runs) -> Tuple[str, float]:
    """(unit, seconds per unit) that suits the longest run: s, min or h."""
    longest = max((r.get("train_wall_seconds") or 0 for rs in runs.values() for r in rs), default=0)
    if longest < 300:
        return "s", 1.0
    return ("min", 60.0) if longest < 3 * 3600 else ("h", 3600.0)


def values(runs: Sequence[Dict[str, Any]], key: str, scale: float = 1.0) -> List[Optional[float]]:
    return [None if r.get(key) is None else r[key] / scale for r in runs]


# --- Markdown


def model_cell(row: Row, scale: Scale, runs: Sequence[Dict[str, Any]]) -> str:
    """The row's title and architecture (from its runs, else from its config)."""
    archs = sorted({r["arch"] for r in runs if r.get("arch")})
    if not archs:
        try:
            archs = [str(load_experiment(config_name(row, scale)).train.get("arch"))]
        except ConfigError:
            archs = ["?"]
    return f"{row.title}: " + ", ".join(f"`{a}`" for a in archs)


#: A run whose fastest epoch was more than this many times its slowest (fairseq's wps) did not
#: train at one speed: another job shared the CPU, or it resumed on other hardware.
UNEVEN_SPEED = 1.5
UNEVEN_MARK = " ‡"
UNEVEN_NOTE = (
    f"‡: a run of this row trained at uneven speed (its fastest epoch more than {UNEVEN_SPEED:g}× its "
    "slowest: the CPU was shared part of the time, or it resumed on other hardware), so its tokens/s "
    "and wall time say how it was run, not what the model costs; docs/benchmarks compares speeds."
)


def uneven_speed(run: Mapping[str, Any]) -> bool:
    """Whether the run's epochs trained at speeds more than UNEVEN_SPEED apart."""
    slowest, fastest = run.get("train_tokens_per_second_range") or (None, None)
    return bool(slowest) and fastest / slowest > UNEVEN_SPEED


def main_table(scale: Scale, runs: Runs) -> List[str]:
    """The headline table, and the note on uneven speeds when a row has one (``‡``)."""
    unit, seconds = wall_time_unit(runs)
    paper = "paper BLEU (WMT14 newstest2014)" + ("" if scale.paper_comparable else ", not comparable")
    header = ["row", "model", "seeds", "BLEU (tokenized, compound-split)", "sacreBLEU", "chrF", paper,
              f"runaways (> {RUNAWAY_RATIO}× ref / at length limit)", "parameters", "train tokens/s",
              f"train wall time ({unit})", "updates"]
    lines = []
    for name, row in ROWS.items():
        rs = runs[name]
        if not rs:
            lines.append([name, model_cell(row, scale, rs), NOT_RUN, NOT_RUN, NOT_RUN, NOT_RUN, row.paper,
                          MISSING, MISSING, MISSING, MISSING, MISSING])
            continue
        mark = UNEVEN_MARK if any(uneven_speed(r) for r in rs) else ""
        lines.append([
            name, model_cell(row, scale, rs), seeds_cell(rs),
            cell(values(rs, "bleu_tokenized"), _bleu), cell(values(rs, "sacrebleu"), _bleu),
            cell(values(rs, "chrf"), _bleu), row.paper, runaway_cell(rs),
            cell(values(rs, "parameters"), _count), cell(values(rs, "train_tokens_per_second"), _count) + mark,
            cell(values(rs, "train_wall_seconds", seconds), lambda v: f"{v:.1f}") + mark,
            cell([r.get("updates_at_convergence", r.get("num_updates")) for r in rs], _count),
        ])
    uneven = any(UNEVEN_MARK in line[9] for line in lines)
    return markdown_table(header, lines) + (["", UNEVEN_NOTE] if uneven else [])


def seeds_cell(runs: Sequence[Dict[str, Any]]) -> str:
    """The seeds, and the device of each when a row's runs trained on more than one (CPU and GPU
    runs are not pooled silently: every mean of the row then says so)."""
    seeds = ", ".join(str(r["seed"]) for r in runs)
    devices = [r.get("train_device") or "unrecorded" for r in runs]
    if len(set(devices)) < 2:
        return seeds
    return f"{seeds} (devices differ, each cell pools them: {', '.join(devices)})"


def runaway_counts(run: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    """(hypotheses longer than RUNAWAY_RATIO x their reference, hypotheses stopped by the length limit)."""
    counts = run.get("runaways") or {}
    return counts.get("longer_than_ratio"), counts.get("at_length_limit")


def runaway_cell(runs: Sequence[Dict[str, Any]]) -> str:
    """Each seed's counts, ``long/limit``, in seed order (``—`` where not measured)."""
    pairs = [runaway_counts(r) for r in runs]
    if all(p == (None, None) for p in pairs):
        return MISSING
    return ", ".join("/".join(MISSING if n is None else str(n) for n in p) for p in pairs)


# --- Significance


def significance_table(runs: Runs, work_dir: Path) -> List[str]:
    """sacrebleu's paired bootstrap of every row against the sinusoidal baseline.

    Per seed: a row's seed-N run against the baseline's seed-N run. Pooled: the
    test sets of all the seeds both have, concatenated (each system's seed-N
    hypotheses against the same references), so that a difference that holds
    across training seeds gets one p-value.
    """
    intro = [
        f"sacrebleu's paired bootstrap resampling (`--paired-bs`, {N_SAMPLES} resamples, "
        f"its fixed seed) of each row against `{BASELINE}`, on detokenized test hypotheses and "
        "raw references; p-values for sacreBLEU and chrF. Per seed: the runs of equal seed. "
        "Pooled: the test sets of all the seeds both rows have, concatenated.",
        "",
    ]
    baseline = {r["seed"]: r for r in runs[BASELINE]}
    header = ["row", "seeds", f"sacreBLEU ({BASELINE} → row)", "p (sacreBLEU)",
              f"chrF ({BASELINE} → row)", "p (chrF)"]
    lines, notes = [], []
    references = _References(work_dir)
    for name in ROWS:
        if name == BASELINE:
            continue
        pairs = [(r, baseline[r["seed"]]) for r in runs[name] if r["seed"] in baseline]
        if not pairs:
            lines.append([name, MISSING, NOT_RUN, MISSING, NOT_RUN, MISSING])
            continue
        groups = [([pair], str(pair[0]["seed"])) for pair in pairs]
        if len(pairs) > 1:
            groups.append((pairs, "pooled " + "+".join(str(r["seed"]) for r, _ in pairs)))
        for group, label in groups:
            texts, why = _paired_texts(group, references)
            if texts is None:
                lines.append([name, label, f"unavailable ({why})", MISSING, MISSING, MISSING])
                continue
            test = paired_bootstrap(*texts)
            bleu, chrf = test["BLEU"], test["chrF2"]
            lines.append([name, label, f"{bleu['baseline']:.2f} → {bleu['system']:.2f}",
                          _p(bleu["p_value"]), f"{chrf['baseline']:.2f} → {chrf['system']:.2f}",
                          _p(chrf["p_value"])])
            notes = [f"Signatures: BLEU `{bleu['signature']}`, chrF `{chrf['signature']}`."]
    if not runs[BASELINE]:
        return intro + [f"No finished `{BASELINE}` run to compare against."]
    return intro + markdown_table(header, lines) + ([""] + notes if notes else [])


def _p(value: float) -> str:
    return f"{value:.3f}" + (" *" if value < 0.05 else "")


class _References:
    """Raw references, read once, checked against the checksum each run recorded: at the path
    the run recorded, or, where that is gone (a record of another checkout or machine), a file
    of the same name and checksum in any scale's data under ``work_dir``."""

    def __init__(self, work_dir: Path) -> None:
        self._work_dir = work_dir
        self._lines: Dict[str, List[str]] = {}
        self._checksums: Dict[Path, str] = {}

    def _checksum(self, path: Path) -> str:
        if path not in self._checksums:
            self._checksums[path] = sha256_file(path)
        return self._checksums[path]

    def get(self, run: Dict[str, Any]) -> Tuple[Optional[List[str]], str]:
        path, expected = run.get("raw_reference"), run.get("raw_reference_sha256")
        if not path or not expected:
            return None, "the run recorded no raw reference"
        if expected not in self._lines:
            candidates = [Path(path)] if Path(path).is_file() else sorted(
                self._work_dir.glob(f"*/data/raw/{Path(path).name}"))
            found = next((c for c in candidates if self._checksum(c) == expected), None)
            if found is None:
                if Path(path).is_file():
                    return None, f"{path} is not the reference the run was scored against (checksum)"
                return None, (f"reference {path} not found, nor one with its checksum in "
                              f"{_shown_path(self._work_dir)}/*/data/raw: prepare the scale's data")
            self._lines[expected] = read_lines(found)
        return self._lines[expected], ""


def _paired_texts(pairs: Sequence[Tuple[Dict[str, Any], Dict[str, Any]]], references: _References
                  ) -> Tuple[Optional[Tuple[List[str], List[str], List[str]]], str]:
    """(baseline hypotheses, row hypotheses, references), concatenated over ``pairs``; or (None, why)."""
    base, system, refs = [], [], []
    for run, base_run in pairs:
        if run.get("raw_reference_sha256") != base_run.get("raw_reference_sha256"):
            return None, f"seed {run['seed']}: the runs were scored against different references"
        ref, why = references.get(run)
        hyps = [record_hypotheses(r) for r in (base_run, run)]
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


def runs_table(runs: Runs) -> List[str]:
    """One line per run: its seed, BLEU and anything that made it differ from the config."""
    header = ["row", "seed", "BLEU (tok.)", "sacreBLEU", "updates", "trained with",
              "extra fairseq-train args", "run directory"]
    lines = [
        [name, str(r["seed"]), _optional(r.get("bleu_tokenized")), _optional(r.get("sacrebleu")),
         str(r.get("num_updates")), _trained_with(r),
         " ".join(r.get("extra_train_args") or []) or "none",
         f"`{_shown_path(r['run_dir'])}`"]
        for name, rs in runs.items() for r in rs
    ]
    return markdown_table(header, lines) if lines else ["No finished runs."]


def _trained_with(run: Dict[str, Any]) -> str:
    """Device, threads, CPU and plugin commit of the training (run.json has them from 2026-11-24
    on; per invocation, from the log, from 2026-11-25 on)."""
    device = f"on {run['train_device']}" if run.get("train_device") else ""
    if run.get("train_threads") is None:
        return f"{device}; threads, CPU and commit not recorded" if device else "not recorded"
    commits = str(run.get("code_commit") or "").split(" + ")
    code = ("commit unknown" if not commits[0] else
            " + ".join(f"`{c[:10]}`{c[40:]}" for c in commits))
    invocations, recorded = run.get("train_invocations"), run.get("train_invocations_recorded")
    partial = (f" (recorded by {recorded} of its {invocations} invocations)"
               if invocations is not None and recorded is not None and recorded < invocations else "")
    return (f"{device}{', ' if device else ''}{run['train_threads']} threads, "
            f"{run.get('train_cpu') or 'CPU unknown'}, {code}{partial}")


def _optional(value: Optional[float]) -> str:
    return MISSING if value is None else _bleu(value)


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
                          if runs[name] else [NOT_RUN] * len(buckets)) for name in ROWS]

    longest = _longest_training_pairs(runs)
    note = [f"Longest training pair in BPE tokens (with EOS): {longest}; the learned row's "
            "positions beyond it are untrained."] if longest else []
    ratios = ["", "Hypothesis length over reference length in the same tokens, per bucket (below 1: "
              "the outputs stop short, above 1: they run on; — for runs recorded before it was "
              "measured):", ""] + markdown_table(header, per_row("length_ratio", _ratio))
    return intro + markdown_table(header, per_row("bleu", _bleu)) + ratios + ([""] + note if note else [])


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
        for name in ROWS:
            if not runs[name] or not full_runs[name]:
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


def commands(runs: Runs) -> List[str]:
    """Each run's reproduce command and the fairseq-train command it ran (command.txt)."""
    if not any(runs.values()):
        return ["No finished runs."]
    lines = ["```bash"]
    for name, rs in runs.items():
        for r in rs:
            command_txt = Path(r["run_dir"]) / "command.txt"
            ran = (ran_portably(command_txt.read_text(encoding="utf-8")) if command_txt.is_file()
                   else f"# ({_shown_path(command_txt)} is missing)")
            lines += [f"# {name}, seed {r['seed']}", r.get("reproduce_command", ""),
                      "# ran (command.txt):", ran, ""]
    return lines[:-1] + ["```"]


def ran_portably(command_txt: str) -> str:
    """command.txt (``cd DIR`` then fairseq-train) with DIR's paths relative to DIR: the
    command as run from the checkout's root, wherever that checkout was."""
    cd, _, command = command_txt.strip().partition("\n")
    root = shlex.split(cd)[1] if cd.startswith("cd ") else None
    return command_txt.strip() if root is None else "# from the checkout's root:\n" + portable(command, root)


def _shown_path(path: Any) -> str:
    """A path relative to the repository (the table is committed) or else to the working
    directory (a worktree of it) when inside one, else absolute."""
    path = Path(path).resolve()
    for root in (REPO, Path.cwd().resolve()):
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)


def render_markdown(scale: Scale, runs: Runs, work_dir: Path, plots: Dict[str, Path],
                    records: Path, scaling: Optional[Path] = None) -> str:
    """The table of a scale from its runs (``records``: ``RESULTS/runs/<scale>``) and, for a
    length study, its RoPE scaling study (``scaling``: the study's JSON report), if made."""
    n = sum(len(rs) for rs in runs.values())
    now = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    runs_from = _shown_path(scale_dir(work_dir, scale))
    if Path(runs_from).is_absolute():  # another checkout's runs: a committed table names no machine's paths
        runs_from = f"WORK_DIR/{scale.name}` of `collect --work-dir WORK_DIR"
    out = [
        f"# The RoFormer table, scale `{scale.name}`",
        "",
        f"Scale: {scale.title}. Written by `scripts/reproduce_table.sh collect --scale {scale.name}` "
        f"from {n} finished run(s) recorded in `{_shown_path(records)}` ({now}; the runs of "
        f"`{runs_from}` are recorded there first); "
        "rerun it rather than editing this file.",
        "",
    ]
    if not scale.paper_comparable:
        out += ["**The paper's numbers are BLEU on WMT14 En→De newstest2014 with Transformer-base; "
                "they are not comparable with this scale** (other data, tiny models) and are shown "
                "only to name the row each one stands for.", ""]
    out += main_table(scale, runs) + ["", BLEU_NOTE, ""]
    out += [f"![validation loss]({plots['valid_loss'].name}) ![BLEU]({plots['bleu'].name})", ""]
    for study in SCALES.values():  # the length study of the same models, if any
        if same_models(study, scale) and study.is_length_study and study is not scale:
            out += [f"Length extrapolation with these models: [{study.name}.md]({study.name}.md).", ""]
    if scale.data != "demo":
        out += ["## Significance", ""] + significance_table(runs, work_dir) + [""]
    if scale.equal_budget is not None:
        at_budget = budget_runs(runs)
        out += ["## Convergence", ""] + convergence_table(runs) + ["", f"![valid BLEU]({plots['valid_bleu'].name})", ""]
        out += [f"## The same runs at the equal budget ({scale.equal_budget} updates)", "",
                f"Each run's average of its last 5 checkpoints up to update {scale.equal_budget}, "
                "decoded and scored as above: the budget of the fixed-budget table, from the "
                "trajectories that go on to convergence. Tokens/s and wall time: their training up to "
                "that update (— for runs recorded before these were).", ""]
        out += main_table(scale, at_budget) + ["", "### Significance at the equal budget", ""]
        out += significance_table(at_budget, work_dir) + [""]
    if scale.bucket_edges:
        title = "Length extrapolation" if scale.is_length_study else "BLEU by source length"
        out += [f"## {title}", ""] + length_table(scale, runs)
        out += ["", f"![BLEU by length]({plots['bleu_by_length'].name})", ""]
        full = full_length_scale(scale)
        if full is not None:
            out += ["## Against the same rows trained on all lengths", ""]
            out += length_against_full_data(scale, runs, full, recorded_runs(records.parent, full)) + [""]
    if scaling is not None:
        out += ["## RoPE scaling at decoding time", ""] + scaling_section(scaling) + [""]
    out += ["## Runs", ""] + runs_table(runs) + ["", "## Commands", ""] + commands(runs)
    return "\n".join(out) + "\n"


def scaling_section(path: Path) -> List[str]:
    """The RoPE scaling study of this length study's rope runs (``scripts/rope_scaling_study.py``),
    as its report says; written by that script, not by ``collect``, which only shows it."""
    report = json.loads(path.read_text(encoding="utf-8"))
    return ([f"The rope runs of this study decoded again with each `--rope-scaling` (their checkpoints "
             f"unchanged, the scaling given by `--model-overrides`), written by `{report['command']}` "
             f"into [{path.with_suffix('.md').name}]({path.with_suffix('.md').name}); rows without "
             "scaling are other rows' own decodings. Means over the studied runs; † past the "
             "training length.", ""]
            + scaling_study.tables(report, "###"))


# --- Convergence


#: Fractions of the baseline's converged valid BLEU whose first crossing measures convergence speed.
SPEED_FRACTIONS = (0.95, 0.99)


def valid_curve(run: Dict[str, Any]) -> Dict[int, float]:
    """A run's valid BLEU by update (``--eval-bleu``, single checkpoints)."""
    return {int(u): float(b) for u, b in run.get("valid_bleu") or []}


def baseline_converged_bleu(runs: Runs) -> Optional[float]:
    """The baseline's converged valid BLEU: the mean over its seeds of the best valid BLEU their rule saw."""
    best = [r["convergence"]["best_bleu"] for r in runs[BASELINE] if r.get("convergence")]
    return statistics.fmean(best) if best else None


def convergence_table(runs: Runs) -> List[str]:
    """Per row: the best single-checkpoint valid BLEU and where, the update where the rule stopped,
    and the updates each run took to first reach 95 % and 99 % of the baseline's converged valid BLEU."""
    target = baseline_converged_bleu(runs)
    intro = ["Valid BLEU: fairseq's `--eval-bleu` on `valid` (single checkpoints, beam 4, length "
             "penalty 0.6, sacreBLEU 13a on Moses-detokenized output), every validation of the run. "
             "Converged at: the update where the rule stops the run (the test scores above average "
             "the last 5 checkpoints up to it); best at: the update of its best valid BLEU. "
             + (f"Updates to X %: the first validation at or above X % of `{BASELINE}`'s converged "
                f"valid BLEU (the mean of its seeds' best, {target:.2f}); — : never reached."
                if target is not None else f"Updates to X %: no converged `{BASELINE}` run yet."), ""]
    header = ["row", "seeds", "best valid BLEU", "best at (updates)", "converged at (updates)",
              "stopped by"] + [f"updates to {f:.0%}" for f in SPEED_FRACTIONS]
    lines = []
    for name in ROWS:
        rs = [r for r in runs[name] if r.get("convergence")]
        if not rs:
            lines.append([name, NOT_RUN] + [MISSING] * (len(header) - 2))
            continue
        conv = [r["convergence"] for r in rs]
        speed = [cell([None if target is None else updates_to_reach(valid_curve(r), f * target) for r in rs],
                      _count) for f in SPEED_FRACTIONS]
        lines.append([name, ", ".join(str(r["seed"]) for r in rs),
                      cell([c["best_bleu"] for c in conv], _bleu), cell([c["best_update"] for c in conv], _count),
                      cell([c["update"] for c in conv], _count), ", ".join(c["reason"] for c in conv), *speed])
    return intro + markdown_table(header, lines)


def budget_runs(runs: Runs) -> Runs:
    """The runs as they scored at the equal budget (runs without that evaluation left out)."""
    return {name: [at_equal_budget(r) for r in rs if r.get("equal_budget")] for name, rs in runs.items()}


def plot_valid_bleu(scale: Scale, runs: Runs, path: Path) -> None:
    """Valid BLEU against updates per row: the mean over the seeds validated at each update, and
    their range shaded; a vertical line at the equal budget."""
    fig, ax = new_axes()
    colors = _row_colors()
    for name in ROWS:
        curves = [valid_curve(r) for r in runs[name] if r.get("valid_bleu")]
        updates = sorted({u for c in curves for u in c})
        if not updates:
            continue
        points = [[c[u] for c in curves if u in c] for u in updates]
        ax.plot(updates, [statistics.fmean(p) for p in points], color=colors[name],
                label=f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
        ax.fill_between(updates, [min(p) for p in points], [max(p) for p in points],
                        color=colors[name], alpha=0.2, linewidth=0)
    if scale.equal_budget is not None:
        ax.axvline(scale.equal_budget, color="gray", linestyle="--")
        ax.text(scale.equal_budget, 0.02, " equal budget", transform=ax.get_xaxis_transform(),
                color="gray", fontsize="small")
    finish(fig, ax, path, any(r.get("valid_bleu") for rs in runs.values() for r in rs), xlabel="update",
           ylabel="valid BLEU (sacreBLEU, single checkpoint)",
           title=f"Valid BLEU against updates, scale {scale.name} (mean; shaded: range over seeds)")


# --- Plots


def _row_colors() -> Dict[str, str]:
    """One color per row, the same in every plot."""
    colors = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: colors[i % len(colors)] for i, name in enumerate(ROWS)}


def plot_valid_loss(scale: Scale, runs: Runs, path: Path) -> None:
    fig, ax = new_axes()
    colors = _row_colors()
    styles = ["-", "--", ":", "-."]
    for name, rs in runs.items():
        for j, r in enumerate(rs):
            curve = r.get("valid_loss") or []
            ax.plot([u for u, _ in curve], [loss for _, loss in curve], styles[j % len(styles)],
                    color=colors[name], marker=".", label=f"{name}, seed {r['seed']}")
    finish(fig, ax, path, any(runs.values()), xlabel="update",
            ylabel="validation loss (label-smoothed cross-entropy, bits)",
            title=f"Validation loss, scale {scale.name}")


def plot_bleu(scale: Scale, runs: Runs, path: Path) -> None:
    fig, ax = new_axes()
    names, colors = list(ROWS), _row_colors()
    for x, name in enumerate(names):
        bleus = [r["bleu_tokenized"] for r in runs[name] if r.get("bleu_tokenized") is not None]
        if not bleus:  # y in axes fraction: visible whatever the BLEU range
            ax.text(x, 0.03, NOT_RUN, ha="center", va="bottom", rotation=90, color="gray",
                    transform=ax.get_xaxis_transform())
            continue
        mean, std = mean_std(bleus)
        ax.bar(x, mean, yerr=std or 0, capsize=6, color=colors[name], alpha=0.7)
        ax.plot([x] * len(bleus), bleus, "k.", zorder=3)
        ax.text(x + 0.1, mean, f"{mean:.2f}", ha="left", va="bottom", fontsize="small")
    if scale.paper_comparable:
        for x, name in enumerate(names):
            for bleu, _ in ROWS[name].paper_bleu:
                ax.plot(x, bleu, "rx", markersize=8)
        ax.plot([], [], "rx", label="paper")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))
    finish(fig, ax, path, any(runs.values()), legend=scale.paper_comparable,
            ylabel="BLEU (tokenized, compound-split)",
            title=f"BLEU per row, scale {scale.name} (bars: mean, error bars: std over seeds, dots: seeds)")


def plot_bleu_by_length(scale: Scale, runs: Runs, path: Path) -> None:
    """BLEU per source-length bucket and, below it, the hypotheses' length over the references':
    a row that stops short of long inputs (or runs on) shows there what its BLEU does not say."""
    assert scale.bucket_edges
    fig, (ax, ratio_ax) = pyplot().subplots(2, 1, sharex=True, figsize=(7, 7.5),
                                              gridspec_kw={"height_ratios": (3, 2)})
    buckets = length_buckets(runs)
    labels = [b["bucket"] for b in buckets]
    _plot_per_bucket(ax, runs, labels, "bleu", legend=True)
    _plot_per_bucket(ratio_ax, runs, labels, "length_ratio", legend=False)
    ratio_ax.axhline(1.0, color="black", linewidth=0.8)
    ratio_ax.set(xlabel="source length (raw English words)", ylabel="hypothesis / reference length")
    ratio_ax.grid(alpha=0.3)
    if buckets:
        if scale.max_train_len is not None:
            trained = sum(b["low"] < scale.max_train_len for b in buckets)
            for axes in (ax, ratio_ax):
                axes.axvline(trained - 0.5, color="gray", linestyle="--")
            ax.text(trained - 0.45, 0.02, " longer than training", transform=ax.get_xaxis_transform(),
                    color="gray", fontsize="small")
        ratio_ax.set_xticks(range(len(labels)), labels)
    finish(fig, ax, path, bool(buckets), ylabel="BLEU (tokenized, compound-split)",
           title=f"BLEU by source length, scale {scale.name} (mean and std over seeds)")


def _plot_per_bucket(ax: Any, runs: Runs, labels: Sequence[str], key: str, legend: bool) -> None:
    """Each row's mean ± std over seeds of ``key`` per bucket (runs that did not measure it left out)."""
    colors = _row_colors()
    for name in ROWS:
        points = [(x, [v for v in values if v is not None])
                  for x, values in enumerate(per_bucket(runs[name], key, labels))]
        stats = [(x, *mean_std(vs)) for x, vs in points if vs]
        if stats:
            ax.errorbar([x for x, _, _ in stats], [m for _, m, _ in stats],
                        yerr=[s or 0 for _, _, s in stats], marker="o", capsize=4,
                        label=name if legend else None, color=colors[name])


# --- Entry point


def collect(scale: Scale, work_dir: Path, out_dir: Path) -> List[Path]:
    """Write ``<scale>.md`` and its plots into ``out_dir``; returns the written files.

    The finished runs of ``work_dir`` are saved as records in ``out_dir/runs/``
    first, and the table is made from every record there.
    """
    runs = finished_runs(work_dir, scale, out_dir / RECORDS)
    plots = {"valid_loss": out_dir / f"{scale.name}_valid_loss.png",
             "bleu": out_dir / f"{scale.name}_bleu.png"}
    plot_valid_loss(scale, runs, plots["valid_loss"])
    plot_bleu(scale, runs, plots["bleu"])
    if scale.bucket_edges:
        plots["bleu_by_length"] = out_dir / f"{scale.name}_bleu_by_length.png"
        plot_bleu_by_length(scale, runs, plots["bleu_by_length"])
    if scale.equal_budget is not None:
        plots["valid_bleu"] = out_dir / f"{scale.name}_valid_bleu.png"
        plot_valid_bleu(scale, runs, plots["valid_bleu"])
    table = out_dir / f"{scale.name}.md"
    scaling = scaling_study.report_path(scale.name, out_dir).with_suffix(".json")
    base.write_text(table, render_markdown(scale, runs, work_dir, plots, out_dir / RECORDS / scale.name,
                                           scaling if scale.is_length_study and scaling.is_file() else None))
    return [table, *plots.values()]
