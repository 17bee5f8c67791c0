"""The encoding contract: which encodings may take the lean decoding step, and what
``encode_step`` must compute (the same as ``encode_qk`` plus q's scaling)."""

import pytest
import torch

from fairseq_rope.position_context import PositionContext
from fairseq_rope import rotary
from fairseq_rope.position_encoding import PositionEncoding
from fairseq_rope.alibi import AlibiBias
from fairseq_rope.relative import RelativePositionEncoding
from fairseq_rope.rope_scaling import RopeScaling
from fairseq_rope.rotary import RotaryEmbedding


class BiasOnly(PositionEncoding):
    def logit_bias(self, q, offset, src_len):
        return torch.zeros(())


class ValueOnly(PositionEncoding):
    def value_term(self, probs, offset):
        return None


def test_qk_only_is_derived_from_the_class_not_declared():
    assert PositionEncoding.qk_only and RotaryEmbedding.qk_only
    assert not RelativePositionEncoding.qk_only and not AlibiBias.qk_only
    # An encoding that forgets to say it adds a logit or value term cannot claim q/k only.
    assert not BiasOnly.qk_only and not ValueOnly.qk_only


def generic_step(encoding: PositionEncoding, qkv: torch.Tensor, context: PositionContext, q_scale: float):
    """What encode_step must equal: the base class's route through encode_qk."""
    return PositionEncoding.encode_step(encoding, qkv, context, q_scale)


YARN = RopeScaling("yarn", 4.0, 64)  # the lean step's scaled table, 1/t folded into q's scaling
DYNAMIC = RopeScaling("dynamic-yarn", 1.0, 4)  # each sentence's own angles: through encode_qk


@pytest.mark.parametrize(
    "dtype, layout, rope_dim, scaling",
    [(torch.float32, "interleaved", None, None), (torch.float64, "interleaved", None, None),
     (torch.float32, "interleaved", 4, None), (torch.float32, "half", None, None),
     (torch.bfloat16, "interleaved", None, None), (torch.float32, "interleaved", None, YARN),
     (torch.float32, "half", 4, YARN), (torch.bfloat16, "interleaved", None, YARN),
     (torch.float32, "interleaved", None, DYNAMIC)],
    ids=["fp32", "fp64", "partial", "half-layout", "bf16", "yarn", "yarn-half-layout-partial", "yarn-bf16",
         "dynamic-yarn"],
)
def test_rope_step_equals_encode_qk_then_scaling(dtype, layout, rope_dim, scaling):
    rope = RotaryEmbedding(8, rope_dim, layout=layout, scaling=scaling)
    lengths = torch.tensor([2, 3, 5, 8, 13])  # used by the dynamic scaling only
    qkv = torch.randn(5, 3, 3, 8, dtype=dtype)
    for offset in (0, 7, 300, 7):  # a new table size and back: the step memo follows
        got = rope.encode_step(qkv, PositionContext(offset, lengths), 0.125)
        q, k = rope.encode_qk(qkv[:, 0, :, None], qkv[:, 1, :, None], PositionContext(offset, lengths))
        assert [t.shape for t in got] == [qkv[:, 0].shape] * 3
        tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-6}
        torch.testing.assert_close(got[0], q[:, :, 0] * 0.125, **tol)
        torch.testing.assert_close(got[1], k[:, :, 0], **tol)
        torch.testing.assert_close(got[2], qkv[:, 2], atol=0, rtol=0)
        torch.testing.assert_close(got, generic_step(rope, qkv, PositionContext(offset, lengths), 0.125), **tol)


def test_step_multipliers_built_under_inference_mode_serve_training():
    """The per-table step multipliers are shared like the table: never inference tensors."""
    rotary.clear_cos_sin_cache()
    rope = RotaryEmbedding(8)
    with torch.inference_mode():
        rope.encode_step(torch.randn(3, 3, 2, 8), PositionContext(4), 0.5)
    table = rotary.cos_sin_table(8, rope.theta, torch.device("cpu"), torch.float32, 5)
    assert table._steps and not any(step.is_inference() for steps in table._steps.values() for step in steps)
    qkv = torch.randn(3, 3, 2, 8, requires_grad=True)
    sum(t.sum() for t in rope.encode_step(qkv, PositionContext(4), 0.5)).backward()  # the same step, now with autograd
    assert qkv.grad is not None
