"""The rows and scales of the RoFormer WMT14 En→De table, and where their runs live.

A *row* is a position encoding (the paper's table has Transformer-base with
sinusoidal positions, RPE and RoFormer; we add learned absolute positions), a
*scale* a dataset and model size: ``wmt14`` (Transformer-base on WMT14, the
paper's setting), ``demo`` (tiny models on the synthetic demo corpus, CPU) and
``demo-length`` (the demo models trained on short sentences, tested on longer
ones). Row ``R`` at a scale of size ``S`` trains ``configs/R_S.yaml``.

Layout of a work directory (default ``work/`` in the repository)::

    <work>/<scale>/corpus/              generated corpus (demo scales)
    <work>/<scale>/data/                prepared data: raw/, tok/, bpe/, data-bin/
    <work>/<scale>/<row>/seed<N>/       checkpoints, train.log, command.txt
    <work>/<scale>/<row>/seed<N>/eval/  results.json, run.json (the run's summary)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from fairseq_rope.experiment import DEFAULT_CONFIG_DIR
from fairseq_rope.length_study import LengthCorpus

PathLike = Union[str, os.PathLike]
REPO = DEFAULT_CONFIG_DIR.parent
DEFAULT_WORK_DIR = REPO / "work"
DEFAULT_RESULTS_DIR = REPO / "docs" / "results"
RUN_SUMMARY = "run.json"


class TableError(ValueError):
    """An unknown row or scale, or a run directory that cannot be read."""


@dataclass(frozen=True)
class Row:
    """A row of the table: a position encoding, and what the paper reports for it."""

    name: str
    title: str
    paper_bleu: Tuple[Tuple[float, str], ...] = ()  # (BLEU on newstest2014, whose run)

    @property
    def paper(self) -> str:
        """The paper's numbers as a table cell ("—" when the paper has no such row)."""
        return " / ".join(f"{bleu} ({who})" for bleu, who in self.paper_bleu) or "—"


@dataclass(frozen=True)
class Scale:
    """Data and model size of a set of runs; its rows train ``configs/<row>_<size>.yaml``."""

    name: str
    size: str
    title: str
    paper_comparable: bool
    length_study: Optional[LengthCorpus] = None


ROWS: Dict[str, Row] = {row.name: row for row in (
    Row("sinusoidal", "Transformer, sinusoidal positions",
        ((27.3, "Vaswani et al."), (26.5, "Shaw et al."))),
    Row("learned", "Transformer, learned absolute positions"),
    Row("rpe", "Transformer + RPE (Shaw et al. 2018)", ((26.8, "Shaw et al."),)),
    Row("rope", "RoFormer (RoPE)", ((27.5, "Su et al."),)),
)}

SCALES: Dict[str, Scale] = {scale.name: scale for scale in (
    Scale("wmt14", "base", "Transformer-base on WMT14 En→De (newstest2014)", paper_comparable=True),
    Scale("demo", "demo", "tiny models on the synthetic demo corpus (CPU)", paper_comparable=False),
    Scale("demo-length", "demo",
          "length extrapolation: tiny models trained on short sentences of the synthetic "
          "demo corpus, tested on longer ones (CPU)",
          paper_comparable=False, length_study=LengthCorpus()),
)}


def get_row(name: str) -> Row:
    if name not in ROWS:
        raise TableError(f"unknown row {name!r}; valid rows: {', '.join(ROWS)}")
    return ROWS[name]


def get_scale(name: str) -> Scale:
    if name not in SCALES:
        raise TableError(f"unknown scale {name!r}; valid scales: {', '.join(SCALES)}")
    return SCALES[name]


def config_name(row: Row, scale: Scale) -> str:
    """The experiment config of ``row`` at ``scale`` (a name in ``configs/``)."""
    return f"{row.name}_{scale.size}"


def scale_dir(work_dir: PathLike, scale: Scale) -> Path:
    return Path(work_dir) / scale.name


def data_dir(work_dir: PathLike, scale: Scale) -> Path:
    """Prepared data of a scale (``prepare_parallel.sh``/``prepare_wmt14_en_de.sh`` output)."""
    return scale_dir(work_dir, scale) / "data"


def run_dir(work_dir: PathLike, scale: Scale, row: Row, seed: int) -> Path:
    """Checkpoints and logs of one run (``scripts/train.sh``'s SAVE_DIR)."""
    return scale_dir(work_dir, scale) / row.name / f"seed{seed}"


def summary_path(run: PathLike) -> Path:
    """``run.json`` of a run directory, beside scripts/evaluate.sh's results.json."""
    return Path(run) / "eval" / RUN_SUMMARY


def finished_runs(work_dir: PathLike, scale: Scale) -> Dict[str, List[Dict[str, Any]]]:
    """Every row's finished runs (those with a ``run.json``), in seed order; ``[]`` for rows not run."""
    runs: Dict[str, List[Dict[str, Any]]] = {}
    for name, row in ROWS.items():
        found = []
        for path in (scale_dir(work_dir, scale) / name).glob(f"seed*/eval/{RUN_SUMMARY}"):
            summary = _read_summary(path)
            if (summary.get("row"), summary.get("scale")) != (name, scale.name):
                raise TableError(f"{path} is a run of row {summary.get('row')!r} at scale "
                                 f"{summary.get('scale')!r}, but lies in {name}/ of {scale.name}")
            found.append({**summary, "run_dir": str(path.parent.parent)})
        runs[name] = sorted(found, key=lambda s: s["seed"])
    return runs


def _read_summary(path: Path) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise TableError(f"cannot read run summary {path}: {e}") from e
