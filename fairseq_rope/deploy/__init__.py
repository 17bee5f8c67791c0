"""Serving trained models with CTranslate2 (``pip install fairseq-rope[ctranslate2]``).

* :mod:`~fairseq_rope.deploy.spec`: a fairseq model as a CTranslate2 ``TransformerSpec``
  (stock rows through CTranslate2's own fairseq converter helpers, RoPE through its
  rotary attention, RPE through its relative positions where they can represent it),
  and the refusals of everything CTranslate2 cannot represent;
* :mod:`~fairseq_rope.deploy.export`: ``fairseq-rope-export-ct2 CHECKPOINT OUT_DIR``, a
  self-contained model directory (model, dictionaries, BPE codes, tokenization settings),
  checked against the fairseq model before it appears, written atomically;
* :mod:`~fairseq_rope.deploy.model_dir`: what such a directory holds, read back;
* :mod:`~fairseq_rope.deploy.decoding`: CTranslate2's beam search set up to decode as
  fairseq-generate does (beam, length penalty, max-len-a/b, ``<pad>`` never emitted);
* :mod:`~fairseq_rope.deploy.generate`: a binarized subset decoded with CTranslate2 into
  fairseq-generate's output format (what ``fairseq-rope-evaluate --engine ctranslate2`` scores);
* :mod:`~fairseq_rope.deploy.translate`: ``fairseq-rope-translate MODEL_DIR < in > out``,
  raw text in and out, with the project's Moses and BPE processing.
"""

from __future__ import annotations

from types import ModuleType

from fairseq_rope.base import FairseqRopeError

#: The range with rotary embeddings in encoders (rotary_dim on TransformerEncoderSpec).
CTRANSLATE2_REQUIREMENT = "ctranslate2>=4.6.3,<5"


class DeployError(FairseqRopeError, ValueError):
    """A model, model directory or option that cannot be exported or served."""


def require_ctranslate2() -> ModuleType:
    """The ``ctranslate2`` module, or a :class:`DeployError` saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise DeployError(
            f"CTranslate2 is not installed: pip install 'fairseq-rope[ctranslate2]' "
            f"(or '{CTRANSLATE2_REQUIREMENT}')"
        ) from None
    return ctranslate2
