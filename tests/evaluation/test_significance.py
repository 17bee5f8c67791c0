"""The paired t-test over training seeds against the t distribution in closed form.

With 2 seed pairs (1 degree of freedom) Student's t is the Cauchy distribution, and with 3
(2 degrees of freedom) its distribution function is t / (2 sqrt(2 + t²)) + 1/2: both give the
two-sided p-value and the 97.5 % quantile of the interval exactly, without scipy.
"""

from __future__ import annotations

import math
import statistics

import pytest

from fairseq_rope.evaluation.significance import seed_difference
from fairseq_rope.evaluation.significance_tables import seed_table


def t_statistic(differences):
    return statistics.fmean(differences) / (statistics.stdev(differences) / math.sqrt(len(differences)))


def closed_form(differences):
    """(p, half-width of the 95 % interval) for 2 or 3 seed pairs."""
    t, q = abs(t_statistic(differences)), 0.975
    if len(differences) == 2:  # Cauchy
        p, quantile = 1 - 2 / math.pi * math.atan(t), math.tan(math.pi * (q - 0.5))
    else:  # 2 degrees of freedom
        p, quantile = 1 - t / math.sqrt(2 + t * t), (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    return p, quantile * statistics.stdev(differences) / math.sqrt(len(differences))


@pytest.mark.parametrize("baseline, system", [
    ([38.26, 38.81, 38.87], [39.18, 38.59, 39.02]),  # the converged sacreBLEU of issue 46: p ≈ 0.49
    ([35.36, 35.69, 35.67], [36.73, 36.76, 37.52]),  # its equal budget: p ≈ 0.02
    ([30.0, 31.0], [30.5, 32.5]),
    ([30.0, 31.0], [29.0, 30.5]),  # the system behind
])
def test_seed_difference_is_the_paired_t_test(baseline, system):
    differences = [s - b for b, s in zip(baseline, system)]
    result = seed_difference(baseline, system)
    p, half = closed_form(differences)
    assert result.differences == pytest.approx(differences, abs=1e-12)
    assert result.mean == pytest.approx(statistics.fmean(differences), abs=1e-12)
    assert result.p_value == pytest.approx(p, abs=1e-9)
    assert result.interval == pytest.approx((result.mean - half, result.mean + half), abs=1e-9)


def test_the_issue_numbers():
    """Issue 46's independent rescoring: converged sacreBLEU p ≈ 0.49, equal budget p ≈ 0.02."""
    assert seed_difference([38.26, 38.81, 38.87], [39.18, 38.59, 39.02]).p_value == pytest.approx(0.49, abs=0.01)
    assert seed_difference([35.36, 35.69, 35.67], [36.73, 36.76, 37.52]).p_value == pytest.approx(0.02, abs=0.01)


def test_no_test_without_a_spread():
    one = seed_difference([30.0], [31.0])
    assert (one.mean, one.interval, one.p_value, one.why) == (1.0, None, None, "one seed pair: no spread over seeds")
    same = seed_difference([30.0, 31.0], [31.0, 32.0])
    assert same.p_value is None and same.why == "every seed pair differs by the same amount"
    with pytest.raises(ValueError, match="one of each per seed"):
        seed_difference([30.0, 31.0], [31.0])


def run(seed, sacrebleu, chrf):
    return {"seed": seed, "sacrebleu": sacrebleu, "chrf": chrf}


def test_the_seed_table():
    rows = {
        "rope": [(run(1, 31.0, 60.0), run(1, 30.0, 59.0)), (run(2, 30.5, None), run(2, 30.0, 59.5)),
                 (run(3, 32.0, 61.0), run(3, 31.0, 60.0))],
        "rpe": [(run(1, 30.5, 59.5), run(1, 30.0, 59.0))],
        "alibi": [],
    }
    lines = {line.split(" | ")[0][2:]: line.split(" | ") for line in seed_table(rows, "sinusoidal")
             if line.startswith("| ") and not line.startswith("| row")}
    rope = lines["rope"]
    assert rope[1:3] == ["1, 2, 3", "+1.00, +0.50, +1.00"]
    p, half = closed_form([1.0, 0.5, 1.0])
    mean = 2.5 / 3
    assert rope[3] == f"+{mean:.2f} [{mean - half:+.2f}, {mean + half:+.2f}]" and rope[4] == f"{p:.3f} *"  # p < 0.05
    # chrF: seed 2 did not measure it; seeds 1 and 3 differ by the same amount.
    assert rope[5:8] == ["+1.00, —, +1.00", "— (every seed pair differs by the same amount)", "— |"]
    assert lines["rpe"][3] == "— (one seed pair: no spread over seeds)"
    assert lines["alibi"][1] == "not run"
