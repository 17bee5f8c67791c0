"""The HTTP API, shaped as LibreTranslate's (v1.9) so that its clients work unchanged.

* ``POST /translate``: ``q`` (a string or a list of strings), ``source`` (the model's source
  language, or ``auto``), ``target``, optional ``format`` (``text`` or ``html``),
  ``alternatives`` (up to the beam's other hypotheses) and ``api_key``; answered with
  ``{"translatedText": …}`` of the same shape as ``q``, with ``detectedLanguage`` for ``auto``,
  ``alternatives`` when asked for and ``truncated`` when a sentence was longer than the model's
  bound and translated cut. Each line of a text is a sentence (each text node of an HTML one),
  translated as ``fairseq-rope-translate`` translates a line.
* ``POST /detect``: ``q``; ``[{"confidence", "language"}]`` among the model's two languages.
* ``GET /languages``: both languages, the source with ``targets: [target]``, the target with
  ``targets: []``; ``GET /frontend/settings``: LibreTranslate's settings of its page.
* ``GET /``: a page to type into and read the translation (``page.html``, LibreTranslate's page
  in miniature: it calls ``/frontend/settings`` and ``/translate``; ``/?q=TEXT`` translates TEXT).
* ``GET /health``: ``{"status": "ok", …}`` with the model's pair, the workers alive, the work in
  progress and the batches translated so far; 503 and ``"status": "error"`` once a worker is gone.

The fields may come as JSON, an HTML form (urlencoded or multipart) or the query string
(:mod:`~fairseq_rope_serve.server.fields`). Every refusal is ``{"error": message}`` with its
status: 400 for a body that is not what its type says, a field of the wrong type, an empty
``q``, a pair the model does not translate; 403 for a wrong or missing ``api_key`` when the
server has one; 413 for a body, text or number of sentences over the limits (the body's
declared size is checked before it is read, its actual size while it is); 503 when too many
sentences are waiting or no worker is left. An unexpected error is a 500 with a generic
message; its traceback goes to the server's log, never to the client.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from fairseq_rope_serve.common import split_lines
from fairseq_rope_serve.server.batcher import Batcher, Busy
from fairseq_rope_serve.server.detect import detect_languages
from fairseq_rope_serve.server.fields import FieldsError, request_fields
from fairseq_rope_serve.server.html import HtmlText, join_html, split_html
from fairseq_rope_serve.server.validate import AUTO, RequestError, TranslateQuery, check_key, detect_text, \
    translate_query
from fairseq_rope_serve.translator import TextTranslator, Translation

#: Names of the languages /languages lists (others by their code).
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "zh": "Chinese"}
#: LibreTranslate's default wait before its page translates what is typed (ms), for /frontend/settings.
FRONTEND_TIMEOUT_MS = 500
#: The page at / (self-contained: no external scripts, styles or fonts).
PAGE = Path(__file__).with_name("page.html")

log = logging.getLogger(__name__)
T = TypeVar("T")


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


def create_app(model: TextTranslator, limits: Limits = Limits(), api_key: Optional[str] = None,
               inter_threads: int = 1, close_timeout: float = 30.0) -> Starlette:
    """The service of ``model`` (loaded with ``inter_threads``): one worker per inter thread.
    On shutdown the workers get ``close_timeout`` seconds to finish what is queued."""
    settings = model.settings
    pair = (settings.source_lang, settings.target_lang)
    max_alternatives = model.decoding.beam - 1
    state = {"batcher": None, "in_flight": 0}

    def translate_lines(items: Sequence[Tuple[str, int]]) -> List[Translation]:
        """The batcher's work: (line, alternatives wanted) → its translation."""
        return model.translate_full([line for line, _ in items], [n for _, n in items])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["batcher"] = Batcher(translate_lines, inter_threads, limits.max_batch_sentences,
                                   limits.max_queued_sentences)
        try:
            yield
        finally:  # uvicorn has answered (or cancelled) the requests in flight by now
            # In a thread and bounded: a translation still running must not hold the event loop.
            stopped = await asyncio.get_running_loop().run_in_executor(None, state["batcher"].close,
                                                                       close_timeout)
            if not stopped:
                log.warning("a translation worker was still busy %.0f s after shutdown began; "
                            "exiting without it", close_timeout)

    async def translate(request: Request) -> JSONResponse:
        state["in_flight"] += 1
        try:
            fields = await _fields(request, limits)
            check_key(fields.get("api_key"), api_key)
            query = translate_query(fields, pair, max_alternatives)
            _check_chars(query.texts, limits)
            # Parsing HTML takes milliseconds: in a thread, not on the event loop.
            documents = await _in_thread(lambda: [split_html(text) for text in query.texts]) if query.html else []
            lines = [d.lines for d in documents] if query.html else [split_lines(t) for t in query.texts]
            _check_sentences(lines, limits)
            detected = None
            if query.source == AUTO:
                detected = detect_languages("\n".join(line for text in lines for line in text), list(pair))[0]
            if detected is not None and detected["language"] == pair[1]:
                # Already in the target language: LibreTranslate gives it back as it is.
                answers = [_Answer(text, []) for text in query.texts]
            else:
                translations = await _translate(state["batcher"], lines, 0 if query.html else query.alternatives)
                def answer() -> List[_Answer]:
                    return [_answer(done, query, documents[i] if query.html else None)
                            for i, done in enumerate(translations)]

                answers = await _in_thread(answer) if query.html else answer()
            return JSONResponse(_response(answers, query, detected))
        finally:
            state["in_flight"] -= 1

    async def detect(request: Request) -> JSONResponse:
        fields = await _fields(request, limits)
        check_key(fields.get("api_key"), api_key)
        text = detect_text(fields)
        _check_chars([text], limits)
        return JSONResponse(detect_languages(text, list(pair)))

    async def languages(request: Request) -> JSONResponse:
        # A body (libretranslatepy sends an empty form, Mastodon a JSON type) is never read.
        src, tgt = pair
        return JSONResponse([{"code": src, "name": LANGUAGE_NAMES.get(src, src), "targets": [tgt]},
                             {"code": tgt, "name": LANGUAGE_NAMES.get(tgt, tgt), "targets": []}])

    async def frontend_settings(request: Request) -> JSONResponse:
        src, tgt = pair
        return JSONResponse({
            "charLimit": limits.max_chars, "frontendTimeout": FRONTEND_TIMEOUT_MS, "apiKeys": api_key is not None,
            "keyRequired": api_key is not None, "suggestions": False, "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {"source": {"code": src, "name": LANGUAGE_NAMES.get(src, src)},
                         "target": {"code": tgt, "name": LANGUAGE_NAMES.get(tgt, tgt)}},
        })

    page = PAGE.read_text(encoding="utf-8")

    async def home(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    async def health(request: Request) -> JSONResponse:
        batcher = state["batcher"]
        alive = batcher.alive
        return JSONResponse({"status": "ok" if alive == batcher.workers else "error", "source": pair[0],
                             "target": pair[1], "workers": batcher.workers, "workers_alive": alive,
                             "in_flight": state["in_flight"], "queued_sentences": batcher.queued,
                             "batches": batcher.batches, "batched_requests": batcher.batched_requests,
                             "skipped_requests": batcher.skipped},
                            status_code=200 if alive == batcher.workers else 503)

    return Starlette(
        routes=[Route("/", home, methods=["GET"]), Route("/translate", translate, methods=["POST"]), Route("/detect", detect, methods=["POST"]),
                Route("/languages", languages, methods=["GET"]),
                Route("/frontend/settings", frontend_settings, methods=["GET"]),
                Route("/health", health, methods=["GET"])],
        exception_handlers={RequestError: _refused, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )


async def _in_thread(work: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, work)


@dataclass(frozen=True)
class _Answer:
    """One text's translation, its alternatives and whether a sentence of it was cut."""

    text: str
    alternatives: List[str]
    truncated: bool = False


async def _translate(batcher: Batcher, lines: List[List[str]], alternatives: int) -> List[List[Translation]]:
    """Each text's lines translated by the workers (with ``alternatives`` each), per text."""
    try:
        future = batcher.submit([(line, alternatives) for text in lines for line in text])
    except Busy as e:
        raise RequestError(503, f"busy ({e}); retry later") from None
    translations: List[Translation] = await asyncio.wrap_future(future)
    out, start = [], 0
    for text in lines:
        out.append(translations[start:start + len(text)])
        start += len(text)
    return out


def _answer(done: List[Translation], query: TranslateQuery, document: Optional[HtmlText]) -> _Answer:
    truncated = any(t.truncated for t in done)
    if document is not None:  # LibreTranslate has no alternatives for HTML either
        return _Answer(join_html(document, [t.text for t in done]), [], truncated)
    text = "\n".join(t.text for t in done)
    # The k-th alternative of a text: each line's k-th, or its best where it has fewer.
    others = ["\n".join(t.alternatives[k] if k < len(t.alternatives) else t.text for t in done)
              for k in range(query.alternatives)]
    return _Answer(text, [o for k, o in enumerate(others) if o != text and o not in others[:k]], truncated)


def _response(answers: List[_Answer], query: TranslateQuery, detected: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """LibreTranslate's answer: each field a list for a list ``q``, else the one text's."""
    def shaped(values: List[Any]) -> Any:
        return values if query.is_list else values[0]

    response: Dict[str, Any] = {"translatedText": shaped([a.text for a in answers])}
    if detected is not None:
        response["detectedLanguage"] = shaped([detected] * len(answers))
    if query.alternatives > 0:
        response["alternatives"] = shaped([a.alternatives for a in answers])
    if any(a.truncated for a in answers):  # a sentence longer than the model's bound was translated cut
        response["truncated"] = shaped([a.truncated for a in answers])
    return response


async def _fields(request: Request, limits: Limits) -> Dict[str, Any]:
    body = await _body(request, limits.max_body_bytes)
    try:
        return await request_fields(request.headers, request.url.query, body)
    except FieldsError as e:
        raise RequestError(400, str(e)) from None


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


def _check_chars(texts: List[str], limits: Limits) -> None:
    chars = sum(len(t) for t in texts)
    if chars > limits.max_chars:
        raise RequestError(413, f"q has {chars} characters, more than this server's limit of {limits.max_chars}")


def _check_sentences(lines: List[List[str]], limits: Limits) -> None:
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
