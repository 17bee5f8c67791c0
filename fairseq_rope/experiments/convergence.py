"""When a run has converged, read from its validation BLEU curve.

A scale trained to convergence (``multi30k-converged``) stops each run by one
rule, declared in its config with fairseq's own options:

- ``--eval-bleu`` scores every validated checkpoint on ``valid``, and
  ``--best-checkpoint-metric bleu --maximize-best-checkpoint-metric`` makes a
  higher BLEU a better checkpoint;
- ``--patience P``: converged at the ``P``-th validation in a row that does not
  beat the best valid BLEU so far (strictly; fairseq's ``should_stop_early``);
- ``--max-update N``: the cap, reached first by a run still improving.

fairseq applies the rule while training but forgets its patience count when a
run resumes (``should_stop_early`` keeps it in a function attribute, not in the
checkpoint), so a resumed run would train past the point the rule gives. So the
rule is applied to the validations in the training log (:func:`converged_at`),
which are the same whether or not the run was interrupted: by ``train.sh``,
which stops fairseq-train there once that checkpoint is saved
(:class:`StopAtConvergence`), and by the
tables, which average the last checkpoints up to that update (the config keeps
enough of them, ``keep-interval-updates`` ≥ patience + 5, for runs trained
past it by other means).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from fairseq_rope.experiments.command import last_value, option_value, parse_command
from fairseq_rope.experiments.train_log import LOG_FILE, SAVED_CHECKPOINT, TrainLog, parse_train_log, read_train_log

#: Validation BLEU by update: {num_updates: valid BLEU}.
Curve = Mapping[int, float]


@dataclass(frozen=True)
class Rule:
    """A convergence rule: ``patience`` validations without a new best (0: none), capped at ``max_update``."""

    patience: int
    max_update: int

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> "Rule":
        """The rule of fairseq-train arguments, read as train.sh reads them (argparse: the last
        occurrence wins; fairseq's defaults: no patience, no cap, which never converges)."""
        _, options = parse_command(argv)
        patience, cap = last_value(options, "patience"), last_value(options, "max-update")
        return cls(patience=max(int(patience), 0) if patience else 0, max_update=int(cap) if cap else 0)


@dataclass(frozen=True)
class Convergence:
    """Where the rule stops a run: ``update`` (the last validation it trains to), why (``patience``
    or ``cap``), and its best single-checkpoint valid BLEU and where that was reached."""

    update: int
    reason: str
    best_update: int
    best_bleu: float

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def converged_at(curve: Curve, rule: Rule) -> Optional[Convergence]:
    """Where ``rule`` stops a run with validations ``curve``; None while it would still train.

    Walks the validations in update order as fairseq's ``should_stop_early`` does (a tie is no
    improvement). The cap counts only when a validation reached it: fairseq validates at
    ``--max-update`` whatever the interval.
    """
    best: Optional[float] = None
    best_update = since_best = 0
    for update in sorted(curve):
        bleu = curve[update]
        if best is None or bleu > best:
            best, best_update, since_best = bleu, update, 0
        else:
            since_best += 1
        if rule.patience > 0 and since_best >= rule.patience:
            return Convergence(update, "patience", best_update, best)
        if rule.max_update > 0 and update >= rule.max_update:
            return Convergence(update, "cap", best_update, best)
    return None


def convergence_record(argv: Sequence[str], curve: Curve) -> Optional[Dict[str, Any]]:
    """What a run's record keeps of where the rule of its fairseq-train arguments ``argv`` stopped
    it, validations ``curve``: the rule, the validation interval and :class:`Convergence`; None
    while the rule would still train it."""
    rule = Rule.from_argv(argv)
    converged = converged_at(curve, rule)
    if converged is None:
        return None
    return {"patience": rule.patience, "max_update": rule.max_update,
            "validate_interval_updates": option_value(argv, "validate-interval-updates"), **converged.to_json()}


def updates_to_reach(curve: Curve, target: float) -> Optional[int]:
    """The first validated update whose valid BLEU is at least ``target`` (None: never)."""
    return next((update for update in sorted(curve) if curve[update] >= target), None)


class StopAtConvergence:
    """Where a run's convergence rule (``--patience``, :mod:`~fairseq_rope.experiments.convergence`)
    stops it, over the validations of all its invocations.

    fairseq applies ``--patience`` from its own start only, so a resumed run would train past the
    point where the rule stops it, and could delete checkpoints the averaging up to that point
    needs. train.sh therefore stops fairseq-train itself once the rule is met and the checkpoint
    of that validation is saved, and does not start it for a run the rule has already stopped.
    """

    def __init__(self, argv: Sequence[str], earlier: TrainLog):
        self.rule = Rule.from_argv(argv)
        self.curve = dict(earlier.valid_bleu)
        # The rule judges valid BLEU, higher is better: fairseq's patience on any other metric
        # (valid loss by default) is left to fairseq.
        _, options = parse_command(argv)
        self.on_bleu = last_value(options, "best-checkpoint-metric") == "bleu" and \
            "maximize-best-checkpoint-metric" in options

    @classmethod
    def of_run(cls, save_dir: Path, argv: Sequence[str]) -> "StopAtConvergence":
        log = save_dir / LOG_FILE
        return cls(argv, read_train_log(save_dir) if log.is_file() else TrainLog())

    def converged(self) -> Optional[Convergence]:
        return converged_at(self.curve, self.rule) if self.rule.patience > 0 and self.on_bleu else None

    def after(self, line: str) -> Optional[Convergence]:
        """The convergence to stop at, once fairseq's next ``line`` says its checkpoint is saved."""
        self.curve.update(parse_train_log([line]).valid_bleu)
        saved = SAVED_CHECKPOINT.search(line)
        converged = self.converged() if saved is not None else None
        return converged if converged is not None and int(saved.group(1)) >= converged.update else None


def describe(converged: Convergence, rule: Rule) -> str:
    return (f"converged at update {converged.update} by its rule (--patience {rule.patience}, "
            f"--max-update {rule.max_update}: {converged.reason}; best valid BLEU "
            f"{converged.best_bleu:.2f} at {converged.best_update})")
