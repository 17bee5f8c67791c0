"""fairseq-rope-serve: translate with a model exported by fairseq-rope, without torch or fairseq.

A model directory written by ``fairseq-rope-export-ct2`` translated as fairseq-rope's
evaluation translates (the same Moses processing, BPE, decoding settings and detokenization),
with CTranslate2, sacremoses and subword-nmt only:

* :mod:`~fairseq_rope_serve.translator`: :class:`TextTranslator`, raw lines in, translations out;
* :mod:`~fairseq_rope_serve.translate`: ``fairseq-rope-translate MODEL_DIR < in > out``;
* :mod:`~fairseq_rope_serve.server`: ``fairseq-rope-serve MODEL_DIR``, LibreTranslate's HTTP API;
* the text processing fairseq-rope's data preparation and evaluation import from here
  (:mod:`~fairseq_rope_serve.text`, :mod:`~fairseq_rope_serve.bpe`), the decoding settings
  (:mod:`~fairseq_rope_serve.decoding`) and the model directory's layout
  (:mod:`~fairseq_rope_serve.model_dir`).

Nothing here imports torch or fairseq (tested): ``from fairseq_rope_serve.translator import
TextTranslator`` costs CTranslate2's import and sacremoses'.
"""

__version__ = "0.1.0"
