"""The convergence rule of the converged scales, against fairseq's own early stopping."""

from __future__ import annotations

import random
from argparse import Namespace
from typing import Dict, Optional

import pytest
from fairseq_cli import train as fairseq_train

from fairseq_rope.experiments.table import ROWS
from fairseq_rope.experiments.config import load_experiment
from fairseq_rope.experiments.convergence import Convergence, Rule, converged_at, updates_to_reach

INTERVAL = 199


def fairseq_stop(curve: Dict[int, float], patience: int, max_update: int) -> Optional[int]:
    """The update at which fairseq-train stops an uninterrupted run validating ``curve``: its
    ``should_stop_early`` after each validation (maximizing BLEU), and ``--max-update``."""
    cfg = Namespace(checkpoint=Namespace(patience=patience, maximize_best_checkpoint_metric=True))
    for name in ("best", "num_runs"):  # fairseq keeps its state on the function: a new run
        if hasattr(fairseq_train.should_stop_early, name):
            delattr(fairseq_train.should_stop_early, name)
    for update in sorted(curve):
        if fairseq_train.should_stop_early(cfg, curve[update]) or update >= max_update:
            return update
    return None


def noisy_curve(seed: int, validations: int = 40) -> Dict[int, float]:
    """Rising then flat valid BLEU with noise, rounded as fairseq logs it (ties happen)."""
    rng = random.Random(seed)
    return {INTERVAL * k: round(38 * (1 - 0.93 ** k) + rng.gauss(0, 0.3), 2) for k in range(1, validations + 1)}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("patience", [1, 3, 6])
def test_the_rule_stops_where_fairseq_stops(seed, patience):
    curve = noisy_curve(seed)
    cap = INTERVAL * 30
    found = converged_at(curve, Rule(patience, cap))
    assert found is not None and found.update == fairseq_stop(curve, patience, cap)
    assert found.best_bleu == max(b for u, b in curve.items() if u <= found.update)
    # The best is the first update reaching it: a tie is no improvement.
    assert found.best_update == min(u for u, b in curve.items() if b == found.best_bleu)
    assert found.reason == ("cap" if found.update == cap and found.update - found.best_update < patience * INTERVAL
                            else "patience")


def test_patience_counts_validations_since_the_best_and_ties_do_not_improve():
    curve = {199: 10.0, 398: 12.0, 597: 12.0, 796: 11.0, 995: 12.5, 1194: 12.5, 1393: 12.4, 1592: 12.0}
    assert converged_at(curve, Rule(2, 10_000)) == Convergence(796, "patience", 398, 12.0)
    assert converged_at(curve, Rule(3, 10_000)) == Convergence(1592, "patience", 995, 12.5)
    assert converged_at(curve, Rule(4, 10_000)) is None  # still training
    assert converged_at(curve, Rule(4, 1592)) == Convergence(1592, "cap", 995, 12.5)
    assert converged_at(curve, Rule(0, 10_000)) is None  # no patience, no cap reached
    assert converged_at({}, Rule(3, 199)) is None


def test_the_rule_on_a_resumed_log_is_the_uninterrupted_one():
    """fairseq forgets its patience count on resume and trains on; the log's validations still
    give the point where the uninterrupted run stopped."""
    curve = noisy_curve(3, validations=80)
    uninterrupted = fairseq_stop(curve, 3, 10_000)
    assert uninterrupted is not None and uninterrupted < max(curve)
    assert converged_at(curve, Rule(3, 10_000)).update == uninterrupted  # curve goes on past it


def test_updates_to_reach():
    curve = {199: 10.0, 398: 20.0, 597: 19.0, 796: 30.0}
    assert updates_to_reach(curve, 19.5) == 398
    assert updates_to_reach(curve, 20.0) == 398
    assert updates_to_reach(curve, 30.01) is None
    assert updates_to_reach({796: 30.0, 199: 10.0}, 5.0) == 199  # in update order


def test_rule_from_arguments_last_occurrence_wins():
    assert Rule.from_argv(["--patience", "4", "--max-update", "5970", "--max-update", "1791"]) == Rule(4, 1791)
    assert Rule.from_argv(["--lr", "1e-3"]) == Rule(0, 0)  # fairseq's defaults: patience -1, no cap
    assert Rule.from_argv(["--patience", "-1"]) == Rule(0, 0)


def test_the_converged_configs_declare_a_rule():
    for row in ROWS:
        rule = Rule.from_argv(load_experiment(f"{row}_multi30k-converged").argv())
        assert rule.patience > 0 and rule.max_update % INTERVAL == 0
