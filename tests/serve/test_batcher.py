"""The server's batching: requests waiting while the model is busy are translated in one call,
each gets its own lines back, a failure reaches only its batch, the waiting work is bounded.
The model here is a function that records its calls and can be held (events, no sleeps)."""

from __future__ import annotations

import threading
from typing import List, Sequence

import pytest

from fairseq_rope_serve.server.batcher import Batcher, Busy


class HeldModel:
    """Upper-cases lines; its first call waits until :meth:`release`; ``boom`` fails its call."""

    def __init__(self) -> None:
        self.calls: List[List[str]] = []
        self.started, self.released = threading.Event(), threading.Event()

    def __call__(self, lines: Sequence[str]) -> List[str]:
        self.calls.append(list(lines))
        self.started.set()
        assert self.released.wait(30)
        if "boom" in lines:
            raise RuntimeError("boom")
        return [line.upper() for line in lines]

    def release(self) -> None:
        self.released.set()


def busy_batcher(model: HeldModel, **options) -> Batcher:
    """A batcher whose one worker holds a first request, so that the next ones wait."""
    batcher = Batcher(model, **options)
    first = batcher.submit(["first"])
    assert model.started.wait(30)
    batcher.first = first
    return batcher


def test_waiting_requests_go_together_and_each_gets_its_own_lines():
    model = HeldModel()
    batcher = busy_batcher(model)
    futures = [batcher.submit(lines) for lines in (["a", "b"], ["c"], [""], ["d", "e", "f"])]
    assert batcher.queued == 7
    model.release()
    assert [f.result(30) for f in futures] == [["A", "B"], ["C"], [""], ["D", "E", "F"]]
    assert batcher.first.result(30) == ["FIRST"]
    assert model.calls == [["first"], ["a", "b", "c", "", "d", "e", "f"]]
    assert batcher.queued == 0
    batcher.close()


def test_a_batch_stops_at_max_batch_sentences():
    model = HeldModel()
    batcher = busy_batcher(model, max_batch_sentences=4)
    futures = [batcher.submit(lines) for lines in (["a", "b"], ["c", "d"], ["e"])]
    model.release()
    assert [f.result(30) for f in futures] == [["A", "B"], ["C", "D"], ["E"]]
    assert model.calls[1:] == [["a", "b", "c", "d"], ["e"]]
    batcher.close()


def test_a_failure_reaches_its_batch_only_and_the_worker_goes_on():
    model = HeldModel()
    batcher = busy_batcher(model)
    failing = [batcher.submit(["x"]), batcher.submit(["boom"])]
    model.release()
    for future in failing:
        with pytest.raises(RuntimeError, match="boom"):
            future.result(30)
    assert batcher.submit(["y"]).result(30) == ["Y"]
    batcher.close()


def test_the_sentences_waiting_are_bounded():
    """Beyond max_queued_sentences a request is refused at once (Busy); alone in the queue, a
    request is accepted whatever its size (the per-request limits bound it)."""
    model = HeldModel()
    batcher = busy_batcher(model, max_queued_sentences=3)
    accepted = batcher.submit(["a", "b"])
    with pytest.raises(Busy, match="2 sentences are waiting to be translated"):
        batcher.submit(["c", "d"])
    also = batcher.submit(["c"])
    model.release()
    assert (accepted.result(30), also.result(30)) == (["A", "B"], ["C"])
    assert batcher.submit(["a", "b", "c", "d", "e"]).result(30) == ["A", "B", "C", "D", "E"]
    batcher.close()


def test_close_translates_what_was_submitted_then_refuses():
    model = HeldModel()
    batcher = busy_batcher(model, workers=2)
    waiting = batcher.submit(["late"])
    model.release()
    batcher.close()
    assert waiting.result(0) == ["LATE"] and batcher.first.result(0) == ["FIRST"]
    with pytest.raises(Busy, match="shutting down"):
        batcher.submit(["after"])
