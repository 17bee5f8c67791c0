"""Evaluation: checkpoint averaging, decoding, BLEU/chrF scoring, BLEU by length,
paired significance, and the tables and figures reports are made of.

Depends on :mod:`fairseq_rope.base`, the plugin core (safe checkpoint loading)
and :mod:`fairseq_rope.data`; the core never imports it.
"""
