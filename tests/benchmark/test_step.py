"""scripts/attention_step.py: one decoding step of each attention, timed and written down."""

from __future__ import annotations

import torch

from fairseq_rope.benchmark import step


def test_both_steps_decode_the_same_and_the_report_is_written(tmp_path):
    torch.manual_seed(0)
    stats = step.measure(32, 4, cached=3, reps=3)
    assert set(stats) == {"stock", "rope"} and all(s.n == 3 and s.median > 0 for s in stats.values())
    out = tmp_path / "step.md"
    assert step.main(["--dims", "32x4", "--cached", "2", "--reps", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 32×4 | 2 |" in text and "rope ÷ stock" in text and "--reps 2" in text


def test_the_steps_compared_are_real_decoding_steps():
    """The rope call extends a copy of a real cache: its output depends on the cached keys."""
    call = step.step_call(step.PositionalMultiheadAttention(32, 4, step.RotaryEmbedding(8)).eval(), 32, 3)
    out, _ = call()
    again, _ = call()
    assert out.shape == (1, step.HYPOTHESES, 32)
    torch.testing.assert_close(out, again)  # the cache is copied, not grown, between calls
