"""Paired bootstrap resampling of one system against a baseline, with sacrebleu.

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

from typing import Any, Dict, Sequence

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

N_SAMPLES = 1000


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
