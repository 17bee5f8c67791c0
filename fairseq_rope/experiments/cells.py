"""The cells and tables of a results page (:mod:`fairseq_rope.experiments.collect`): one line
per row of the scores, sizes and speeds of its runs, one line per run, and the convergence table.

A cell shows a measure over a row's seeds: ``mean ± std [seed 1, seed 2, ...]``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_rope.evaluation.report import MISSING, NOT_RUN, markdown_table
from fairseq_rope.evaluation.scoring import RUNAWAY_RATIO
from fairseq_rope.experiments.command import last_value, parse_command, read_command
from fairseq_rope.experiments.config import ConfigError, load_experiment
from fairseq_rope.experiments.convergence import updates_to_reach
from fairseq_rope.experiments.table import (
    BASELINE,
    Row,
    Runs,
    Scale,
    at_equal_budget,
    config_name,
    get_row,
    latest_state,
    shown_path,
)

BLEU_NOTE = (
    "Model: the architecture each run trained and the shape options its command set over that "
    "architecture's defaults (the run's command.txt). BLEU of the average of the last 5 "
    "checkpoints, beam 4, length penalty 0.6: tokenized BLEU with compound splitting (the "
    "paper's convention), sacreBLEU and chrF (sacrebleu's defaults) on detokenized output. "
    "Runaways: per seed, hypotheses longer than "
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


def bleu_cell(value: float) -> str:
    return f"{value:.2f}"


def count_cell(value: float) -> str:
    return f"{value:,.0f}"


def wall_time_unit(runs: Runs) -> Tuple[str, float]:
    """(unit, seconds per unit) that suits the longest run: s, min or h."""
    longest = max((r.get("train_wall_seconds") or 0 for rs in runs.values() for r in rs), default=0)
    if longest < 300:
        return "s", 1.0
    return ("min", 60.0) if longest < 3 * 3600 else ("h", 3600.0)


def values(runs: Sequence[Dict[str, Any]], key: str, scale: float = 1.0) -> List[Optional[float]]:
    return [None if r.get(key) is None else r[key] / scale for r in runs]


# --- The main table


#: fairseq-train options that shape a Transformer over its architecture's defaults: (encoder's,
#: decoder's) and how the model cell writes their values.
SHAPE_OPTIONS = (
    (("encoder-layers", "decoder-layers"), "{} layers", "+"),
    (("encoder-embed-dim", "decoder-embed-dim"), "d={}", "/"),
    (("encoder-ffn-embed-dim", "decoder-ffn-embed-dim"), "FFN {}", "/"),
    (("encoder-attention-heads", "decoder-attention-heads"), "{} heads", "/"),
)


def trained_model(argv: Sequence[str]) -> str:
    """The model fairseq-train arguments train: the architecture, and the shape its options set
    over the architecture's defaults (``transformer_wmt_en_de`` with 3+3 layers, d=256, ...)."""
    _, options = parse_command(argv)
    shape = []
    for names, form, joiner in SHAPE_OPTIONS:
        encoder, decoder = (last_value(options, name) for name in names)
        if encoder is None and decoder is None:
            continue
        sides = [encoder or "default", decoder or "default"]
        shape.append(form.format(joiner.join(sides) if joiner == "+" or encoder != decoder else encoder))
    model = f"`{last_value(options, 'arch') or '?'}`"
    return f"{model} with {', '.join(shape)}" if shape else model


def _config_argv(row: Row, scale: Scale) -> List[str]:
    """The fairseq-train options of the row's config at ``scale`` (none if it has no config)."""
    try:
        return load_experiment(config_name(row, scale)).argv()
    except ConfigError:
        return []


def _trained_argv(run: Mapping[str, Any], row: Row, scale: Scale) -> List[str]:
    """The fairseq-train arguments of a run's command.txt; where it has none to read, its
    config's with the architecture the run recorded."""
    try:
        return read_command(Path(run["run_dir"]))[1]
    except (KeyError, OSError, IndexError, ValueError):
        return [*_config_argv(row, scale), *(["--arch", run["arch"]] if run.get("arch") else [])]


def model_cell(row: Row, scale: Scale, runs: Sequence[Dict[str, Any]]) -> str:
    """The row's title and the model its runs trained (their command.txt; the row's config at
    this scale while it has none)."""
    argvs = [_trained_argv(r, row, scale) for r in runs] or [_config_argv(row, scale)]
    return f"{row.title}: " + "; ".join(sorted({trained_model(argv) for argv in argvs}))


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
    for name, rs in runs.items():
        row = get_row(name)
        if not rs:
            lines.append([name, model_cell(row, scale, rs), NOT_RUN, NOT_RUN, NOT_RUN, NOT_RUN, row.paper,
                          MISSING, MISSING, MISSING, MISSING, MISSING])
            continue
        mark = UNEVEN_MARK if any(uneven_speed(r) for r in rs) else ""
        lines.append([
            name, model_cell(row, scale, rs), seeds_cell(rs),
            cell(values(rs, "bleu_tokenized"), bleu_cell), cell(values(rs, "sacrebleu"), bleu_cell),
            cell(values(rs, "chrf"), bleu_cell), row.paper, runaway_cell(rs),
            cell(values(rs, "parameters"), count_cell), cell(values(rs, "train_tokens_per_second"), count_cell) + mark,
            cell(values(rs, "train_wall_seconds", seconds), lambda v: f"{v:.1f}") + mark,
            cell([r.get("updates_at_convergence", r.get("num_updates")) for r in rs], count_cell),
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


# --- One line per run


def runs_table(runs: Runs) -> List[str]:
    """One line per run: its seed, BLEU and anything that made it differ from the config."""
    header = ["row", "seed", "BLEU (tok.)", "sacreBLEU", "updates", "trained with",
              "extra fairseq-train args", "run directory"]
    lines = [
        [name, str(r["seed"]), _optional(r.get("bleu_tokenized")), _optional(r.get("sacrebleu")),
         str(r.get("num_updates")), _trained_with(r),
         " ".join(r.get("extra_train_args") or []) or "none",
         f"`{shown_path(r['run_dir'])}`"]
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
    return MISSING if value is None else bleu_cell(value)


# --- Convergence


#: Fractions of the baseline's converged valid BLEU whose first crossing measures convergence speed.
SPEED_FRACTIONS = (0.95, 0.99)


def valid_curve(run: Mapping[str, Any]) -> Dict[int, float]:
    """A run's valid BLEU by update (``--eval-bleu``, single checkpoints)."""
    return {int(u): float(b) for u, b in run.get("valid_bleu") or []}


def latest_valid_curve(run: Mapping[str, Any]) -> Dict[int, float]:
    """A run's valid BLEU as far as it is known (:func:`~fairseq_rope.experiments.table.latest_state`)."""
    return valid_curve(latest_state(run))


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
    for name, rs in runs.items():
        rs = [r for r in rs if r.get("convergence")]
        if not rs:
            lines.append([name, NOT_RUN] + [MISSING] * (len(header) - 2))
            continue
        conv = [r["convergence"] for r in rs]
        speed = [cell([None if target is None else updates_to_reach(valid_curve(r), f * target) for r in rs],
                      count_cell) for f in SPEED_FRACTIONS]
        lines.append([name, ", ".join(str(r["seed"]) for r in rs),
                      cell([c["best_bleu"] for c in conv], bleu_cell),
                      cell([c["best_update"] for c in conv], count_cell),
                      cell([c["update"] for c in conv], count_cell), ", ".join(c["reason"] for c in conv), *speed])
    return intro + markdown_table(header, lines)


def progress_table(going: Runs, finished: Runs) -> List[str]:
    """Per run under way: how far it has validated (its record's ``progress``, else its curve to the
    equal budget), its best valid BLEU so far and where, and the updates it took to first reach
    95 % and 99 % of the baseline's converged valid BLEU, or that it had not by then."""
    target = baseline_converged_bleu(finished)
    lines = []
    for name, rs in going.items():
        for r in rs:
            curve = latest_valid_curve(r)
            if not curve:
                continue
            last = max(curve)
            best = min(curve, key=lambda u: (-curve[u], u))
            reached = [None if target is None else updates_to_reach(curve, f * target) for f in SPEED_FRACTIONS]
            lines.append([name, str(r["seed"]), count_cell(last), bleu_cell(curve[best]), count_cell(best)]
                         + [f"not by {count_cell(last)}" if u is None else count_cell(u) for u in reached])
    if not lines:
        return []
    header = ["row", "seed", "validated to (updates)", "best valid BLEU so far", "best at (updates)"] + [
        f"updates to {f:.0%}" for f in SPEED_FRACTIONS]
    return (["Runs under way: not converged, so not in the table above; their validations as far as "
             "they had trained when last collected. An update at which a run first reached X % is "
             "final; \"not by N\" only says it had not by update N.", ""]
            + markdown_table(header, lines) + [""])


def budget_runs(runs: Runs) -> Runs:
    """The runs as they scored at the equal budget (runs without that evaluation left out)."""
    return {name: [at_equal_budget(r) for r in rs if r.get("equal_budget")] for name, rs in runs.items()}
