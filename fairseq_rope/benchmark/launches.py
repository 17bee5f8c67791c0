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
import os
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

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


# --- RoPE against stock, per training step and per beam search (scripts/count_launches.py)

#: The rows counted: (label, benchmark row, FAIRSEQ_ROPE_TRITON setting).
ROWS = (("sinusoidal (stock)", "sinusoidal", "0"), ("rope, PyTorch path", "rope", "0"),
        ("rope, fused kernel", "rope", "auto"))


def count_model(size: str, device: torch.device, dtype: str, length: int = 16, sentences: int = 4,
                seed: int = 1, rows: Sequence[Tuple[str, str, str]] = ROWS) -> Dict[str, Dict[str, float]]:
    """Per row of :data:`ROWS`: launches of one ``Trainer.train_step`` (forward, backward, Adam) and
    of one beam search (beam 4, output forced to ``length`` tokens), and the model's self-attention
    layers. On the CPU the fused row runs under Triton's interpreter (if Triton is installed)."""
    from fairseq_rope import rotary
    from fairseq_rope.benchmark import models

    results: Dict[str, Dict[str, float]] = {}
    for label, row, setting in rows:
        if setting == "auto" and device.type == "cpu":
            setting = "interpret"
            os.environ.setdefault("TRITON_INTERPRET", "1")
        with rotary.fused_rotation(setting):
            if setting != "0" and rotary.fused_kernels(torch.empty(0, device=device)) is None:
                continue  # no Triton here: no fused row
            trainer, task = models.diagnostic_trainer(size, row, seed, "launches-", device, dtype)
            batch = models.synthetic_batch(task, length, sentences, seed)
            generator = models.forced_length_generator(task, trainer.model, length)
            sample = models.decode_sample(batch, device)

            decode = models.beam_search_call(trainer, task, generator, sample)
            with models.quiet():
                train_step = lambda: trainer.train_step([batch])  # noqa: E731
                train_step(), decode()  # caches and tables built outside the count
                train = kernel_launches(train_step, device)[0]
                beam = kernel_launches(decode, device)[0]
            model = trainer.model
            results[label] = {"train_step": train, "beam_search": beam, "steps": length + 1,
                              "self_attention_layers": len(model.encoder.layers) + len(model.decoder.layers),
                              "decoder_layers": len(model.decoder.layers)}
    return results


def report(results: Dict[str, Dict[str, float]], size: str, device: str, dtype: str, length: int,
           sentences: int) -> List[str]:
    """The markdown of :func:`count_model`'s counts, each row against stock."""
    from fairseq_rope.evaluation.report import markdown_table

    stock = results[ROWS[0][0]]
    lines = []
    for label, counts in results.items():
        extra_train = counts["train_step"] - stock["train_step"]
        extra_beam = counts["beam_search"] - stock["beam_search"]
        per_step_layer = extra_beam / (counts["steps"] * counts["decoder_layers"])
        lines.append([label, f"{counts['train_step']:.0f}", f"{extra_train:+.0f}",
                      f"{extra_train / counts['self_attention_layers']:+.2f}", f"{counts['beam_search']:.0f}",
                      f"{extra_beam:+.0f}", f"{per_step_layer:+.2f}"])
    layers = stock["self_attention_layers"]
    return [
        f"Kernel launches, {size} size ({layers:.0f} self-attention layers), {device}, {dtype}: "
        f"one training step (fairseq's `Trainer.train_step`: forward, backward, Adam) on "
        f"{sentences} sentences × {length} tokens, and one beam search (beam 4, {sentences} "
        f"sentences, output forced to {length} tokens: {length + 1} decoder steps). "
        "Counted by fairseq_rope/benchmark/launches.py (its docstring says how).",
        "",
        *markdown_table(
            ["row", "training step", "− stock", "per self-attention layer", "beam search", "− stock",
             "per decoder layer and step"], lines),
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    from fairseq_rope.benchmark import machine

    parser = argparse.ArgumentParser(prog="scripts/count_launches.py", description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--skip-fused", action="store_true",
                        help="no fused row (on the CPU Triton's interpreter takes minutes at base size)")
    parser.add_argument("--out", type=Path, help="markdown report (default: print it)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = ROWS[:2] if args.skip_fused else ROWS
    results = count_model(args.size, device, args.dtype, args.length, args.sentences, rows=rows)
    where = machine.describe(device).get("gpu", "CPU") if device.type == "cuda" else "CPU"
    text = "\n".join(report(results, args.size, where, args.dtype, args.length, args.sentences)) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0
