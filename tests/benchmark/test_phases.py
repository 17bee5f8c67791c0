"""scripts/decode_phases.py: a beam search's time by module, and its control row."""

from __future__ import annotations

import torch

from fairseq_rope.benchmark import phases


def test_measured_phases_add_up_and_only_stock_rows_embed_positions(tmp_path, monkeypatch):
    results = phases.measure("tiny", length=3, reps=1)
    for name, timed in results.items():
        per_layer = sum(timed[p] for p in ("self-attention", "cross-attention", "feed-forward", "output projection"))
        assert 0 < per_layer < timed["decoder"] < timed["decode"]
        assert timed["encoder"] > 0
        assert (timed["position embeddings"] > 0) == (name in ("sinusoidal", "learned"))
    # The report of these measurements, written where --out says.
    monkeypatch.setattr(phases, "measure", lambda size, length, reps: results)
    out = tmp_path / "phases.md"
    assert phases.main(["--length", "3", "--reps", "1", "--out", str(out)]) == 0
    text = out.read_text()
    for row in phases.ROWS:
        assert f"| {row} |" in text
    assert "--reps 1" in text and "| sinusoidal | " in text and "| 1.000 |" in text


def test_the_control_row_runs_fairseqs_self_attention_with_the_same_weights(tmp_path):
    from fairseq_rope.attention import PositionalMultiheadAttention
    from fairseq_rope.benchmark import models

    rows = {row.name: row for row in models.rows_for("tiny")}
    data = models.write_dictionary(tmp_path, 50)
    trainer, _ = models.build_trainer(models.train_argv(data, rows["rope"], torch.device("cpu"), "fp32", 0.0, 256, 1), 1)
    model = trainer.model
    before = {k: v.clone() for k, v in model.decoder.layers[0].self_attn.state_dict().items()}
    phases.with_stock_self_attention(model)
    attn = model.decoder.layers[0].self_attn
    assert type(attn) is phases.MultiheadAttention and not isinstance(attn, PositionalMultiheadAttention)
    for key, value in attn.state_dict().items():
        torch.testing.assert_close(value, before[key])
