"""The fused Triton rotation on the CPU, under Triton's interpreter (``make test-triton``).

``TRITON_INTERPRET=1`` must be set before the kernels are defined, that is before
:mod:`fairseq_rope.rotary_triton` is imported: the ``kernels`` fixture sets it, then imports them. The interpreter's limits shape the tests: it is slow (small shapes),
does no bf16 arithmetic (the kernel does none: it computes in fp32) and truncates when it stores
bf16 (so bf16 results are compared within one unit in the last place more than rounding allows).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, List

import pytest

from fairseq_rope import rotary


@pytest.fixture
def kernels():
    """The kernel module, interpreted; importing Triton fails the test where it is missing."""
    os.environ["TRITON_INTERPRET"] = "1"
    from fairseq_rope import rotary_triton

    return rotary_triton


@pytest.fixture
def paths(monkeypatch, kernels):
    """``paths("fused")`` / ``paths("pytorch")``: a context in which RoPE rotates CPU tensors with
    the kernel (counting its launches in the returned list) or with PyTorch."""

    @contextmanager
    def use(path: str) -> Iterator[List[str]]:
        launches: List[str] = []
        rotate = kernels.rotate

        def counted(*args, **kwargs):
            launches.append("rotate")
            return rotate(*args, **kwargs)

        with monkeypatch.context() as patch, rotary.fused_rotation("interpret" if path == "fused" else "0"):
            patch.setattr(kernels, "rotate", counted)
            yield launches
        if path == "fused":
            assert launches, "the fused path never launched the kernel"

    return use
