"""fairseq-rope: Rotary Position Embedding (RoFormer) for fairseq Transformer MT.

Use as ``--user-dir fairseq_rope`` with fairseq's CLIs, or ``import fairseq_rope``
before loading a checkpoint from Python. Importing registers the models and
applies the changes to fairseq and torch listed in :mod:`fairseq_rope.patches`
(each with a ``FAIRSEQ_ROPE_NO_<NAME>=1`` opt-out): torch's safe loader
(``weights_only=True``) reads fairseq checkpoints, and a killed fairseq-train
resumes exactly.
"""

from fairseq_rope.patches import apply_patches

apply_patches()

from fairseq_rope import models  # noqa: E402,F401  (registers the architectures with fairseq)

__version__ = "0.1.0"
