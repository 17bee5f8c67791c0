"""``reproduce_table.sh collect``: the finished runs of a scale → a markdown table and plots.

Reads every ``<work>/<scale>/<row>/seed<N>/eval/run.json`` (written by
:mod:`fairseq_rope.reproduce`) and the run's ``command.txt``, and writes, each
file atomically, into ``docs/results/``:

* ``<scale>.md``: one line per row (mean ± sample std over seeds, and every
  seed's value) of BLEU in both conventions, parameters, training tokens/s and
  wall time, beside the paper's numbers; rows without a finished run say
  "not run". Then a line per run, the length-extrapolation table (``demo-length``)
  and the commands that produced the runs;
* ``<scale>_valid_loss.png``: validation loss against updates, every run;
* ``<scale>_bleu.png``: BLEU per row, error bars over seeds;
* ``<scale>_bleu_by_length.png`` (``demo-length``): BLEU per source-length bucket.
"""

from __future__ import annotations

import datetime
import logging
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_rope import atomic
from fairseq_rope.experiment import ConfigError, load_experiment
from fairseq_rope.table import (
    REPO,
    ROWS,
    SCALES,
    Row,
    Scale,
    config_name,
    finished_runs,
    scale_dir,
)

Runs = Dict[str, List[Dict[str, Any]]]  # row name -> its runs' run.json, in seed order
NOT_RUN = "not run"
MISSING = "—"
BLEU_NOTE = (
    "BLEU of the average of the last 5 checkpoints, beam 4, length penalty 0.6: tokenized "
    "BLEU with compound splitting (the paper's convention) and sacreBLEU on detokenized output. "
    "Each cell: mean ± sample standard deviation over seeds, then every seed's value in seed "
    "order in brackets (one value when there is one seed, or all seeds agree). Parameters: "
    "elements of the averaged checkpoint's model state, tied embeddings once, buffers excluded. "
    "Train tokens/s: mean over epochs of fairseq's wps (target tokens per second). Wall time: "
    "sum of fairseq-train's 'done training in' over the run's invocations."
)


# --- Numbers and cells


def mean_std(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """Mean and sample standard deviation (None for fewer than two values)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def cell(values: Sequence[Optional[float]], fmt: Callable[[float], str]) -> str:
    """``mean ± std [v1, v2, ...]`` of the values that are not None; ``—`` when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return MISSING
    if len(set(present)) == 1:
        return fmt(present[0])
    mean, std = mean_std(present)
    return f"{fmt(mean)} ± {fmt(std)} [{', '.join(fmt(v) for v in present)}]"


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


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def model_cell(row: Row, scale: Scale, runs: Sequence[Dict[str, Any]]) -> str:
    """The row's title and architecture (from its runs, else from its config)."""
    archs = sorted({r["arch"] for r in runs if r.get("arch")})
    if not archs:
        try:
            archs = [str(load_experiment(config_name(row, scale)).train.get("arch"))]
        except ConfigError:
            archs = ["?"]
    return f"{row.title}: " + ", ".join(f"`{a}`" for a in archs)


def main_table(scale: Scale, runs: Runs) -> List[str]:
    unit, seconds = wall_time_unit(runs)
    paper = "paper BLEU (WMT14 newstest2014)" + ("" if scale.paper_comparable else ", not comparable")
    header = ["row", "model", "seeds", "BLEU (tokenized, compound-split)", "sacreBLEU", paper,
              "parameters", "train tokens/s", f"train wall time ({unit})", "updates"]
    lines = []
    for name, row in ROWS.items():
        rs = runs[name]
        if not rs:
            lines.append([name, model_cell(row, scale, rs), NOT_RUN, NOT_RUN, NOT_RUN, row.paper,
                          MISSING, MISSING, MISSING, MISSING])
            continue
        lines.append([
            name, model_cell(row, scale, rs), ", ".join(str(r["seed"]) for r in rs),
            cell(values(rs, "bleu_tokenized"), _bleu), cell(values(rs, "sacrebleu"), _bleu), row.paper,
            cell(values(rs, "parameters"), _count), cell(values(rs, "train_tokens_per_second"), _count),
            cell(values(rs, "train_wall_seconds", seconds), lambda v: f"{v:.1f}"),
            cell(values(rs, "num_updates"), _count),
        ])
    return markdown_table(header, lines)


def runs_table(runs: Runs) -> List[str]:
    """One line per run: its seed, BLEU and anything that made it differ from the config."""
    header = ["row", "seed", "BLEU (tok.)", "sacreBLEU", "updates", "extra fairseq-train args", "run directory"]
    lines = [
        [name, str(r["seed"]), _optional(r.get("bleu_tokenized")), _optional(r.get("sacrebleu")),
         str(r.get("num_updates")), " ".join(r.get("extra_train_args") or []) or "none",
         f"`{_shown_path(r['run_dir'])}`"]
        for name, rs in runs.items() for r in rs
    ]
    return markdown_table(header, lines) if lines else ["No finished runs."]


def _optional(value: Optional[float]) -> str:
    return MISSING if value is None else _bleu(value)


def length_buckets(runs: Runs) -> List[Dict[str, Any]]:
    """The bucket list of the first run that has BLEU by length (all runs share the test set)."""
    for rs in runs.values():
        for r in rs:
            if r.get("bleu_by_length"):
                return r["bleu_by_length"]["buckets"]
    return []


def bucket_bleus(run: Dict[str, Any]) -> Dict[str, Optional[float]]:
    return {b["bucket"]: b["bleu"] for b in (run.get("bleu_by_length") or {}).get("buckets", [])}


def length_table(scale: Scale, runs: Runs) -> List[str]:
    """BLEU per source-length bucket, one line per row; † marks buckets longer than any training sentence."""
    assert scale.length_study is not None
    spec = scale.length_study
    buckets = length_buckets(runs)
    intro = [
        f"Trained on sentences of at most {spec.max_train_len} source words; tested on "
        f"{spec.per_bucket} sentences per bucket of source length in words of the raw English "
        "(whitespace-separated, punctuation attached). Tokenized compound-split BLEU per bucket; "
        "† = longer than every training sentence.",
        "",
    ]
    if not buckets:
        return intro + ["No finished runs with BLEU by length."]
    header = ["row"] + [
        f"{b['bucket']}{' †' if b['low'] >= spec.max_train_len else ''} (n={b['sentences']})"
        for b in buckets
    ]
    lines = []
    for name in ROWS:
        per_run = [bucket_bleus(r) for r in runs[name]]
        if not per_run:
            lines.append([name] + [NOT_RUN] * len(buckets))
            continue
        lines.append([name] + [cell([p.get(b["bucket"]) for p in per_run], _bleu) for b in buckets])
    longest = _longest_training_pairs(runs)
    note = [f"Longest training pair in BPE tokens (with EOS): {longest}; the learned row's "
            "positions beyond it are untrained."] if longest else []
    return intro + markdown_table(header, lines) + ([""] + note if note else [])


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
            ran = (command_txt.read_text(encoding="utf-8").strip() if command_txt.is_file()
                   else f"# ({command_txt} is missing)")
            lines += [f"# {name}, seed {r['seed']}", r.get("reproduce_command", ""),
                      "# ran (command.txt):", ran, ""]
    return lines[:-1] + ["```"]


def _shown_path(path: Any) -> str:
    """A path relative to the repository when inside it (the table is committed), else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def render_markdown(scale: Scale, runs: Runs, work_dir: Path, plots: Dict[str, Path]) -> str:
    n = sum(len(rs) for rs in runs.values())
    now = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    out = [
        f"# The RoFormer table, scale `{scale.name}`",
        "",
        f"Scale: {scale.title}. Written by `scripts/reproduce_table.sh collect --scale {scale.name}` "
        f"from {n} finished run(s) in `{_shown_path(scale_dir(work_dir, scale))}` ({now}); "
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
        if study.size == scale.size and study.length_study is not None and study is not scale:
            out += [f"Length extrapolation with these models: [{study.name}.md]({study.name}.md).", ""]
    if scale.length_study is not None:
        out += ["## Length extrapolation", ""] + length_table(scale, runs)
        out += ["", f"![BLEU by length]({plots['bleu_by_length'].name})", ""]
    out += ["## Runs", ""] + runs_table(runs) + ["", "## Commands", ""] + commands(runs)
    return "\n".join(out) + "\n"


# --- Plots


def _pyplot():
    # Importing fairseq sets the root logger to DEBUG; matplotlib's font search would flood it.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _row_colors() -> Dict[str, str]:
    """One color per row, the same in every plot."""
    colors = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: colors[i % len(colors)] for i, name in enumerate(ROWS)}


def _axes() -> Tuple[Any, Any]:
    return _pyplot().subplots(figsize=(7, 4.5))


def _finish(fig: Any, ax: Any, path: Path, has_data: bool, legend: bool = True, **labels: str) -> None:
    """Legend (or a "no finished runs" notice), labels, grid; save the PNG atomically."""
    if not has_data:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    elif legend:
        ax.legend(fontsize="small")
    ax.set(**labels)
    ax.grid(alpha=0.3)
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)


def plot_valid_loss(scale: Scale, runs: Runs, path: Path) -> None:
    fig, ax = _axes()
    colors = _row_colors()
    styles = ["-", "--", ":", "-."]
    for name, rs in runs.items():
        for j, r in enumerate(rs):
            curve = r.get("valid_loss") or []
            ax.plot([u for u, _ in curve], [loss for _, loss in curve], styles[j % len(styles)],
                    color=colors[name], marker=".", label=f"{name}, seed {r['seed']}")
    _finish(fig, ax, path, any(runs.values()), xlabel="update",
            ylabel="validation loss (label-smoothed cross-entropy, bits)",
            title=f"Validation loss, scale {scale.name}")


def plot_bleu(scale: Scale, runs: Runs, path: Path) -> None:
    fig, ax = _axes()
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
    _finish(fig, ax, path, any(runs.values()), legend=scale.paper_comparable,
            ylabel="BLEU (tokenized, compound-split)",
            title=f"BLEU per row, scale {scale.name} (bars: mean, error bars: std over seeds, dots: seeds)")


def plot_bleu_by_length(scale: Scale, runs: Runs, path: Path) -> None:
    assert scale.length_study is not None
    fig, ax = _axes()
    buckets, colors = length_buckets(runs), _row_colors()
    labels = [b["bucket"] for b in buckets]
    for name in ROWS:
        per_run = [bucket_bleus(r) for r in runs[name]]
        points = [(x, [p[label] for p in per_run if p.get(label) is not None])
                  for x, label in enumerate(labels)]
        stats = [(x, *mean_std(vs)) for x, vs in points if vs]
        if stats:
            ax.errorbar([x for x, _, _ in stats], [m for _, m, _ in stats],
                        yerr=[s or 0 for _, _, s in stats], marker="o", capsize=4,
                        label=name, color=colors[name])
    if buckets:
        trained = sum(b["low"] < scale.length_study.max_train_len for b in buckets)
        ax.axvline(trained - 0.5, color="gray", linestyle="--")
        ax.text(trained - 0.45, 0.02, " longer than training", transform=ax.get_xaxis_transform(),
                color="gray", fontsize="small")
        ax.set_xticks(range(len(labels)), labels)
    _finish(fig, ax, path, bool(buckets), xlabel="source length (raw English words)",
            ylabel="BLEU (tokenized, compound-split)", title=f"BLEU by source length, scale {scale.name}")


# --- Entry point


def collect(scale: Scale, work_dir: Path, out_dir: Path) -> List[Path]:
    """Write ``<scale>.md`` and its plots into ``out_dir``; returns the written files."""
    runs = finished_runs(work_dir, scale)
    plots = {"valid_loss": out_dir / f"{scale.name}_valid_loss.png",
             "bleu": out_dir / f"{scale.name}_bleu.png"}
    plot_valid_loss(scale, runs, plots["valid_loss"])
    plot_bleu(scale, runs, plots["bleu"])
    if scale.length_study is not None:
        plots["bleu_by_length"] = out_dir / f"{scale.name}_bleu_by_length.png"
        plot_bleu_by_length(scale, runs, plots["bleu_by_length"])
    table = out_dir / f"{scale.name}.md"
    atomic.write_text(table, render_markdown(scale, runs, work_dir, plots))
    return [table, *plots.values()]
