"""Evaluation: checkpoint averaging, decoding (fairseq-generate, or CTranslate2 through
:mod:`fairseq_rope.deploy`), BLEU/chrF scoring, BLEU by length, significance over test
sentences and over training seeds, and the tables and figures reports are made of.

Depends on :mod:`fairseq_rope.base`, the plugin core (safe checkpoint loading),
:mod:`fairseq_rope.data` and :mod:`fairseq_rope.deploy`; the core never imports it.
"""
