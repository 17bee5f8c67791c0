"""Experiments: configs (``configs/``), training runs, the RoFormer table harness
(reproduce, collect), the length-study corpora and the studies built on runs
(budget curve, runaways).

The top layer: depends on :mod:`fairseq_rope.evaluation`, :mod:`fairseq_rope.data`
and the core; nothing imports it.
"""
