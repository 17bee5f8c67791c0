"""fairseq-rope: Rotary Position Embedding (RoFormer) for fairseq Transformer MT.

Use as ``--user-dir fairseq_rope`` with fairseq's CLIs, or ``import fairseq_rope``
before loading a checkpoint from Python. Importing registers the models,
lets torch's safe loader (``weights_only=True``) read fairseq checkpoints and
makes a killed fairseq-train resume exactly (:mod:`fairseq_rope.resume`).
"""

from fairseq_rope import checkpoints, models, resume  # noqa: F401

__version__ = "0.1.0"
