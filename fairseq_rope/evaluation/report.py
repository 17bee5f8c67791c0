"""Markdown tables and PNG figures, as every report of the harness writes them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List, Sequence, Tuple

from fairseq_rope import base

#: A table cell of a run that did not measure it, and of a row without runs.
MISSING = "—"
NOT_RUN = "not run"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported on first use)."""
    # Importing fairseq sets the root logger to DEBUG; matplotlib's font search would flood it.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def new_axes() -> Tuple[Any, Any]:
    """One figure with one panel, at the size of every single-panel plot."""
    return pyplot().subplots(figsize=(7, 4.5))


def save_figure(fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG atomically and release it."""
    with base.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)


def finish(fig: Any, ax: Any, path: Path, has_data: bool, legend: bool = True, **labels: str) -> None:
    """Legend (or a "no finished runs" notice), labels, grid; save the PNG."""
    if not has_data:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    elif legend:
        ax.legend(fontsize="small")
    ax.set(**labels)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
