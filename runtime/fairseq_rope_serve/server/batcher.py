"""Sentences of concurrent requests translated together: a queue and worker threads.

Each request submits its items (lines, with what it asks of them) and gets a future. A worker
takes the oldest request, then every other one already waiting, up to
``max_batch_sentences`` (no waiting for more: at low load a request is translated at once,
under load the requests that queued while the model was busy go together), translates them in
one call and hands each request its own results back. A translation does not depend on the
other sentences of its call (:mod:`fairseq_rope_serve.translator`), so a response equals the
offline translation.

Several workers (``inter_threads``) translate batches in parallel: CTranslate2 runs as many
calls at once as the translator has ``inter_threads``. The sentences waiting are bounded
(``max_queued_sentences``): beyond, :meth:`Batcher.submit` refuses with :class:`Busy`, so
memory stays bounded whatever the load.

A worker outlives whatever happens to a request: a request cancelled while it waits (its
handler gone: the server's shutdown past its grace period, a timeout) is skipped, one
cancelled during its translation just gets no answer, and a failure of the model or of the
hand-back reaches the requests of that batch only. :attr:`Batcher.alive` counts the workers
still running (``/health`` answers 503 when one is not).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

#: items → one result per item, in order (the app's: lines → translations).
Translate = Callable[[Sequence[Any]], List[Any]]

log = logging.getLogger(__name__)


class Busy(Exception):
    """More sentences are waiting than the batcher accepts, or no worker is left to take them."""


@dataclass
class _Job:
    items: List[Any]
    future: "Future[List[Any]]" = field(default_factory=Future)


class Batcher:
    """``translate`` (items → results) shared by concurrent requests, batched."""

    def __init__(self, translate: Translate, workers: int = 1, max_batch_sentences: int = 256,
                 max_queued_sentences: int = 4096) -> None:
        self._translate = translate
        self._max_batch = max_batch_sentences
        self._max_queued = max_queued_sentences
        self._queue: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._lock = threading.Lock()
        self._queued = 0  # sentences submitted and not yet taken by a worker
        #: Batches translated, and requests in them (for /health: how much batching happens).
        self.batches = self.batched_requests = 0
        #: Requests whose handler was gone before their turn: skipped, never translated.
        self.skipped = 0
        self._closed = False
        self._workers = [threading.Thread(target=self._work, name=f"translate-{i}", daemon=True)
                         for i in range(workers)]
        for worker in self._workers:
            worker.start()

    @property
    def queued(self) -> int:
        """Sentences waiting for a worker."""
        return self._queued

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def alive(self) -> int:
        """Workers still running (all of them until :meth:`close`, unless one died)."""
        return sum(worker.is_alive() for worker in self._workers)

    def submit(self, items: Sequence[Any]) -> "Future[List[Any]]":
        """A future of the results of ``items``; :class:`Busy` if too many are waiting or no
        worker is left to translate them."""
        job = _Job(list(items))
        with self._lock:
            if self._closed:
                raise Busy("the server is shutting down")
            if not self.alive:  # the future would never be answered
                raise Busy("no translation worker is running")
            if self._queued and self._queued + len(job.items) > self._max_queued:
                raise Busy(f"{self._queued} sentences are waiting to be translated")
            self._queued += len(job.items)
            self._queue.put(job)
        return job.future

    def close(self, timeout: Optional[float] = None) -> bool:
        """Translate what was submitted, then stop the workers; wait for them ``timeout``
        seconds at most (None: as long as they take). Whether they all stopped: the workers are
        daemon threads, so one still in a translation does not keep the process alive."""
        with self._lock:
            self._closed = True
        for _ in self._workers:
            self._queue.put(None)  # after every job: the queue is first in, first out
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.alive

    def _take(self) -> Optional[List[_Job]]:
        """The next batch: the oldest job and those waiting behind it; None to stop."""
        first = self._queue.get()
        if first is None:
            return None
        jobs, size = [first], len(first.items)
        while size < self._max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # the stop is for after this batch
                break
            jobs.append(job)
            size += len(job.items)
        with self._lock:
            self._queued -= size
        return jobs

    def _work(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            # A cancelled future cannot take a result (InvalidStateError); a running one can no
            # longer be cancelled, so what follows hands back to live futures only.
            running = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            with self._lock:
                self.skipped += len(jobs) - len(running)
                if running:
                    self.batches += 1
                    self.batched_requests += len(running)
            if running:
                self._run(running)

    def _run(self, jobs: List[_Job]) -> None:
        """Translate ``jobs`` together and answer each; nothing raised here ends the worker
        (but what is no Exception, which answers the jobs and goes on up)."""
        try:
            results = self._translate([item for job in jobs for item in job.items])
            if len(results) != sum(len(job.items) for job in jobs):
                raise RuntimeError(f"{len(results)} results for {sum(len(job.items) for job in jobs)} items")
        except Exception as error:  # the requests answer it; the worker goes on
            for job in jobs:
                _settle(job.future, error=error)
            return
        except BaseException as error:  # the thread ends, but no request waits for ever
            for job in jobs:
                _settle(job.future, error=RuntimeError(f"the translation worker stopped: {error!r}"))
            raise
        start = 0
        for job in jobs:
            _settle(job.future, result=results[start:start + len(job.items)])
            start += len(job.items)


def _settle(future: Future, result: Any = None, error: Optional[BaseException] = None) -> None:
    """Hand a result or an error to ``future``, whatever state it is in."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # settled already: nothing to hand back (logged, for a bug to show)
        log.warning("a translation's future was settled already (%s)", future)
