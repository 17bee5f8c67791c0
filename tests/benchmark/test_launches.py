"""Kernel launches counted on the CPU (fairseq_rope/benchmark/launches.py): what the counter counts,
and a RoPE self-attention layer's training step against fairseq's stock one."""

from __future__ import annotations

import torch
from fairseq.modules import MultiheadAttention

from fairseq_rope import rotary
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.benchmark.launches import ROTATION_LABEL, kernel_launches
from fairseq_rope.rotary import RotaryEmbedding

CPU = torch.device("cpu")
EMBED, HEADS = 32, 4


def test_work_counts_views_and_allocations_do_not():
    x = torch.randn(4, 6)
    total, counts = kernel_launches(lambda: (x + 1, x.t(), x.view(6, 4), x.unsqueeze(0), torch.empty(3)), CPU)
    assert total == 1 and counts == {"aten::add": 1}
    # A view that had to copy is one kernel; a composite operator (linear: matmul and bias) is one.
    weight = torch.randn(5, 6)
    total, counts = kernel_launches(lambda: (x.t().reshape(-1), torch.nn.functional.linear(x, weight)), CPU)
    assert counts == {"aten::reshape": 1, "aten::linear": 1}


def test_a_labelled_fused_rotation_is_one_launch_whatever_runs_inside():
    x = torch.randn(3)

    def rotation():
        y = x.neg()
        with torch.profiler.record_function(ROTATION_LABEL):
            return y * 2 + x.exp()

    total, counts = kernel_launches(rotation, CPU)
    assert counts == {ROTATION_LABEL: 1, "aten::neg": 1} and total == 2


GEMMS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm")


def training_step_launches(attn: MultiheadAttention):
    """All launches of a forward and backward of ``attn``, and its matrix products."""
    x = torch.randn(7, 3, EMBED, requires_grad=True)

    def step():
        out, _ = attn(x, x, x, need_weights=False)
        out.sum().backward()

    step()
    total, counts = kernel_launches(step, CPU)
    return total, sum(counts[name] for name in GEMMS)


def test_a_rope_layers_training_step_launches_no_more_than_stocks():
    """The packed q/k/v projection (one matmul forward, one each for the input's and the weights'
    gradient) pays for the rotation's few kernels on the PyTorch path: fewer launches than stock's
    three projections, whose gradients are then summed."""
    torch.manual_seed(0)
    stock, stock_gemms = training_step_launches(MultiheadAttention(EMBED, HEADS, self_attention=True))
    with rotary.fused_rotation("0"):
        rope, rope_gemms = training_step_launches(
            PositionalMultiheadAttention(EMBED, HEADS, RotaryEmbedding(EMBED // HEADS)))
    assert rope <= stock, f"RoPE {rope} launches against stock {stock}"
    # Stock: 4 projections forward, 8 products backward; RoPE: 2 forward, 4 backward.
    assert rope_gemms <= stock_gemms / 2, f"RoPE {rope_gemms} matrix products against stock {stock_gemms}"
