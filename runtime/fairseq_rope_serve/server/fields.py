"""A request's fields wherever its client put them, as LibreTranslate reads them: a JSON object,
an HTML form (``application/x-www-form-urlencoded`` or ``multipart/form-data``) or the query
string. LibreTranslate's clients use each: Weblate and Mastodon send JSON, Discourse and the
Python clients urlencoded forms, Nextcloud's (PHP curl) multipart forms and ``/detect`` with
its ``q`` in the query string.

The query string's fields come first and the body's replace them; a body with nothing in it
adds nothing, whatever its content type says (a GET with an empty form or JSON type). In a form,
several ``q`` make a list (LibreTranslate takes the first; a list is what they mean); any
other field repeated is its first value. Multipart bodies go through Starlette's own parser
(python-multipart), fed with the body already read within the size limit; a file part is
refused (nothing here takes files).
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List, Tuple
from urllib.parse import parse_qsl

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser


class FieldsError(ValueError):
    """A body that is not what its content type says (the message is the client's)."""


FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


async def request_fields(headers: Headers, query: str, body: bytes) -> Dict[str, Any]:
    """The fields of a request with ``headers``, query string ``query`` and ``body``."""
    fields = _collect(_parse_query(query, "the query string"))
    if not body.strip():
        return fields
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == FORM:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise FieldsError("the body is not a valid UTF-8 form") from None
        fields.update(_collect(_parse_query(text, "the body")))
    elif content_type == MULTIPART:
        fields.update(_collect(await _multipart(headers, body)))
    else:  # JSON, whatever else the type says (LibreTranslate's clients all label theirs)
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
            raise FieldsError("the body is not valid JSON") from None
        if not isinstance(parsed, dict):
            raise FieldsError("the body must be a JSON object with q, source and target")
        fields.update(parsed)
    return fields


def _parse_query(text: str, where: str) -> List[Tuple[str, str]]:
    try:
        return parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise FieldsError(f"{where} is not a valid form") from None


async def _multipart(headers: Headers, body: bytes) -> List[Tuple[str, str]]:
    async def stream() -> AsyncIterator[bytes]:
        yield body

    try:
        form = await MultiPartParser(headers, stream(), max_files=0, max_fields=1000).parse()
    except MultiPartException as e:
        raise FieldsError(f"the body is not a valid multipart form ({e.message})") from None
    items = form.multi_items()
    if any(isinstance(value, UploadFile) for _, value in items):  # max_files=0 refuses them first
        raise FieldsError("files are not taken here")
    return [(name, str(value)) for name, value in items]


def _collect(pairs: List[Tuple[str, str]]) -> Dict[str, Any]:
    """Form pairs as fields: several ``q`` a list, any other field its first value."""
    fields: Dict[str, Any] = {}
    for name, value in pairs:
        if name == "q" and name in fields:
            fields[name] = (fields[name] if isinstance(fields[name], list) else [fields[name]]) + [value]
        else:
            fields.setdefault(name, value)
    return fields
