"""Which of the model's two languages a text is in, for ``POST /detect`` and ``source: "auto"``.

LibreTranslate detects with CLD2 (pycld2) and lingua among the languages it has loaded, and
answers ``[{"confidence": 0–100, "language": code}]``, best first. A server of one model has two
languages, so the candidates here are those two: CLD2's share of the text in each (its
percentages, best effort for short texts), best first, the ones it did not find left out. When
it finds neither (another language, digits, a word too short to tell), the answer is the
model's source language with confidence 0: what the model can translate, said to be a guess.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import pycld2


def detect_languages(text: str, languages: Sequence[str]) -> List[Dict[str, object]]:
    """``[{"confidence", "language"}]`` of ``text`` among ``languages`` (the first: the fallback), best first."""
    try:
        _, _, details = pycld2.detect(text, bestEffort=True)
    except pycld2.error:  # text CLD2 cannot read (lone surrogates, control bytes)
        details = ()
    found: Dict[str, float] = {}
    for _name, code, percent, _score in details:
        code = _language(code)
        if code in languages and percent > 0:
            found[code] = found.get(code, 0.0) + float(percent)
    if not found:
        return [{"confidence": 0.0, "language": languages[0]}]
    return [{"confidence": confidence, "language": code}
            for code, confidence in sorted(found.items(), key=lambda item: -item[1])]


def _language(code: str) -> str:
    """CLD2's code as the model directory names a language (``zh-Hant`` → ``zh``)."""
    return code.split("-")[0].lower()
