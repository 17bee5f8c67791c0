"""Exporting trained models to CTranslate2; serving them is the runtime's, ``fairseq_rope_serve``
(installed with fairseq-rope, or alone without torch: docs/deploy.md).

* :mod:`~fairseq_rope.deploy.spec`: a fairseq model as a CTranslate2 ``TransformerSpec``
  (stock rows through CTranslate2's own fairseq converter helpers, RoPE through its
  rotary attention, RPE through its relative positions where they can represent it),
  and the refusals of everything CTranslate2 cannot represent;
* :mod:`~fairseq_rope.deploy.export`: ``fairseq-rope-export-ct2 CHECKPOINT OUT_DIR``, a
  self-contained model directory (model, dictionaries, BPE codes, tokenization settings,
  ``fairseq_rope_serve.model_dir``), checked against the fairseq model before it appears,
  written atomically;
* :mod:`~fairseq_rope.deploy.generate`: a binarized subset decoded with CTranslate2 into
  fairseq-generate's output format (what ``fairseq-rope-evaluate --engine ctranslate2`` scores),
  with the runtime's decoding as fairseq-generate decodes (``fairseq_rope_serve.decoding``).

Raw text is translated by the runtime's ``fairseq-rope-translate`` and ``fairseq-rope-serve``.
"""

from __future__ import annotations

from fairseq_rope_serve.common import DeployError  # noqa: F401 (deploy's modules import them from here)
from fairseq_rope_serve.translator import CTRANSLATE2_REQUIREMENT, require_ctranslate2  # noqa: F401
