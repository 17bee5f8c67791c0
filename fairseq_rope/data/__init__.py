"""Data: preparation of parallel corpora (WMT14, Multi30k, any raw pair) and the demo corpus.

Depends on :mod:`fairseq_rope.base` only; the plugin core never imports it.
"""
