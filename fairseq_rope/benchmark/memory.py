"""Peak memory of one call, in process, on CPU and CUDA alike.

Several models live in the benchmark process at once, so process-wide figures
(RSS, ``max_memory_allocated`` alone) would mix them. A model's peak is therefore

    persistent bytes (its parameters, buffers, optimizer state, master weights)
  + the highest amount allocated *during* the call above what was allocated before it.

During the call: on CUDA ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, minus ``memory_allocated`` before; on CPU, the
allocation and free events that ``torch.profiler`` records with
``profile_memory=True``, summed in time order, and the maximum of that running
sum. Both count tensor memory as the allocator hands it out (not the caching
allocator's reserve, not the Python heap).
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Tuple

import torch
from torch import Tensor


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and ties counted once)."""
    seen = set()
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        key = (storage.device, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def peak_during(fn: Callable[[], object], device: torch.device) -> int:
    """Most bytes allocated at any moment of ``fn()``, above those allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    return _cpu_peak_during(fn)


def _cpu_peak_during(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(_allocation_events(prof))
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def _allocation_events(prof) -> List[Tuple[int, int]]:
    """(time ns, +bytes allocated / −bytes freed) of every CPU allocator event."""
    from torch._C._profiler import _EventType

    events: List[Tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    if not events:
        raise RuntimeError("torch.profiler recorded no allocations; cannot measure CPU memory")
    return events
