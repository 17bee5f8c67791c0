"""scripts/attention_step.py: one attention layer through a beam search, timed and written down."""

from __future__ import annotations

import torch

from fairseq_rope.benchmark import step


def test_both_layers_are_timed_and_the_report_is_written(tmp_path):
    stats = step.measure(32, 4, steps=3, reps=3)
    assert set(stats) == {"stock", "rope"} and all(s.n == 3 and s.median > 0 for s in stats.values())
    out = tmp_path / "step.md"
    assert step.main(["--dims", "32x4", "--steps", "2", "--reps", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 32×4 | 2 |" in text and "rope ÷ stock" in text and "--reps 2" in text


def test_the_timed_calls_are_real_beam_searches():
    """Each call decodes from an empty cache with reordering: the same outputs every
    call, every step's output depends on the reordered cache, and stock and rope
    differ only by the rotation (identical weights)."""
    torch.manual_seed(0)
    rope_attn = step.PositionalMultiheadAttention(32, 4, step.RotaryEmbedding(8)).eval()
    stock_attn = step.MultiheadAttention(32, 4, self_attention=True).eval()
    rope_attn.load_state_dict(stock_attn.state_dict())
    rope, stock = step.beam_search_call(rope_attn, 32, 4), step.beam_search_call(stock_attn, 32, 4)
    out = rope()
    assert out.shape == (4, step.HYPOTHESES, 32)
    torch.testing.assert_close(out, rope())  # a fresh cache per call
    first = stock()
    torch.testing.assert_close(out[0], first[0], atol=1e-5, rtol=1e-5)  # one position: no rotation to see
    assert (out[1:] - first[1:]).abs().max() > 1e-3  # later positions are rotated
