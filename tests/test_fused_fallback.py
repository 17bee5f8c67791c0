"""The fused rotation fails safe: a kernel that cannot compile or launch here (an old Triton
without ``tl.split``, a GPU its compiler does not know) warns once, naming the cause and
``FAIRSEQ_ROPE_TRITON=0``, and the process rotates with PyTorch from then on, with the same
results; a misuse the kernel's checks catch (ValueError) is not hidden that way.

The kernel module is a stand-in here (no Triton needed): the interpreter tests
(tests/triton) simulate the compile failure in the real one."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from fairseq_rope import rotary
from fairseq_rope.position_context import PositionContext
from fairseq_rope.rotary import FusedRotationFailed, RotaryEmbedding


def failing_kernels(error: Exception, calls: list) -> types.SimpleNamespace:
    def fail(*args, **kwargs):
        calls.append(True)
        raise error

    return types.SimpleNamespace(rotate_qk=fail, rotate_packed=fail)


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """``install(kernels)``: the fused path switched on for CPU tensors with ``kernels`` as its module."""
    def install(kernels) -> None:
        monkeypatch.setattr(rotary, "_fused", (kernels, frozenset(("cpu",))))

    return install


def test_a_kernel_that_fails_to_compile_warns_once_and_pytorch_rotates_from_then_on(fused_on_cpu):
    calls: list = []
    fused_on_cpu(failing_kernels(RuntimeError("CompilationError: tl.split is not defined"), calls))
    rope = RotaryEmbedding(16)
    qkv = torch.randn(5, 2, 3, 4, 16)  # (T, B, 3, H, D)
    with pytest.warns(FusedRotationFailed, match=r"(?s)tl\.split is not defined.*FAIRSEQ_ROPE_TRITON=0"):
        q, k, v = rope.encode_qkv(qkv, PositionContext(7))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning, and no second try of the kernel
        again = rope.encode_qkv(qkv, PositionContext(7))
        rope.encode_qk(q, k, PositionContext(7))
    assert len(calls) == 1
    with rotary.fused_rotation("0"):
        expected = rope.encode_qkv(qkv, PositionContext(7))
    for got in (q, k, v), again:
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_misuse_the_kernel_refuses_is_raised_not_hidden(fused_on_cpu):
    calls: list = []
    fused_on_cpu(failing_kernels(ValueError("the fused rotation needs q's shape for k"), calls))
    with pytest.raises(ValueError, match="q's shape"):
        RotaryEmbedding(16).encode_qk(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), PositionContext(0))
    assert rotary._fused[0] is not None  # still switched on: the caller's mistake, not the kernel's
