"""Experiments: configs (``configs/``), training runs and their convergence rule, the
RoFormer table harness (reproduce, run summaries, collect: cells, length tables, plots), the
length-study corpora and the studies built on runs (budget curve, runaways).

The top layer: may import every layer below it (:mod:`fairseq_rope.evaluation`,
:mod:`fairseq_rope.deploy`, :mod:`fairseq_rope.data`, the core); nothing imports it.
"""
