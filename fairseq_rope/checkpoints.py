"""Safe loading of fairseq checkpoints under torch's ``weights_only`` unpickler.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses
any global outside an allowlist. fairseq checkpoints of args-configured
("legacy") models, the Transformer family included, pickle exactly one such
global: the ``argparse.Namespace`` holding the training args. We allow that
type, and nothing else, so fairseq's own loaders (``fairseq-generate``,
``fairseq-interactive``, ``--restore-file``, the hub interface) keep loading
safely; a checkpoint carrying anything else (code, say) is still refused.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Union

import torch

FAIRSEQ_CHECKPOINT_GLOBALS = (argparse.Namespace,)


def allow_fairseq_checkpoint_globals() -> None:
    """Add the types fairseq checkpoints pickle to torch's safe-load allowlist."""
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))


def load_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Load a fairseq checkpoint to CPU with the safe unpickler, whatever torch's default."""
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


allow_fairseq_checkpoint_globals()
