"""Sentences of concurrent requests translated together: a queue and worker threads.

Each request submits its lines and gets a future. A worker takes the oldest request, then
every other one already waiting, up to ``max_batch_sentences`` (no waiting for more: at low
load a request is translated at once, under load the requests that queued while the model was
busy go together), translates them in one call and hands each request its own lines back.
A translation does not depend on the other sentences of its call
(:mod:`fairseq_rope_serve.translator`), so a response equals the offline translation.

Several workers (``inter_threads``) translate batches in parallel: CTranslate2 runs as many
calls at once as the translator has ``inter_threads``. The sentences waiting are bounded
(``max_queued_sentences``): beyond, :meth:`Batcher.submit` refuses with :class:`Busy`, so
memory stays bounded whatever the load.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

Translate = Callable[[Sequence[str]], List[str]]


class Busy(Exception):
    """More sentences are waiting than the batcher accepts."""


@dataclass
class _Job:
    lines: List[str]
    future: "Future[List[str]]" = field(default_factory=Future)


class Batcher:
    """``translate`` (lines → translations) shared by concurrent requests, batched."""

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
        self._closed = False
        self._workers = [threading.Thread(target=self._work, name=f"translate-{i}", daemon=True)
                         for i in range(workers)]
        for worker in self._workers:
            worker.start()

    @property
    def queued(self) -> int:
        """Sentences waiting for a worker."""
        return self._queued

    def submit(self, lines: Sequence[str]) -> "Future[List[str]]":
        """A future of the translations of ``lines``; :class:`Busy` if too many are waiting."""
        job = _Job(list(lines))
        with self._lock:
            if self._closed:
                raise Busy("the server is shutting down")
            if self._queued and self._queued + len(job.lines) > self._max_queued:
                raise Busy(f"{self._queued} sentences are waiting to be translated")
            self._queued += len(job.lines)
            self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Translate what was submitted, then stop the workers."""
        with self._lock:
            self._closed = True
        for _ in self._workers:
            self._queue.put(None)  # after every job: the queue is first in, first out
        for worker in self._workers:
            worker.join()

    def _take(self) -> Optional[List[_Job]]:
        """The next batch: the oldest job and those waiting behind it; None to stop."""
        first = self._queue.get()
        if first is None:
            return None
        jobs, size = [first], len(first.lines)
        while size < self._max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # the stop is for after this batch
                break
            jobs.append(job)
            size += len(job.lines)
        with self._lock:
            self._queued -= size
            self.batches += 1
            self.batched_requests += len(jobs)
        return jobs

    def _work(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                translations = self._translate([line for job in jobs for line in job.lines])
            except Exception as error:  # the requests answer it; the worker goes on
                for job in jobs:
                    job.future.set_exception(error)
                continue
            start = 0
            for job in jobs:
                job.future.set_result(translations[start:start + len(job.lines)])
                start += len(job.lines)
