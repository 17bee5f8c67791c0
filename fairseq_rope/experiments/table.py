"""The rows and scales of the RoFormer WMT14 En→De table, and where their runs live.

A *row* is a position encoding (the paper's table has Transformer-base with
sinusoidal positions, RPE and RoFormer; we add learned absolute positions), a
*scale* a dataset and model size: ``wmt14`` (Transformer-base on WMT14, the
paper's setting), ``multi30k`` (small models on the real Multi30k En→De
captions, CPU), ``multi30k-length`` (those models trained on the shorter
captions only, tested on all), ``multi30k-converged`` (trained to convergence),
``multi30k-fr`` and ``multi30k-fr-converged`` (the same recipe on the English→French
translations of the same captions), ``demo`` (tiny models on the synthetic demo
corpus, CPU) and ``demo-length`` (the demo models trained on short sentences,
tested on longer ones). Row ``R`` at a scale of size ``S`` trains
``configs/R_S.yaml``.

Layout of a work directory (default ``work/`` in the repository)::

    <work>/<scale>/corpus/              generated (demo scales) or length-filtered corpus
    <work>/<scale>/data/                prepared data: raw/, tok/, bpe/, data-bin/
    <work>/<scale>/<row>/seed<N>/       checkpoints, train.log, command.txt
    <work>/<scale>/<row>/seed<N>/eval/  results.json, run.json (the run's summary)
    <work>/<scale>/<row>/seed<N>/eval-budget/  a converged scale's run at the equal budget
                                        (run.json: the run as it stood there, see UNDER_WAY)

and of a results directory (default ``docs/results/``, committed)::

    <results>/<scale>.md, *.png         the table and plots of a scale
    <results>/runs/<scale>/<row>/seed<N>/   a run's record (finished or UNDER_WAY): run.json,
                                        command.txt, hyps.detok.<tgt>.gz (and
                                        budget.hyps.detok.<tgt>.gz at the equal budget)
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, PathLike
from fairseq_rope.experiments.length_corpus import LengthCorpus

REPO = base.project_dir()
DEFAULT_WORK_DIR = REPO / "work"
DEFAULT_RESULTS_DIR = REPO / "docs" / "results"
#: Under a results directory: the records of runs, by scale, row and seed.
RECORDS = "runs"
RUN_SUMMARY = "run.json"
#: The ``stage`` of a converged scale's run recorded as it stood at its equal budget, before it
#: converged (``eval-budget/run.json``): that score is final once made, so it is recorded at
#: once and a run cut off later (a session's end on a machine that does not persist) keeps it.
#: Such a run counts in the equal-budget tables only; a finished run's summary has no ``stage``.
UNDER_WAY = "under way: scored at the equal budget, not yet converged"
#: A run's evaluations, under its run directory: the table's, and at a converged scale the
#: equal-budget one; and the prefix of their test hypotheses in a record.
EVAL_DIR = "eval"
BUDGET_EVAL_DIR = "eval-budget"
RECORDED_HYPOTHESES = {EVAL_DIR: "", BUDGET_EVAL_DIR: "budget."}


#: Row name → its runs' run.json, in seed order (a run's ``run_dir``: where it was read).
Runs = Dict[str, List[Dict[str, Any]]]


class TableError(FairseqRopeError, ValueError):
    """An unknown row or scale, or a run directory that cannot be read."""


@dataclass(frozen=True)
class Row:
    """A row of the table: a position encoding, and what the paper reports for it."""

    name: str
    title: str
    paper_bleu: Tuple[Tuple[float, str], ...] = ()  # (BLEU on newstest2014, whose run)
    #: An ablation's scales (:data:`ABLATIONS`); a row of :data:`ROWS` is trained at every scale.
    scales: Tuple[str, ...] = ()
    #: The rows an ablation takes apart: it is compared with each, besides :data:`BASELINE`.
    takes_apart: Tuple[str, ...] = ()

    @property
    def paper(self) -> str:
        """The paper's numbers as a table cell ("—" when the paper has no such row)."""
        return " / ".join(f"{bleu} ({who})" for bleu, who in self.paper_bleu) or "—"


@dataclass(frozen=True)
class Scale:
    """Data and model size of a set of runs; its rows train ``configs/<row>_<size>.yaml``.

    ``data`` names the corpus (``demo``, ``wmt14``, ``multi30k``). BLEU is
    reported per source-length bucket (``length_edges``, raw English words) when
    the scale has edges; a length study trains on short sentences only: a
    generated corpus (``length_study``) or the corpus's pairs of at most
    ``max_train_words`` source words.
    """

    name: str
    size: str
    title: str
    paper_comparable: bool
    data: str
    length_study: Optional[LengthCorpus] = None
    length_edges: Tuple[int, ...] = ()
    max_train_words: Optional[int] = None
    #: Another scale whose prepared data this one trains on (the same corpus and vocabulary).
    data_of: Optional[str] = None
    #: A scale trained to convergence (its configs' rule) also scores every run at this
    #: budget: the average of its last 5 checkpoints up to this update.
    equal_budget: Optional[int] = None
    #: The target language (the source is English in every scale).
    tgt: str = "de"

    @property
    def language_pair(self) -> str:
        return f"en-{self.tgt}"

    @property
    def bucket_edges(self) -> Tuple[int, ...]:
        """Upper edges of the source-length buckets of the test set (empty: no buckets)."""
        return tuple(self.length_study.edges) if self.length_study else self.length_edges

    @property
    def max_train_len(self) -> Optional[int]:
        """Longest training source in raw words, for a length study; None otherwise."""
        return self.length_study.max_train_len if self.length_study else self.max_train_words

    @property
    def is_length_study(self) -> bool:
        return self.max_train_len is not None


ROWS: Dict[str, Row] = {row.name: row for row in (
    Row("sinusoidal", "Transformer, sinusoidal positions",
        ((27.3, "Vaswani et al."), (26.5, "Shaw et al."))),
    Row("learned", "Transformer, learned absolute positions"),
    Row("rpe", "Transformer + RPE (Shaw et al. 2018)", ((26.8, "Shaw et al."),)),
    Row("rope", "RoFormer (RoPE)", ((27.5, "Su et al."),)),
    Row("alibi", "Transformer + ALiBi (Press et al. 2022)"),  # beyond the paper (issue 28)
)}

#: The row every other is compared with.
BASELINE = "sinusoidal"

#: Rows trained at the named scales only, each to take a row of :data:`ROWS` apart (issue 66):
#: RoPE on one side (``--rope-sides``), the other side stock, at the equal budget where RoPE's
#: lead is largest; they ask which side carries it.
ABLATIONS: Dict[str, Row] = {row.name: row for row in (
    Row("rope_enc", "RoPE in the encoder only, decoder sinusoidal", scales=("multi30k",),
        takes_apart=("rope",)),
    Row("rope_dec", "RoPE in the decoder only, encoder sinusoidal", scales=("multi30k",),
        takes_apart=("rope",)),
)}

#: Multi30k test2016 buckets (raw English words): 86, 455, 314, 101, 32 and 12 sentences.
MULTI30K_EDGES = (8, 12, 16, 20, 25)
#: The multi30k-length study trains on pairs of at most 12 English words: 62.5 %
#: of the training pairs (18,117 of 29,000), and 54 % of test2016.
MULTI30K_MAX_TRAIN_WORDS = 12

#: The demo scales' synthetic corpus (sentence pairs per split) and BPE vocabulary; ``make demo``
#: (:mod:`fairseq_rope.experiments.demo`) trains on the same.
DEMO_CORPUS = {"train": 20000, "valid": 500, "test": 500}
DEMO_VOCAB_SIZE = 2000

#: The multi30k table's training budget (configs/base/multi30k.yaml, max-update).
MULTI30K_BUDGET = 1791

SCALES: Dict[str, Scale] = {scale.name: scale for scale in (
    Scale("wmt14", "base", "Transformer-base on WMT14 En→De (newstest2014)", paper_comparable=True,
          data="wmt14"),
    Scale("multi30k", "multi30k", "small Transformers (3+3 layers, d=256) on Multi30k En→De, "
          "tested on test2016 (Flickr), CPU", paper_comparable=False, data="multi30k",
          length_edges=MULTI30K_EDGES),
    Scale("multi30k-length", "multi30k",
          f"length extrapolation on real data: the multi30k models trained on the pairs of at most "
          f"{MULTI30K_MAX_TRAIN_WORDS} English words, tested on all of test2016 (CPU)",
          paper_comparable=False, data="multi30k", length_edges=MULTI30K_EDGES,
          max_train_words=MULTI30K_MAX_TRAIN_WORDS),
    Scale("multi30k-converged", "multi30k-converged",
          "the multi30k models trained to convergence (configs/base/multi30k-converged.yaml), "
          "each also scored at the multi30k budget of 1791 updates, tested on test2016 (CPU)",
          paper_comparable=False, data="multi30k", length_edges=MULTI30K_EDGES,
          data_of="multi30k", equal_budget=MULTI30K_BUDGET),
    # The second pair (issue 48): the same English captions translated into French, the same
    # model, BPE rule, budget and convergence rule; only the target language differs.
    Scale("multi30k-fr", "multi30k", "small Transformers (3+3 layers, d=256) on Multi30k En→Fr, "
          "tested on test2016 (Flickr), CPU", paper_comparable=False, data="multi30k",
          length_edges=MULTI30K_EDGES, tgt="fr"),
    Scale("multi30k-fr-converged", "multi30k-fr-converged",
          "the multi30k models trained to convergence on Multi30k En→Fr "
          "(configs/base/multi30k-fr-converged.yaml), each also scored at the multi30k budget of "
          "1791 updates, tested on test2016 (CPU)",
          paper_comparable=False, data="multi30k", length_edges=MULTI30K_EDGES,
          data_of="multi30k-fr", equal_budget=MULTI30K_BUDGET, tgt="fr"),
    Scale("demo", "demo", "tiny models on the synthetic demo corpus (CPU)", paper_comparable=False,
          data="demo"),
    Scale("demo-length", "demo",
          "length extrapolation: tiny models trained on short sentences of the synthetic "
          "demo corpus, tested on longer ones (CPU)",
          paper_comparable=False, data="demo", length_study=LengthCorpus()),
)}


def full_length_scale(scale: Scale) -> Optional[Scale]:
    """The scale whose models a real-data length study trains on short pairs only: same
    corpus, model and test set, all training lengths (None for any other scale)."""
    if scale.max_train_words is None:
        return None
    return next((s for s in SCALES.values() if same_models(s, scale) and not s.is_length_study), None)


def same_models(a: Scale, b: Scale) -> bool:
    """Whether two scales train the same models on the same language pair (a length study and the
    scale it shortens); runs of different pairs are never pooled or compared."""
    return (a.data, a.size, a.tgt) == (b.data, b.size, b.tgt)


def rows_at(scale: Scale) -> Dict[str, Row]:
    """The rows of ``scale``'s table, in order: every row of :data:`ROWS`, then its ablations."""
    return {**ROWS, **{name: row for name, row in ABLATIONS.items() if scale.name in row.scales}}


def get_row(name: str, scale: Optional[Scale] = None) -> Row:
    """The row ``name`` (of ``scale``'s table, when given: an ablation is trained at its scales only)."""
    rows = {**ROWS, **ABLATIONS} if scale is None else rows_at(scale)
    if name not in rows:
        where = "" if scale is None else f" at scale {scale.name}"
        raise TableError(f"unknown row {name!r}{where}; valid rows: {', '.join(rows)}")
    return rows[name]


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
    """Prepared data of a scale (``prepare_parallel.sh``/``prepare_wmt14_en_de.sh`` output),
    shared with the scale it names in ``data_of``."""
    return scale_dir(work_dir, get_scale(scale.data_of) if scale.data_of else scale) / "data"


def run_dir(work_dir: PathLike, scale: Scale, row: Row, seed: int) -> Path:
    """Checkpoints and logs of one run (``scripts/train.sh``'s SAVE_DIR)."""
    return scale_dir(work_dir, scale) / row.name / f"seed{seed}"


def summary_path(run: PathLike) -> Path:
    """``run.json`` of a run directory, beside scripts/evaluate.sh's results.json."""
    return Path(run) / "eval" / RUN_SUMMARY


def budget_summary_path(run: PathLike) -> Path:
    """The ``run.json`` of a converged scale's run as it stood at its equal budget (:data:`UNDER_WAY`)."""
    return Path(run) / BUDGET_EVAL_DIR / RUN_SUMMARY


def newest_summary(run: PathLike) -> Optional[Path]:
    """A run directory's latest summary: ``eval/run.json`` once finished, else the equal-budget
    one once scored (:data:`UNDER_WAY`), else None."""
    return next((path for path in (summary_path(run), budget_summary_path(run)) if path.is_file()), None)


def under_way(run: Mapping[str, Any]) -> bool:
    """Whether a run's summary is of a run not yet converged (:data:`UNDER_WAY`)."""
    return run.get("stage") == UNDER_WAY


def latest_state(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """The furthest a run's summary knows it: a run under way's ``progress`` past its budget
    (:func:`~fairseq_rope.experiments.summary.record_progress`), else the summary itself."""
    return run.get("progress") or run


def trained_to(run: Mapping[str, Any]) -> int:
    """The update a run's summary knows it trained to (:func:`latest_state`)."""
    return latest_state(run)["num_updates"]


def split_under_way(runs: Runs) -> Tuple[Runs, Runs]:
    """(the finished runs, the runs under way), each by row in seed order."""
    return ({name: [r for r in rs if not under_way(r)] for name, rs in runs.items()},
            {name: [r for r in rs if under_way(r)] for name, rs in runs.items()})


def scored_runs(work_dir: PathLike, scale: Scale, records_dir: Optional[PathLike] = None) -> Runs:
    """Every row's runs with a ``run.json`` (:func:`newest_summary`: finished, or at a converged
    scale :data:`UNDER_WAY`), in seed order; ``[]`` for rows not run.

    With ``records_dir``, the runs of ``work_dir`` are first saved as
    records in ``records_dir/<scale>/<row>/seed<N>/`` (see :func:`save_record`),
    replacing older records of the same run, and the table is made from all the
    records: runs whose work directory is gone (another machine, an earlier
    session) stay in it. Each run's ``run_dir`` is then its record.
    """
    runs: Runs = {}
    for name in rows_at(scale):
        found = [(run, _read_run(path, name, scale))
                 for run in (scale_dir(work_dir, scale) / name).glob("seed*")
                 if (path := newest_summary(run)) is not None]
        if records_dir is not None:  # the table is then made from the records, below
            for run, _ in found:
                save_record(run, Path(records_dir) / scale.name / name / run.name)
            continue
        runs[name] = sorted(({**summary, "run_dir": str(run)} for run, summary in found),
                            key=lambda s: s["seed"])
    return runs if records_dir is None else recorded_runs(records_dir, scale)


def recorded_runs(records_dir: PathLike, scale: Scale) -> Runs:
    """Every row's runs recorded in ``records_dir/<scale>/`` (see :func:`scored_runs`), in seed
    order; each run's ``run_dir`` is its record."""
    return {name: sorted(({**_read_run(path, name, scale), "run_dir": str(path.parent)}
                          for path in (Path(records_dir) / scale.name / name).glob(f"seed*/{RUN_SUMMARY}")),
                         key=lambda s: s["seed"])
            for name in rows_at(scale)}


def shown_path(path: PathLike) -> str:
    """A path relative to the repository (the tables are committed) or else to the working
    directory (a worktree of it) when inside one, else absolute."""
    path = Path(path).resolve()
    for root in (REPO, Path.cwd().resolve()):
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)


def save_record(run: Path, record: Path) -> None:
    """What a table needs of a run, kept apart from its checkpoints: its newest ``run.json``,
    ``command.txt`` and the detokenized test hypotheses (gzipped) for significance tests.
    A finished record is never replaced by the same run's record under way, nor a record under
    way by one that has trained less far (the run started again on a fresh machine: the record
    keeps the further trajectory whole, its budget scores and validations from one run; on
    another CPU a restart's floating point, and so its scores, differ slightly)."""
    summary = newest_summary(run)
    kept = record / RUN_SUMMARY
    if summary == budget_summary_path(run) and kept.is_file():
        theirs = _read_summary(kept)
        if not under_way(theirs) or trained_to(theirs) > trained_to(_read_summary(summary)):
            return
    record.mkdir(parents=True, exist_ok=True)
    for source in (summary, run / "command.txt"):
        if source is not None and source.is_file():
            base.write_text(record / source.name, source.read_text(encoding="utf-8"))
    for evaluation, prefix in RECORDED_HYPOTHESES.items():
        for hyps in (run / evaluation).glob("hyps.detok.*"):
            with base.atomic_path(record / f"{prefix}{hyps.name}.gz") as tmp:
                # No name and mtime 0 in the header: the same hypotheses give the same
                # bytes (the temporary file's name would differ each time), so git sees no change.
                with open(hyps, "rb") as src, open(tmp, "wb") as raw, \
                        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as dst:
                    shutil.copyfileobj(src, dst)


def record_hypotheses(run: Mapping[str, Any]) -> Optional[List[str]]:
    """A run's detokenized test hypotheses, from its record or its evaluation; None if neither has
    them. ``run["evaluation"]`` names the evaluation (default ``eval``; :func:`at_equal_budget`)."""
    run_dir = Path(run["run_dir"])
    evaluation = run.get("evaluation", EVAL_DIR)
    for path in sorted(run_dir.glob(f"{RECORDED_HYPOTHESES[evaluation]}hyps.detok.*.gz")):
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
            return f.read().splitlines()
    for path in sorted((run_dir / evaluation).glob("hyps.detok.*")):
        return path.read_text(encoding="utf-8").splitlines()
    return None


def at_equal_budget(run: Mapping[str, Any]) -> Dict[str, Any]:
    """A run of a converged scale as it scored at the equal budget: its ``equal_budget`` scores in
    place of the converged ones, so that every table of runs applies unchanged (its wall time:
    the training time to the budget where recorded, else none, never the whole run's)."""
    budget = run["equal_budget"]
    at_budget = {**run, **budget, "num_updates": budget["updates"],
                 "train_wall_seconds": budget.get("train_wall_seconds"), "evaluation": BUDGET_EVAL_DIR}
    at_budget.pop("updates_at_convergence", None)
    return at_budget


#: The language pair of records made before runs recorded theirs (2026-11-27): all English→German.
UNRECORDED_LANGUAGE_PAIR = "en-de"


def _read_run(path: Path, name: str, scale: Scale) -> Dict[str, Any]:
    summary = _read_summary(path)
    if (summary.get("row"), summary.get("scale")) != (name, scale.name):
        raise TableError(f"{path} is a run of row {summary.get('row')!r} at scale "
                         f"{summary.get('scale')!r}, but lies in {name}/ of {scale.name}")
    pair = summary.get("language_pair", UNRECORDED_LANGUAGE_PAIR)
    if pair != scale.language_pair:  # a table never pools language pairs
        raise TableError(f"{path} is a run on {pair}, but scale {scale.name} is {scale.language_pair}: "
                         "runs of different language pairs are never pooled")
    return summary


def _read_summary(path: Path) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise TableError(f"cannot read run summary {path}: {e}") from e
