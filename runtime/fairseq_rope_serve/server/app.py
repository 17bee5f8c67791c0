"""The HTTP API, shaped as LibreTranslate's so that its clients work unchanged.

* ``POST /translate``: a JSON object (or an HTML form) with ``q`` (a string or a list of
  strings), ``source``, ``target``, optional ``format`` (``text``, the only one) and
  ``api_key``; answered with ``{"translatedText": …}`` of the same shape as ``q``. Each line
  of a string is a sentence, translated as ``fairseq-rope-translate`` translates a line.
* ``GET /languages``: ``[{"code", "name", "targets"}]``, the model's one pair.
* ``GET /health``: ``{"status": "ok", …}`` with the model's pair, the work in progress and
  the batches translated so far (with the requests they held).

Every refusal is ``{"error": message}`` with its status: 400 for a body that is no JSON
object or form, a field of the wrong type, an empty ``q``, a pair the model does not translate;
403 for a wrong or missing ``api_key`` when the server has one; 413 for a body, text or number
of sentences over the limits (the body's declared size is checked before it is read, its
actual size while it is); 503 when too many sentences are waiting. An unexpected error is a
500 with a generic message; its traceback goes to the server's log, never to the client.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Optional, Union
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fairseq_rope_serve.common import split_lines
from fairseq_rope_serve.server.batcher import Batcher, Busy
from fairseq_rope_serve.translator import TextTranslator

#: Names of the languages /languages lists (others by their code).
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "zh": "Chinese"}
FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and the work the server keeps waiting."""

    max_body_bytes: int = 1 << 20
    max_chars: int = 10_000
    max_sentences: int = 128
    #: Sentences of one batch (the requests waiting are taken together up to it).
    max_batch_sentences: int = 256
    #: Sentences waiting for a worker, beyond which requests get a 503.
    max_queued_sentences: int = 4096


class RequestError(Exception):
    """A request refused: its HTTP status and the message the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def create_app(model: TextTranslator, limits: Limits = Limits(), api_key: Optional[str] = None,
               inter_threads: int = 1) -> Starlette:
    """The service of ``model`` (loaded with ``inter_threads``): one worker per inter thread."""
    settings = model.settings
    pair = (settings.source_lang, settings.target_lang)
    state = {"batcher": None, "in_flight": 0}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["batcher"] = Batcher(model.translate, inter_threads, limits.max_batch_sentences,
                                   limits.max_queued_sentences)
        try:
            yield
        finally:  # uvicorn has answered the requests in flight by now
            state["batcher"].close()

    async def translate(request: Request) -> JSONResponse:
        state["in_flight"] += 1
        try:
            fields = _fields(await _body(request, limits.max_body_bytes), request.headers.get("content-type", ""))
            _check_key(fields.get("api_key"), api_key)
            q = _query(fields, pair)
            texts = [q] if isinstance(q, str) else q
            lines = [split_lines(text) for text in texts]
            _check_size(texts, lines, limits)
            try:
                future = state["batcher"].submit([line for text in lines for line in text])
            except Busy as e:
                raise RequestError(503, f"busy ({e}); retry later") from None
            translations = await asyncio.wrap_future(future)
            out, start = [], 0
            for text in lines:
                out.append("\n".join(translations[start:start + len(text)]))
                start += len(text)
            return JSONResponse({"translatedText": out[0] if isinstance(q, str) else out})
        finally:
            state["in_flight"] -= 1

    async def languages(request: Request) -> JSONResponse:
        src, tgt = pair
        return JSONResponse([{"code": src, "name": LANGUAGE_NAMES.get(src, src), "targets": [tgt]}])

    async def health(request: Request) -> JSONResponse:
        batcher = state["batcher"]
        return JSONResponse({"status": "ok", "source": pair[0], "target": pair[1], "in_flight": state["in_flight"],
                             "queued_sentences": batcher.queued, "batches": batcher.batches,
                             "batched_requests": batcher.batched_requests})

    return Starlette(
        routes=[Route("/translate", translate, methods=["POST"]), Route("/languages", languages, methods=["GET"]),
                Route("/health", health, methods=["GET"])],
        exception_handlers={RequestError: _refused, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed ``limit`` bytes: from
    its Content-Length before reading, else while reading."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, "Content-Length is not a number")
        if int(declared) > limit:
            raise RequestError(413, f"the body has {declared} bytes, more than this server's limit of {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"the body has more than this server's limit of {limit} bytes")
    except ClientDisconnect:  # before the whole body: no one to answer, nothing to log
        raise RequestError(400, "the client went away before its body was read") from None
    return bytes(body)


def _fields(body: bytes, content_type: str) -> Dict[str, Any]:
    """The request's fields, from a JSON object or an HTML form (several ``q``: a list)."""
    if content_type.split(";")[0].strip().lower() == FORM:
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body))
        except (UnicodeDecodeError, ValueError):
            raise RequestError(400, "the body is not a valid UTF-8 form") from None
        fields: Dict[str, Any] = {k: v[0] for k, v in form.items()}
        if len(form.get("q", ())) > 1:
            fields["q"] = form["q"]
        return fields
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise RequestError(400, "the body is not valid JSON") from None
    if not isinstance(fields, dict):
        raise RequestError(400, "the body must be a JSON object with q, source and target")
    return fields


def _check_key(given: Any, key: Optional[str]) -> None:
    if key is not None and not (isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())):
        raise RequestError(403, "invalid or missing API key (api_key)")


def _query(fields: Dict[str, Any], pair: tuple) -> Union[str, List[str]]:
    """``q``, once its type, its text and the language pair are checked."""
    for name in ("q", "source", "target"):
        if name not in fields:
            raise RequestError(400, f"{name} is required")
    q = fields["q"]
    if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
        raise RequestError(400, "q must be a string or a list of strings")
    for name in ("source", "target", "format"):
        if name in fields and not isinstance(fields[name], str):
            raise RequestError(400, f"{name} must be a string")
    if fields.get("format", "text") != "text":
        raise RequestError(400, f"format {fields['format']!r} is not supported: text only")
    if (fields["source"], fields["target"]) != pair:
        raise RequestError(400, f"this server translates {pair[0]} to {pair[1]}, "
                                f"not {fields['source']} to {fields['target']} (GET /languages)")
    if not any(t.strip() for t in ([q] if isinstance(q, str) else q)):
        raise RequestError(400, "q is empty: nothing to translate")
    return q


def _check_size(texts: List[str], lines: List[List[str]], limits: Limits) -> None:
    chars = sum(len(t) for t in texts)
    if chars > limits.max_chars:
        raise RequestError(413, f"q has {chars} characters, more than this server's limit of {limits.max_chars}")
    sentences = sum(len(t) for t in lines)
    if sentences > limits.max_sentences:
        raise RequestError(413, f"q has {sentences} lines (sentences), more than this server's limit of "
                                f"{limits.max_sentences}")


async def _refused(request: Request, error: RequestError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status == 503 else None
    return JSONResponse({"error": error.message}, status_code=error.status, headers=headers)


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    return JSONResponse({"error": error.detail}, status_code=error.status_code, headers=error.headers)


async def _internal_error(request: Request, error: Exception) -> JSONResponse:
    # Starlette raises the error on after this response, for uvicorn to log its traceback.
    return JSONResponse({"error": "internal error; the server's log has the details"}, status_code=500)
