"""Workers that cannot die: a request cancelled while it waits is skipped, one cancelled during
its translation gets nothing and costs its batch-mates nothing, ``/health`` tells when a worker
is gone (503), and shutting down waits for a stuck translation a bounded time without holding
the event loop. The model is a function held by semaphores (no sleeps); the HTTP handlers are
driven through the ASGI interface, cancelled as uvicorn cancels them past its grace period."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace
from typing import Any, List, Sequence, Tuple

import pytest

from fairseq_rope_serve.decoding import Decoding
from fairseq_rope_serve.server.app import create_app
from fairseq_rope_serve.server.batcher import Batcher, Busy
from fairseq_rope_serve.translator import Translation

WAIT = 30  # seconds a passing test never comes near


class GatedModel:
    """Upper-cases; each call waits for :meth:`open`; ``die`` makes a call raise what is no Exception."""

    def __init__(self) -> None:
        self.calls: List[List[Any]] = []
        self._entered, self._gate = threading.Semaphore(0), threading.Semaphore(0)
        self.die = False

    def __call__(self, items: Sequence[Any]) -> List[Any]:
        self.calls.append(list(items))
        self._entered.release()
        assert self._gate.acquire(timeout=WAIT)
        if self.die:
            raise SystemExit("the worker's thread ends")  # a BaseException: nothing catches it for good
        return [item.upper() for item in items]

    def entered(self) -> None:
        """Wait until a call has begun."""
        assert self._entered.acquire(timeout=WAIT), "the model was never called"

    def open(self) -> None:
        self._gate.release()


def test_cancelled_requests_are_skipped_or_ignored_and_the_worker_goes_on():
    model = GatedModel()
    batcher = Batcher(model)
    first = batcher.submit(["first"])
    model.entered()
    batch = [batcher.submit([name]) for name in ("a", "b", "c")]
    model.open()
    assert first.result(WAIT) == ["FIRST"]
    model.entered()  # a, b and c are being translated together
    assert model.calls[-1] == ["a", "b", "c"]
    batch[1].cancel()  # mid-batch: too late to cancel, and the worker must not mind
    queued = [batcher.submit([name]) for name in ("d", "e")]
    assert queued[0].cancel()  # still waiting: cancelled, so never translated
    model.open()
    assert (batch[0].result(WAIT), batch[2].result(WAIT)) == (["A"], ["C"])
    model.entered()
    model.open()
    assert queued[1].result(WAIT) == ["E"] and model.calls[-1] == ["e"]
    later = batcher.submit(["f"])
    model.entered()
    model.open()
    assert later.result(WAIT) == ["F"]
    assert (batcher.alive, batcher.skipped) == (1, 1)
    assert batcher.close(WAIT)


def test_close_waits_a_bounded_time_for_a_stuck_translation():
    model = GatedModel()
    batcher = Batcher(model)
    stuck = batcher.submit(["stuck"])
    model.entered()
    assert batcher.close(timeout=0.05) is False  # still translating: given up on, not waited for
    with pytest.raises(Busy, match="shutting down"):
        batcher.submit(["after"])
    model.open()
    assert stuck.result(WAIT) == ["STUCK"]
    assert batcher.close(WAIT)


def fake_model(translate) -> SimpleNamespace:
    """What create_app needs of a TextTranslator, translating with ``translate``."""
    settings = SimpleNamespace(source_lang="en", target_lang="de")
    return SimpleNamespace(settings=settings, decoding=Decoding(), translate_full=lambda lines, alternatives=(): [
        Translation(text) for text in translate(lines)])


async def call(app, method: str, path: str, payload: Any = None) -> Tuple[int, Any]:
    """One request through the ASGI interface, as uvicorn makes it: (status, decoded JSON)."""
    body = b"" if payload is None else json.dumps(payload).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: List[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    except Exception:  # Starlette raises an error again after its 500, for the server to log
        if not sent:
            raise
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def translate_payload(q: str) -> dict:
    return {"q": q, "source": "en", "target": "de"}


async def in_thread(function) -> None:
    await asyncio.get_running_loop().run_in_executor(None, function)


def test_handlers_cancelled_mid_batch_leave_the_others_answered_and_the_server_translating():
    """As past uvicorn's graceful timeout: handlers waiting for their translation are cancelled,
    one in a batch being translated, one still queued. The rest of the batch is answered, the
    queued one is never translated, and the server goes on translating, its workers alive."""
    model = GatedModel()
    app = create_app(fake_model(model), close_timeout=WAIT)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            blocker = asyncio.create_task(call(app, "POST", "/translate", translate_payload("blocker")))
            await in_thread(model.entered)
            batch = [asyncio.create_task(call(app, "POST", "/translate", translate_payload(q))) for q in "abc"]
            while (await call(app, "GET", "/health"))[1]["queued_sentences"] < 3:
                await asyncio.sleep(0)  # the three are queued behind the blocker
            model.open()
            assert await blocker == (200, {"translatedText": "BLOCKER"})
            await in_thread(model.entered)  # a, b and c in one call
            queued = asyncio.create_task(call(app, "POST", "/translate", translate_payload("d")))
            while (await call(app, "GET", "/health"))[1]["queued_sentences"] < 1:
                await asyncio.sleep(0)
            for task in (batch[1], queued):
                task.cancel()
            await asyncio.gather(batch[1], queued, return_exceptions=True)
            model.open()
            answers = await asyncio.wait_for(asyncio.gather(batch[0], batch[2]), WAIT)
            assert answers == [(200, {"translatedText": "A"}), (200, {"translatedText": "C"})]
            after = asyncio.create_task(call(app, "POST", "/translate", translate_payload("e")))
            await in_thread(model.entered)
            model.open()
            assert await asyncio.wait_for(after, WAIT) == (200, {"translatedText": "E"})
            assert model.calls == [["blocker"], ["a", "b", "c"], ["e"]]  # d: cancelled before its turn
            status, health = await call(app, "GET", "/health")
            assert (status, health["status"], health["workers_alive"], health["skipped_requests"]) == (200, "ok", 1, 1)

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, on purpose
def test_health_is_503_once_a_worker_is_gone_and_requests_are_refused_not_left_waiting():
    model = GatedModel()
    app = create_app(fake_model(model), close_timeout=WAIT)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            status, health = await call(app, "GET", "/health")
            assert (status, health["status"], health["workers"], health["workers_alive"]) == (200, "ok", 1, 1)
            model.die = True
            doomed = asyncio.create_task(call(app, "POST", "/translate", translate_payload("a")))
            await in_thread(model.entered)
            model.open()
            assert (await asyncio.wait_for(doomed, WAIT))[0] == 500  # answered, not left waiting
            while (await call(app, "GET", "/health"))[1]["workers_alive"]:
                await asyncio.sleep(0)  # the thread is ending
            status, health = await call(app, "GET", "/health")
            assert (status, health["status"], health["workers_alive"]) == (503, "error", 0)
            assert await call(app, "POST", "/translate", translate_payload("b")) == (
                503, {"error": "busy (no translation worker is running); retry later"})

    asyncio.run(scenario())


def test_shutdown_gives_a_stuck_translation_a_bounded_time_and_keeps_the_event_loop_running():
    """Lifespan's end with a translation that never ends (its handler cancelled): the app stops
    after close_timeout, and the event loop runs other work meanwhile."""
    model = GatedModel()
    app = create_app(fake_model(model), close_timeout=0.2)
    ticks: List[int] = []

    async def ticker() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            stuck = asyncio.create_task(call(app, "POST", "/translate", translate_payload("stuck")))
            await in_thread(model.entered)
            stuck.cancel()
            ticking = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            before = len(ticks)
        assert len(ticks) > before + 1  # the loop went on while the workers were waited for
        ticking.cancel()

    done = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.run(scenario()), done.set()), daemon=True)
    thread.start()
    thread.join(WAIT)
    model.open()  # let the stuck translation end, whatever happened
    assert done.is_set(), "the application's shutdown did not end"
