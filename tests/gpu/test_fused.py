"""The fused Triton rotation on the device: the default on CUDA, equal to the PyTorch path within
rounding (forward, backward, decoding steps), its steps' keys equal to its full pass's to the bit;
and kernel launches per training step and beam search, RoPE against stock. On the CPU (the dry
run) the default is the PyTorch path, and these check that path against itself and the counts."""

from __future__ import annotations

import pytest
import torch

from fairseq_rope.position_context import PositionContext
from fairseq_rope import rotary
from fairseq_rope.benchmark import launch_counts
from fairseq_rope.rotary import RotaryEmbedding
from tests.gpu.conftest import DTYPES
from tests.rope_reference import THETA, random_input, unit_roundoff

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM, LENGTH, BATCH = 4, 64, 37, 3


def test_the_fused_rotation_is_the_default_on_cuda(device):
    x = torch.zeros(1, dtype=torch.float16, device=device)
    with rotary.fused_rotation("auto"):
        kernels = rotary.fused_kernels(x)
    if device.type == "cuda":
        assert kernels is not None, "Triton does not import on this CUDA node: the fused rotation is off"
    else:
        assert kernels is None
    with rotary.fused_rotation("0"):
        assert rotary.fused_kernels(x) is None  # the opt-out


def encoded(setting: str, encoding: RotaryEmbedding, qkv: torch.Tensor, upstream):
    leaf = qkv.detach().clone().requires_grad_()
    with rotary.fused_rotation(setting):
        out = encoding.encode_qkv(leaf, PositionContext(5))
        torch.autograd.backward(out, tuple(upstream))
        with torch.inference_mode():
            steps = [encoding.encode_step(qkv[t].detach(), PositionContext(t), HEAD_DIM**-0.5) for t in range(4)]
        with torch.no_grad():
            full = encoding.encode_qkv(qkv[:4].detach(), PositionContext(0))
    return [t.detach() for t in out], leaf.grad, steps, full


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rope_dim", [HEAD_DIM, 32], ids=["full", "partial"])
def test_fused_equals_the_pytorch_path(device, dtype, layout, rope_dim):
    encoding = RotaryEmbedding(HEAD_DIM, rope_dim, THETA, layout)
    qkv = random_input((LENGTH, BATCH, 3, HEADS, HEAD_DIM), dtype, device, seed=1)
    upstream = [random_input((BATCH, HEADS, LENGTH, HEAD_DIM), dtype, device, seed=2 + i) for i in range(3)]
    fused, fused_grad, fused_steps, full = encoded("auto", encoding, qkv, upstream)
    pytorch, pytorch_grad, pytorch_steps, _ = encoded("0", encoding, qkv, upstream)
    tolerance = 8 * unit_roundoff(dtype)
    for got, expected in [*zip(fused, pytorch), (fused_grad, pytorch_grad),
                          *zip((t for s in fused_steps for t in s), (t for s in pytorch_steps for t in s))]:
        torch.testing.assert_close(got.double(), expected.double(), rtol=tolerance,
                                   atol=tolerance * expected.abs().max().item())
    # A decoding step caches the keys the full pass computes, to the bit: the same kernel (on the
    # PyTorch path, the same complex multiply in the interleaved layout only).
    if device.type == "cuda" or layout == "interleaved":
        for t, (_, k, v) in enumerate(fused_steps):
            assert torch.equal(k, full[1][:, :, t]) and torch.equal(v, full[2][:, :, t])


def test_kernel_launches_per_step_are_stocks_plus_at_most_two_per_layer(device):
    """Counted on the device (every kernel the GPU ran) at tiny size in bf16: RoPE's training step at most
    stock's plus two launches per self-attention layer, its beam search at most stock's plus two
    per self-attention layer and decoding step."""
    rows = launch_counts.ROWS if device.type == "cuda" else launch_counts.ROWS[:2]  # no interpreter in the dry run
    counts = launch_counts.count_model("tiny", device, "bf16", length=8, sentences=2, rows=rows)
    stock = counts.pop(launch_counts.ROWS[0][0])
    for label, rope in counts.items():
        layers = rope["self_attention_layers"]
        assert rope["train_step"] <= stock["train_step"] + 2 * layers, (label, rope, stock)
        steps = rope["steps"] * rope["decoder_layers"] + layers - rope["decoder_layers"]
        assert rope["beam_search"] <= stock["beam_search"] + 2 * steps, (label, rope, stock)
