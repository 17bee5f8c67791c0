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
(:class:`~fairseq_rope.experiments.training.StopAtConvergence`), and by the
tables, which average the last checkpoints up to that update (the config keeps
enough of them, ``keep-interval-updates`` ≥ patience + 5, for runs trained
past it by other means).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

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
        from fairseq_rope.experiments.training import parse_command

        _, options = parse_command(argv)
        patience, cap = options.get("patience"), options.get("max-update")
        return cls(patience=max(int(patience[-1]), 0) if patience else 0,
                   max_update=int(cap[-1]) if cap else 0)


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


def updates_to_reach(curve: Curve, target: float) -> Optional[int]:
    """The first validated update whose valid BLEU is at least ``target`` (None: never)."""
    return next((update for update in sorted(curve) if curve[update] >= target), None)
