"""Kernel launches per step, counted with ``torch.profiler``: deterministic, unlike times.

On a GPU the count is exact: every kernel, memset and memcpy the device ran. On the CPU it is
an estimate of what the same code launches on a GPU: each operator called from Python or from
autograd's engine (not from inside another operator) that is neither a view (unless it had to
copy) nor an allocation counts as one kernel, as a matmul with its bias, a softmax or a copy is
one on a GPU; and the fused rotation's Triton kernel, which the profiler does not see as an
operator (on the CPU Triton's interpreter runs it as Python), counts as one launch.

fairseq's training step is launch-bound on an H100 (docs/benchmarks/README.md), so launches
are what a position encoding adds to a step's time there: the target is stock's count plus at
most two per self-attention layer (the rotation, forward and backward).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import Callable, Iterator, Tuple

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

#: The label of the fused rotation's launches in a profile (see :func:`labelled_rotation`).
ROTATION_LABEL = "fairseq_rope::fused_rotation"

#: Operators that allocate, or only change metadata: no kernel of their own.
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::set_",
    "aten::lift_fresh", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::item",
    "aten::record_stream", "aten::_has_compatible_shallow_copy_type",
})


@functools.lru_cache(maxsize=None)
def _is_view(name: str) -> bool:
    """True if every tensor-returning overload of ``aten::name`` returns a view of its inputs
    (the schema's ``Tensor(a)``, not written to): a dispatch, no kernel."""
    packet = getattr(torch.ops.aten, name.split("::", 1)[1], None)
    if packet is None:
        return False
    schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    schemas = [s for s in schemas if s.returns and all("Tensor" in str(r.type) for r in s.returns)]
    return bool(schemas) and all(
        r.alias_info is not None and not r.alias_info.is_write for s in schemas for r in s.returns
    )


def _copies(event) -> bool:
    """A view-like call that had to copy after all (``reshape``, ``to`` across dtypes)."""
    return any(child.name == "aten::copy_" or _copies(child) for child in event.cpu_children)


def _launches_on_cpu(events) -> Counter:
    counts: Counter = Counter()
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue
        if event.name == ROTATION_LABEL:
            counts[ROTATION_LABEL] += 1
            continue
        if not event.name.startswith("aten::"):
            continue
        parent, nested = event.cpu_parent, False
        while parent is not None and not nested:
            nested = parent.name.startswith("aten::") or parent.name == ROTATION_LABEL
            parent = parent.cpu_parent
        if nested:
            continue  # inside another operator (or the fused rotation): counted there
        if event.name not in NO_KERNEL and (not _is_view(event.name) or _copies(event)):
            counts[event.name] += 1
    return counts


def _launches_on_device(events) -> Counter:
    return Counter(event.name for event in events if event.device_type == DeviceType.CUDA)


@contextlib.contextmanager
def labelled_rotation(device: torch.device) -> Iterator[None]:
    """Each launch of the fused rotation marked in the profile, so that it counts as one."""
    from fairseq_rope import rotary

    kernels = rotary.fused_kernels(torch.empty(0, device=device))  # reads the switch if not yet
    if kernels is None:
        yield
        return
    rotate = kernels.rotate

    def labelled(*args, **kwargs):
        with record_function(ROTATION_LABEL):
            return rotate(*args, **kwargs)

    kernels.rotate = labelled
    try:
        yield
    finally:
        kernels.rotate = rotate


def kernel_launches(call: Callable[[], object], device: torch.device) -> Tuple[int, Counter]:
    """The kernels ``call`` launches on ``device``: their number and a count per kernel (per
    operator on the CPU). Call it once unprofiled first, so that caches and tables are built."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with labelled_rotation(device), profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    counts = _launches_on_device(prof.events()) if device.type == "cuda" else _launches_on_cpu(prof.events())
    return sum(counts.values()), counts
