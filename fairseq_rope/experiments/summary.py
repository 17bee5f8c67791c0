"""A run's summary, ``eval/run.json``: what the table knows of a run (and, at a converged
scale, ``eval-budget/run.json``: the run as it stood at its equal budget, :func:`summarize_budget`,
and how far it has trained since, :func:`record_progress`).

Written by :func:`summarize_run` from the run's training log, its ``command.txt``, its
evaluations' ``results.json`` and the averaged checkpoint, after each step of
:mod:`fairseq_rope.experiments.reproduce`; read by :mod:`fairseq_rope.experiments.collect`.
"""

from __future__ import annotations

import datetime
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.checkpoints import load_checkpoint
from fairseq_rope.data.prepare.pipeline import sha256_file
from fairseq_rope.evaluation.averaging import tied_aliases
from fairseq_rope.experiments.command import option_value, read_command
from fairseq_rope.experiments.table import (
    BUDGET_EVAL_DIR,
    EVAL_DIR,
    UNDER_WAY,
    Row,
    Scale,
    budget_summary_path,
    summary_path,
)
from fairseq_rope.experiments.train_log import PROVENANCE_KEYS, TrainLog, logged_provenance, read_train_log

# State-dict entries that are buffers, not parameters (fairseq's version
# counters, the sinusoidal embeddings' device/dtype marker).
BUFFER_NAMES = ("version", "_float_tensor")


def count_parameters(model_state: Mapping[str, Any]) -> int:
    """Elements of a checkpoint's model state: tied tensors once, buffers excluded."""
    aliases = tied_aliases(model_state)
    return sum(
        value.numel() for key, value in model_state.items()
        if key not in aliases and hasattr(value, "numel")
        and key.rsplit(".", 1)[-1] not in BUFFER_NAMES
    )


def summarize_run(
    row: Row, scale: Scale, seed: int, save_dir: Path, config: Path, command_line: str,
    extra: Sequence[str] = (), timer_seconds: Optional[float] = None,
    length: Optional[Dict[str, Any]] = None, convergence: Optional[Mapping[str, Any]] = None,
    budget_length: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The run's ``run.json`` (written atomically) from its log, results and averaged checkpoint.

    What it trained with comes from its log (:func:`logged_provenance`); a run whose log
    recorded none keeps what an earlier ``run.json`` of it says. A run of a converged scale
    (``convergence``: :func:`convergence_of`) also gets its valid BLEU curve and,
    under ``equal_budget``, the scores and training time of its ``eval-budget/`` evaluation.
    Its ``date`` is when the test set was scored (the evaluation's own), so re-recording a
    finished cell (rerunning its command) keeps it.
    """
    results = _read_json(save_dir / EVAL_DIR / "results.json")
    log = read_train_log(save_dir)
    checkpoint = load_checkpoint(results["checkpoint"])
    summary = {
        **_identity(row, scale, seed, save_dir, config, extra, checkpoint["model"], log, summary_path(save_dir)),
        **_speed(log),
        **_wall_time(checkpoint, log, timer_seconds),
        "num_updates": log.num_updates,
        **_scores(results),
        "valid_loss": _curve(log.valid_loss),
        "reproduce_command": command_line,
        "date": _date(results),
    }
    if length is not None:
        summary["bleu_by_length"] = length
    if convergence is not None:
        summary.update({
            "valid_bleu": _curve(log.valid_bleu),
            "convergence": dict(convergence),
            "updates_at_convergence": convergence["update"],
            "equal_budget": _equal_budget(scale, *_evaluation(save_dir / BUDGET_EVAL_DIR), log, budget_length),
        })
    base.write_json(summary_path(save_dir), summary)
    return summary


def summarize_budget(
    row: Row, scale: Scale, seed: int, save_dir: Path, config: Path, command_line: str,
    extra: Sequence[str] = (), budget_length: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """``eval-budget/run.json`` of a converged scale's run, written once its equal budget is
    scored and before it trains on: the run as it stood at the budget (:data:`UNDER_WAY`), its
    curves cut there, with the ``equal_budget`` entry its finished ``run.json`` will repeat."""
    budget = scale.equal_budget
    assert budget is not None, f"scale {scale.name} has no equal budget"
    results, checkpoint = _evaluation(save_dir / BUDGET_EVAL_DIR)
    log = read_train_log(save_dir)
    summary = {
        **_identity(row, scale, seed, save_dir, config, extra, checkpoint["model"], log,
                    budget_summary_path(save_dir)),
        "stage": UNDER_WAY,
        "num_updates": budget,
        "valid_loss": _curve(log.valid_loss, budget),
        "valid_bleu": _curve(log.valid_bleu, budget),
        "equal_budget": _equal_budget(scale, results, checkpoint, log, budget_length),
        "reproduce_command": command_line,
        "date": _date(results),
    }
    base.write_json(budget_summary_path(save_dir), summary)
    return summary


def record_progress(save_dir: Path) -> Optional[Dict[str, Any]]:
    """Add to the ``eval-budget/run.json`` of a run still under way (:data:`UNDER_WAY`) how far it
    has trained since: under ``progress``, its last logged update and every validation to date,
    read from its log (``collect`` does this before it records the run). Which update a run first
    reached a valid BLEU at is final once seen, so a run cut off before it converges (a session's
    end on a machine that does not keep its files) keeps what it showed of its convergence speed.
    Returns the progress written, or None for a run that is finished or not yet past its budget."""
    path = budget_summary_path(save_dir)
    if summary_path(save_dir).is_file() or not path.is_file():
        return None
    summary = _read_json(path)
    log = read_train_log(save_dir)
    if log.num_updates is None or log.num_updates <= summary["num_updates"]:
        return None
    summary["progress"] = {
        "num_updates": log.num_updates,
        "valid_bleu": _curve(log.valid_bleu),
        "valid_loss": _curve(log.valid_loss),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    base.write_json(path, summary)
    return summary["progress"]


def _identity(row: Row, scale: Scale, seed: int, save_dir: Path, config: Path, extra: Sequence[str],
              model_state: Mapping[str, Any], log: TrainLog, previous: Path) -> Dict[str, Any]:
    """What a run is and what it trained with, whatever stage it is recorded at (``previous``: the
    summary it replaces, whose provenance it keeps where the log recorded none)."""
    _, command = read_command(save_dir)
    provenance = logged_provenance(log)
    if not provenance["train_invocations_recorded"] and previous.is_file():
        earlier = _read_json(previous)
        provenance.update({key: earlier.get(key) for key in PROVENANCE_KEYS if provenance[key] is None})
    return {
        "row": row.name,
        "scale": scale.name,
        "language_pair": scale.language_pair,
        "seed": seed,
        "config": config.stem,
        "config_path": str(config),
        "arch": option_value(command, "arch"),
        "extra_train_args": list(extra),
        "parameters": count_parameters(model_state),
        **provenance,
    }


def _evaluation(eval_dir: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """An evaluation's results.json and the averaged checkpoint it scored."""
    results = _read_json(eval_dir / "results.json")
    return results, load_checkpoint(results["checkpoint"])


def _equal_budget(scale: Scale, results: Mapping[str, Any], checkpoint: Mapping[str, Any], log: TrainLog,
                  budget_length: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The scores, training time and speed of a run's ``eval-budget/`` evaluation."""
    return {"updates": scale.equal_budget, **_scores(results),
            "train_wall_seconds": _cumulative_training_time(checkpoint),
            **_speed(log, upto=scale.equal_budget),
            **({"bleu_by_length": budget_length} if budget_length is not None else {})}


def _curve(by_update: Mapping[int, float], upto: Optional[int] = None) -> List[List[Any]]:
    """``[[update, value], ...]`` in update order (to ``upto``)."""
    return [[u, v] for u, v in sorted(by_update.items()) if upto is None or u <= upto]


def _date(results: Mapping[str, Any]) -> str:
    """When an evaluation scored the test set (now, for results that did not say)."""
    return results.get("date") or datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _scores(results: Mapping[str, Any]) -> Dict[str, Any]:
    """What run.json keeps of an evaluation's results.json."""
    return {
        "bleu_tokenized": results["bleu_tokenized"],
        "sacrebleu": results.get("sacrebleu"),
        "bleu_tokenized_signature": results.get("bleu_tokenized_signature"),
        "sacrebleu_signature": results.get("sacrebleu_signature"),
        "chrf": results.get("chrf"),
        "chrf_signature": results.get("chrf_signature"),
        "runaways": results.get("runaways"),
        "num_test_sentences": results.get("num_sentences"),
        "raw_reference": results.get("raw_reference"),
        "raw_reference_sha256": _sha256(results.get("raw_reference")),
        "checkpoint": results["checkpoint"],
    }


def _sha256(path: Optional[str]) -> Optional[str]:
    return sha256_file(Path(path)) if path and Path(path).is_file() else None


#: How a record's tokens/s was averaged; records without it (made before 2026-11-26) took every epoch.
FULL_EPOCHS = "full epochs: those of at least half the updates of the longest"


def _speed(log: TrainLog, upto: Optional[int] = None) -> Dict[str, Any]:
    """Mean of the full epochs' wps (to update ``upto``), and the slowest and fastest of them:
    far apart when the CPU was shared part of the time or the run resumed on other hardware."""
    wps = log.full_epoch_wps(upto)
    return {"train_tokens_per_second": statistics.fmean(wps) if wps else None,
            "train_tokens_per_second_range": [min(wps), max(wps)] if wps else None,
            "train_tokens_per_second_epochs": FULL_EPOCHS}


def _cumulative_training_time(checkpoint: Mapping[str, Any]) -> Optional[float]:
    """fairseq's training time up to ``checkpoint`` (an averaged one keeps the newest's): it saves
    it in every checkpoint and carries it across resumes, so it counts every invocation that led
    to it, validation included, and none of the time an interrupted one lost after its last save."""
    seconds = (checkpoint.get("extra_state") or {}).get("previous_training_time")
    return None if seconds is None else float(seconds)


def _wall_time(checkpoint: Mapping[str, Any], log: TrainLog, timer_seconds: Optional[float]) -> Dict[str, Any]:
    seconds = _cumulative_training_time(checkpoint)
    if seconds is not None:
        return {"train_wall_seconds": seconds,
                "train_wall_source": "fairseq's training time saved in the newest averaged checkpoint "
                                     "(previous_training_time, carried across resumes)"}
    if log.training_seconds:
        return {"train_wall_seconds": sum(log.training_seconds),
                "train_wall_source": "sum of fairseq-train's 'done training in' over "
                                     f"{len(log.training_seconds)} invocation(s)"}
    return {"train_wall_seconds": timer_seconds, "train_wall_source": "timer around train.sh"}


def _read_json(path: Path) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
