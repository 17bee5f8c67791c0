"""What a request asks for, checked field by field as LibreTranslate reads them; a
:class:`RequestError` (status and the client's message) for anything else."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

AUTO = "auto"


class RequestError(Exception):
    """A request refused: its HTTP status and the message the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class TranslateQuery:
    """A ``/translate`` request: ``q`` as a list (``is_list``: as the client sent it),
    ``source`` the model's source language or ``auto``, and what the answer holds."""

    texts: List[str]
    is_list: bool
    source: str
    html: bool
    alternatives: int


def check_key(given: Any, key: Optional[str]) -> None:
    """403 unless the server has no key or ``given`` is it (compared in constant time); an
    empty or null ``api_key`` is no key, as LibreTranslate's clients send when they have none."""
    if key is not None and not (isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())):
        raise RequestError(403, "invalid or missing API key (api_key)")


def translate_query(fields: Dict[str, Any], pair: Tuple[str, str], max_alternatives: int) -> TranslateQuery:
    """The ``/translate`` request in ``fields``, once its types, its text, the language pair
    and its options are checked."""
    for name in ("q", "source", "target"):
        if name not in fields:
            raise RequestError(400, f"{name} is required")
    q = _text(fields["q"])
    for name in ("source", "target", "format"):
        if name in fields and fields[name] is not None and not isinstance(fields[name], str):
            raise RequestError(400, f"{name} must be a string")
    text_format = fields.get("format") or "text"  # absent, null or "": text, as LibreTranslate
    if text_format not in ("text", "html"):
        raise RequestError(400, f"format {text_format!r} is not supported: text or html")
    source, target = fields["source"], fields["target"]
    if source not in (pair[0], AUTO) or target != pair[1]:
        raise RequestError(400, f"this server translates {pair[0]} to {pair[1]}, "
                                f"not {source} to {target} (GET /languages)")
    texts = [q] if isinstance(q, str) else q
    if not any(t.strip() for t in texts):
        raise RequestError(400, "q is empty: nothing to translate")
    return TranslateQuery(texts, isinstance(q, list), source, text_format == "html",
                          _alternatives(fields.get("alternatives"), max_alternatives))


def detect_text(fields: Dict[str, Any]) -> str:
    """The ``q`` of a ``/detect`` request (a list's texts one after another)."""
    if "q" not in fields:
        raise RequestError(400, "q is required")
    q = _text(fields["q"])
    text = q if isinstance(q, str) else "\n".join(q)
    if not text.strip():
        raise RequestError(400, "q is empty: nothing to detect")
    return text


def _text(q: Any) -> Any:
    if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
        raise RequestError(400, "q must be a string or a list of strings")
    return q


def _alternatives(value: Any, most: int) -> int:
    """``alternatives``: how many other translations the client wants (a form sends it as text)."""
    if value is None or value == "":
        return 0
    try:
        number = int(value) if not isinstance(value, (bool, float)) else None
    except ValueError:
        number = None
    if number is None:
        raise RequestError(400, "alternatives must be a whole number")
    if number > most:
        raise RequestError(400, f"alternatives must be at most {most} (the beam's other hypotheses)")
    return max(0, number)
