"""Interleaved repetitions and robust summaries.

Every candidate of a comparison is timed once per repetition, in an order that
rotates from one repetition to the next, so that a slow phase of a shared
machine (another process, frequency scaling, a warm or cold cache) hits every
candidate alike instead of one block of them. Summaries are the median and the
spread (quartiles, min, max) of the per-call times, and the samples themselves in
repetition order, so that two candidates can be compared pairwise
(:func:`paired_speedup`): the samples of one repetition were taken moments apart.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch


@dataclass(frozen=True)
class Stats:
    """Seconds per call over the repetitions (from :func:`paired_speedup`: speed ratios)."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int
    calls_per_sample: int = 1
    samples: Tuple[float, ...] = ()  # seconds per call, in repetition order

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


def summarize(samples: List[float], calls_per_sample: int = 1) -> Stats:
    if not samples:
        raise ValueError("no samples to summarize")
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Stats(
        median=statistics.median(ordered), q1=q1, q3=q3, min=ordered[0], max=ordered[-1],
        n=len(ordered), calls_per_sample=calls_per_sample, samples=tuple(samples),
    )


def paired_speedup(candidate: Mapping[str, Any], baseline: Mapping[str, Any]) -> Stats:
    """``candidate``'s throughput over ``baseline``'s (same work per call), per repetition:
    the baseline's time over the candidate's in each repetition, summarized over repetitions.

    Both were timed in every repetition of one :func:`interleaved` call, moments apart, so a
    slow phase of the machine divides out of each ratio; a ratio of the two medians keeps it
    in both and is noisier. Takes :class:`Stats` as dicts (``as_dict``, or read from JSON).
    """
    ours, theirs = candidate["samples"], baseline["samples"]
    if not ours or len(ours) != len(theirs):
        raise ValueError(f"paired samples needed: {len(ours)} against {len(theirs)}")
    return summarize([b / a for a, b in zip(ours, theirs)])


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so that wall time covers the work (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn``: wall time on the CPU; on CUDA
    from an event recorded before the first call to one after the last kernel, the device's own
    clock (a launch-bound step's gaps between kernels included), free of the host's timer and
    of the synchronization's own latency."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    start_s = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start_s) / calls


def calls_for(fn: Callable[[], object], min_sample_s: float, device: torch.device) -> int:
    """How many calls make one sample last at least ``min_sample_s`` (timer resolution,
    per-sample overhead); ``fn`` is called once more here, which also warms it up."""
    once = time_calls(fn, 1, device)
    return max(1, math.ceil(min_sample_s / max(once, 1e-9)))


def interleaved(
    candidates: Mapping[str, Callable[[], object]],
    reps: int,
    device: torch.device,
    warmup: int = 1,
    min_sample_s: float = 0.0,
) -> Dict[str, Stats]:
    """Time every candidate ``reps`` times, interleaved, after ``warmup`` untimed calls each.

    One sample is ``calls_per_sample`` back-to-back calls (chosen per candidate
    so that it lasts ``min_sample_s``); the order of the candidates rotates by
    one every repetition.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    names = list(candidates)
    for name in names:
        for _ in range(warmup):
            candidates[name]()
    calls = {name: calls_for(candidates[name], min_sample_s, device) if min_sample_s > 0 else 1
             for name in names}
    samples: Dict[str, List[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(time_calls(candidates[name], calls[name], device))
    return {name: summarize(samples[name], calls[name]) for name in names}
