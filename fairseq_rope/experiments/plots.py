"""A results page's figures (:mod:`fairseq_rope.experiments.collect`): validation loss and valid
BLEU against updates, BLEU per row, BLEU by source length; one color per row in all of them."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from fairseq_rope.evaluation.report import NOT_RUN, finish, new_axes, pyplot
from fairseq_rope.experiments.cells import latest_valid_curve, mean_std, valid_curve
from fairseq_rope.experiments.length_tables import length_buckets, per_bucket
from fairseq_rope.experiments.table import ABLATIONS, ROWS, Runs, Scale, get_row


def _row_colors() -> Dict[str, str]:
    """One color per row, the same in every plot."""
    colors = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: colors[i % len(colors)] for i, name in enumerate({**ROWS, **ABLATIONS})}


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
    names, colors = list(runs), _row_colors()
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
            for bleu, _ in get_row(name).paper_bleu:
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
    for name, rs in runs.items():
        points = [(x, [v for v in values if v is not None])
                  for x, values in enumerate(per_bucket(rs, key, labels))]
        stats = [(x, *mean_std(vs)) for x, vs in points if vs]
        if stats:
            ax.errorbar([x for x, _, _ in stats], [m for _, m, _ in stats],
                        yerr=[s or 0 for _, _, s in stats], marker="o", capsize=4,
                        label=name if legend else None, color=colors[name])


def plot_valid_bleu(scale: Scale, runs: Runs, path: Path, going: Optional[Runs] = None) -> None:
    """Valid BLEU against updates per row: the mean over the seeds validated at each update, and
    their range shaded; each run still under way (``going``) dotted, as far as it has trained; a
    vertical line at the equal budget."""
    fig, ax = new_axes()
    colors = _row_colors()
    for name, rs in runs.items():
        curves = [valid_curve(r) for r in rs if r.get("valid_bleu")]
        updates = sorted({u for c in curves for u in c})
        if not updates:
            continue
        points = [[c[u] for c in curves if u in c] for u in updates]
        ax.plot(updates, [statistics.fmean(p) for p in points], color=colors[name],
                label=f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
        ax.fill_between(updates, [min(p) for p in points], [max(p) for p in points],
                        color=colors[name], alpha=0.2, linewidth=0)
    for name, rs in (going or {}).items():
        for r in rs:
            curve = latest_valid_curve(r)
            ax.plot(sorted(curve), [curve[u] for u in sorted(curve)], color=colors[name], linestyle=":",
                    label=f"{name} seed {r['seed']}, under way")
    if scale.equal_budget is not None:
        ax.axvline(scale.equal_budget, color="gray", linestyle="--")
        ax.text(scale.equal_budget, 0.02, " equal budget", transform=ax.get_xaxis_transform(),
                color="gray", fontsize="small")
    shown = [r for group in (runs, going or {}) for rs in group.values() for r in rs]
    finish(fig, ax, path, any(r.get("valid_bleu") for r in shown), xlabel="update",
           ylabel="valid BLEU (sacreBLEU, single checkpoint)",
           title=f"Valid BLEU against updates, scale {scale.name} (mean; shaded: range over seeds)")
