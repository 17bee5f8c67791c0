"""``reproduce_table.sh collect``: the finished runs of a scale → a markdown table and plots.

Reads every ``<work>/<scale>/<row>/seed<N>/eval/run.json`` (written by
:mod:`fairseq_rope.experiments.reproduce`) and the run's ``command.txt``, and writes, each
file atomically, into ``docs/results/``:

* ``<scale>.md``: one line per row (mean ± sample std over seeds, and every
  seed's value) of BLEU in both conventions, parameters, training tokens/s and
  wall time, beside the paper's numbers (:mod:`~fairseq_rope.experiments.cells`);
  rows without a finished run say "not run". At a real-data scale, each row against
  sinusoidal over test sentences and over training seeds
  (:mod:`~fairseq_rope.evaluation.significance_tables`). Then a line per run, the
  length-extrapolation table (:mod:`~fairseq_rope.experiments.length_tables`; ``demo-length``;
  ``multi30k-length`` also against the same rows trained on all lengths, and the
  RoPE scaling study of its rope runs where ``scripts/rope_scaling_study.py`` has
  written one) and the commands that produced the runs;
* the plots (:mod:`~fairseq_rope.experiments.plots`):
* ``<scale>_valid_loss.png``: validation loss against updates, every run;
* ``<scale>_bleu.png``: BLEU per row, error bars over seeds;
* ``<scale>_bleu_by_length.png`` (``demo-length``): BLEU per source-length bucket;
* at a scale trained to convergence (``multi30k-converged``), the same tables
  again at the equal budget (the same runs' average of their last 5 checkpoints
  up to the budget, and those of the runs still under way, recorded as soon as
  they scored it: ``eval-budget/run.json``), a convergence table (updates at convergence, updates to
  95 % and 99 % of sinusoidal's converged valid BLEU; for the runs under way, as far as they have
  trained, :func:`~fairseq_rope.experiments.summary.record_progress`) and
  ``<scale>_valid_bleu.png``: valid BLEU against updates, mean and range over
  seeds per row.
"""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path
from typing import Dict, List, Optional

from fairseq_rope import base
from fairseq_rope.base import portable
from fairseq_rope.evaluation.significance_tables import References, bootstrap_table, seed_table
from fairseq_rope.experiments import scaling_study
from fairseq_rope.experiments.cells import (
    BLEU_NOTE,
    budget_runs,
    convergence_table,
    main_table,
    progress_table,
    runs_table,
)
from fairseq_rope.experiments.length_tables import length_against_full_data, length_table
from fairseq_rope.experiments.plots import plot_bleu, plot_bleu_by_length, plot_valid_bleu, plot_valid_loss
from fairseq_rope.experiments.summary import record_progress
from fairseq_rope.experiments.table import (
    BASELINE,
    RECORDS,
    SCALES,
    Runs,
    Scale,
    full_length_scale,
    get_row,
    record_hypotheses,
    recorded_runs,
    same_models,
    scale_dir,
    scored_runs,
    shown_path,
    split_under_way,
)


# --- Significance


def significance_section(runs: Runs, work_dir: Path, level: str) -> List[str]:
    """Every row against the baseline in the runs of equal seed: over test sentences (the paired
    bootstrap), then over training seeds (the paired t-test); then each ablation against each row
    it takes apart, the same way. ``level``: their headings'."""
    references = References(work_dir, shown_path(work_dir), [run for rs in runs.values() for run in rs])
    out = []
    # Against a row an ablation takes apart: once the ablation has runs (before, only "not run").
    for against in [BASELINE] + sorted({name for n, rs in runs.items() if rs for name in get_row(n).takes_apart}):
        compared = [name for name in runs if name != against
                    and (against == BASELINE or against in get_row(name).takes_apart)]
        title = "" if against == BASELINE else f", against `{against}`"
        if not runs.get(against):
            out += [f"No finished `{against}` run to compare against.", ""]
            continue
        theirs = {r["seed"]: r for r in runs[against]}
        rows = {name: [(r, theirs[r["seed"]]) for r in runs[name] if r["seed"] in theirs] for name in compared}
        out += ([f"{level} Over test sentences (paired bootstrap){title}", ""]
                + bootstrap_table(rows, against, references, record_hypotheses) + [""]
                + [f"{level} Over training seeds (paired t-test){title}", ""] + seed_table(rows, against) + [""])
    return out


def replicated_runs(scale: Scale, at_budget: Runs, records: Path) -> List[str]:
    """The runs whose equal-budget decoding is, word for word, that of the same row and seed in
    the fixed-budget table they are compared with: the same training to the same update, so
    not an independent replication of that run."""
    if scale.data_of is None:
        return []
    fixed = recorded_runs(records.parent, SCALES[scale.data_of])
    same = []
    for name, rs in at_budget.items():
        theirs = {r["seed"]: r for r in fixed.get(name, [])}
        for run in rs:
            ours = record_hypotheses(run)
            if ours is not None and run["seed"] in theirs and ours == record_hypotheses(theirs[run["seed"]]):
                same.append(f"{name} seed {run['seed']}")
    if not same:
        return []
    return [f"At the equal budget, {', '.join(same)} decoded every test sentence as the same row and "
            f"seed of [{scale.data_of}.md]({scale.data_of}.md) does: the same training to the same "
            "update, not an independent replication of that run.", ""]


# --- The page


def render_markdown(scale: Scale, runs: Runs, work_dir: Path, plots: Dict[str, Path],
                    records: Path, scaling: Optional[Path] = None) -> str:
    """The table of a scale from its runs (``records``: ``RESULTS/runs/<scale>``) and, for a
    length study, its RoPE scaling study (``scaling``: the study's JSON report), if made.
    Runs under way (:data:`~fairseq_rope.experiments.table.UNDER_WAY`) count in the equal-budget
    tables only."""
    finished, going = split_under_way(runs)
    n, n_going = (sum(len(rs) for rs in group.values()) for group in (finished, going))
    now = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    runs_from = shown_path(scale_dir(work_dir, scale))
    if Path(runs_from).is_absolute():  # another checkout's runs: a committed table names no machine's paths
        runs_from = f"WORK_DIR/{scale.name}` of `collect --work-dir WORK_DIR"
    out = [
        f"# The RoFormer table, scale `{scale.name}`",
        "",
        f"Scale: {scale.title}. Written by `scripts/reproduce_table.sh collect --scale {scale.name}` "
        f"from {n} finished run(s)"
        + (f" and {n_going} under way (at the equal budget only)" if n_going else "")
        + f" recorded in `{shown_path(records)}` ({now}; the runs of "
        f"`{runs_from}` are recorded there first); "
        "rerun it rather than editing this file.",
        "",
    ]
    if not scale.paper_comparable:
        out += ["**The paper's numbers are BLEU on WMT14 En→De newstest2014 with Transformer-base; "
                "they are not comparable with this scale** (other data, tiny models) and are shown "
                "only to name the row each one stands for.", ""]
    out += main_table(scale, finished) + ["", BLEU_NOTE, ""]
    out += [f"![validation loss]({plots['valid_loss'].name}) ![BLEU]({plots['bleu'].name})", ""]
    for study in SCALES.values():  # the length study of the same models, if any
        if same_models(study, scale) and study.is_length_study and study is not scale:
            out += [f"Length extrapolation with these models: [{study.name}.md]({study.name}.md).", ""]
    if scale.data != "demo":
        out += ["## Significance", ""] + significance_section(finished, work_dir, "###")
    if scale.equal_budget is not None:
        at_budget = budget_runs(runs)
        out += ["## Convergence", ""] + convergence_table(finished) + [""] + progress_table(going, finished)
        out += [f"![valid BLEU]({plots['valid_bleu'].name})", ""]
        out += [f"## The same runs at the equal budget ({scale.equal_budget} updates)", "",
                f"Each run's average of its last 5 checkpoints up to update {scale.equal_budget}, "
                "decoded and scored as above: the budget of the fixed-budget table, from the "
                "trajectories that go on to convergence. Tokens/s and wall time: their training up to "
                "that update (— for runs recorded before these were).", ""]
        out += under_way_note(going)
        out += main_table(scale, at_budget) + [""] + replicated_runs(scale, at_budget, records)
        out += ["### Significance at the equal budget", ""] + significance_section(at_budget, work_dir, "####")
    if scale.bucket_edges:
        title = "Length extrapolation" if scale.is_length_study else "BLEU by source length"
        out += [f"## {title}", ""] + length_table(scale, finished)
        out += ["", f"![BLEU by length]({plots['bleu_by_length'].name})", ""]
        full = full_length_scale(scale)
        if full is not None:
            out += ["## Against the same rows trained on all lengths", ""]
            out += length_against_full_data(scale, finished, full, recorded_runs(records.parent, full)) + [""]
    if scaling is not None:
        out += ["## RoPE scaling at decoding time", ""] + scaling_section(scaling) + [""]
    out += ["## Runs", ""] + runs_table(finished) + ["", "## Commands", ""] + commands(runs)
    return "\n".join(out) + "\n"


def under_way_note(going: Runs) -> List[str]:
    """Which runs of the equal-budget tables have not converged yet."""
    names = [f"{name} seed {r['seed']}" for name, rs in going.items() for r in rs]
    if not names:
        return []
    return [f"Under way, so in these tables only: {', '.join(names)} (scored at the equal budget and "
            "recorded then, still training to convergence).", ""]


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


def commands(runs: Runs) -> List[str]:
    """Each run's reproduce command and the fairseq-train command it ran (command.txt)."""
    if not any(runs.values()):
        return ["No finished runs."]
    lines = ["```bash"]
    for name, rs in runs.items():
        for r in rs:
            command_txt = Path(r["run_dir"]) / "command.txt"
            ran = (ran_portably(command_txt.read_text(encoding="utf-8")) if command_txt.is_file()
                   else f"# ({shown_path(command_txt)} is missing)")
            lines += [f"# {name}, seed {r['seed']}", r.get("reproduce_command", ""),
                      "# ran (command.txt):", ran, ""]
    return lines[:-1] + ["```"]


def ran_portably(command_txt: str) -> str:
    """command.txt (``cd DIR`` then fairseq-train) with DIR's paths relative to DIR: the
    command as run from the checkout's root, wherever that checkout was."""
    cd, _, command = command_txt.strip().partition("\n")
    root = shlex.split(cd)[1] if cd.startswith("cd ") else None
    return command_txt.strip() if root is None else "# from the checkout's root:\n" + portable(command, root)


# --- Entry point


def collect(scale: Scale, work_dir: Path, out_dir: Path) -> List[Path]:
    """Write ``<scale>.md`` and its plots into ``out_dir``; returns the written files.

    The runs of ``work_dir`` (finished, or under way at a converged scale) are saved as records
    in ``out_dir/runs/`` first, and the table is made from every record there.
    """
    if scale.equal_budget is not None:  # the runs under way: how far they have trained since
        for run in sorted(scale_dir(work_dir, scale).glob("*/seed*")):
            record_progress(run)
    runs = scored_runs(work_dir, scale, out_dir / RECORDS)
    finished, going = split_under_way(runs)
    plots = {"valid_loss": out_dir / f"{scale.name}_valid_loss.png",
             "bleu": out_dir / f"{scale.name}_bleu.png"}
    plot_valid_loss(scale, finished, plots["valid_loss"])
    plot_bleu(scale, finished, plots["bleu"])
    if scale.bucket_edges:
        plots["bleu_by_length"] = out_dir / f"{scale.name}_bleu_by_length.png"
        plot_bleu_by_length(scale, finished, plots["bleu_by_length"])
    if scale.equal_budget is not None:
        plots["valid_bleu"] = out_dir / f"{scale.name}_valid_bleu.png"
        plot_valid_bleu(scale, finished, plots["valid_bleu"], going)
    table = out_dir / f"{scale.name}.md"
    scaling = scaling_study.report_path(scale.name, out_dir).with_suffix(".json")
    base.write_text(table, render_markdown(scale, runs, work_dir, plots, out_dir / RECORDS / scale.name,
                                           scaling if scale.is_length_study and scaling.is_file() else None))
    return [table, *plots.values()]
