"""Is one system better than a baseline? Over test sentences (sacrebleu's paired bootstrap)
and over training seeds (a paired t-test on the seeds' scores, with scipy).

The bootstrap answers for the sampling of the test set only: two trainings that differ in
their seed alone differ too, and a difference within that spread is seed noise. Hence
:func:`seed_difference`: the score differences of the runs of equal seed, their mean, its
95 % confidence interval (t distribution, n − 1 degrees of freedom) and the paired t-test's
two-sided p-value. It needs two seed pairs at least, and differences that are not all equal.

sacrebleu's ``PairedTest`` with ``test_type="bs"`` is ``sacrebleu --paired-bs``
(Koehn 2004; the Moses script ``bootstrap-hypothesis-difference-significance.pl``):
1000 resamples of the test set's sentences, sacrebleu's fixed seed
(``SACREBLEU_SEED``, default 12345), p-value of the observed score difference
under the null hypothesis that the systems are equally good. It runs on
detokenized hypotheses and raw references, for sacreBLEU and chrF.

One exception: a system whose hypotheses are the baseline's, word for word, gets p = 1.
sacrebleu (after multeval) counts the resamples whose difference *exceeds* the observed
one, so a system tested against itself would get its smallest p, 1/(n+1), as if
significant; with nothing different there is nothing to test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from scipy import stats
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

N_SAMPLES = 1000
#: The confidence of the interval of a mean difference over seeds.
CONFIDENCE = 0.95


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str],
                     references: Sequence[str], n_samples: int = N_SAMPLES) -> Dict[str, Dict[str, Any]]:
    """Per metric (``BLEU``, ``chrF2``): both scores, the system's p-value and the test's signature."""
    if not len(baseline) == len(system) == len(references):
        raise ValueError(f"paired test of {len(system)} hypotheses against {len(baseline)} baseline "
                         f"hypotheses and {len(references)} references: the counts must be equal")
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": BLEU(), "chrF": CHRF()}, [list(references)],
                      test_type="bs", n_samples=n_samples)
    signatures, scores = test()
    identical = list(system) == list(baseline)
    return {
        metric: {"baseline": results[0].score, "system": results[1].score,
                 "p_value": 1.0 if identical else results[1].p_value, "signature": str(signatures[metric])}
        for metric, results in scores.items() if metric != "System"
    }


@dataclass(frozen=True)
class SeedDifference:
    """System minus baseline over seed pairs: each pair's difference, in the order given, and
    (with two pairs or more) their mean, its confidence interval and the paired t-test's p;
    ``why`` says why there is no test where there is none."""

    differences: Tuple[float, ...]
    mean: float
    interval: Optional[Tuple[float, float]]
    p_value: Optional[float]
    why: str = ""


def seed_difference(baseline: Sequence[float], system: Sequence[float]) -> SeedDifference:
    """Paired t-test of ``system`` against ``baseline``, one score of each per training seed,
    in the same seed order."""
    if len(baseline) != len(system) or not system:
        raise ValueError(f"{len(system)} system scores against {len(baseline)} baseline scores: "
                         "one of each per seed, at least one seed")
    differences = tuple(s - b for b, s in zip(baseline, system))
    mean = math.fsum(differences) / len(differences)
    if len(differences) < 2:
        return SeedDifference(differences, mean, None, None, "one seed pair: no spread over seeds")
    if max(differences) == min(differences):
        return SeedDifference(differences, mean, None, None, "every seed pair differs by the same amount")
    test = stats.ttest_rel(system, baseline)
    interval = test.confidence_interval(CONFIDENCE)
    return SeedDifference(differences, mean, (float(interval.low), float(interval.high)), float(test.pvalue))
