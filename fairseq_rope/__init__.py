"""fairseq-rope: Rotary Position Embedding (RoFormer) for fairseq Transformer MT.

Use as ``--user-dir fairseq_rope`` with fairseq's CLIs, or ``import fairseq_rope``
before loading a checkpoint from Python. Importing registers the models and
lets torch's safe loader (``weights_only=True``) read fairseq checkpoints.
"""

from fairseq_rope import checkpoints, models  # noqa: F401

__version__ = "0.1.0"
