"""Safe loading of fairseq checkpoints under torch's ``weights_only`` unpickler.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses
any global outside an allowlist. fairseq checkpoints of args-configured
("legacy") models, the Transformer family included, pickle the
``argparse.Namespace`` holding the training args and, when trained with
``--eval-bleu``, numpy arrays: the BLEU n-gram counts in the checkpoint's
metrics state (:data:`FAIRSEQ_CHECKPOINT_GLOBALS`). A checkpoint carrying
anything else (code, say) is refused before any of it runs.

Importing this module changes nothing in fairseq or torch. The two changes
that make fairseq's own loaders (``fairseq-generate``, ``fairseq-interactive``,
``--restore-file``, the hub interface) load safely, the allowlist entry and a
safe ``load_checkpoint_to_cpu``, are declared with every other change in
:mod:`fairseq_rope.patches` and use :func:`refusing_unsafe` from here.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
from contextlib import contextmanager
from typing import Any, Dict, Iterator

import numpy
import torch

from fairseq_rope.base import FairseqRopeError, PathLike

# What a numeric numpy array pickles as: numpy's array and dtype constructors (numpy >= 2
# names its core module numpy._core) and the dtype's class, built by the unpickler. No
# object dtype: an array of objects is refused, whatever the objects.
_NUMPY_CORE = getattr(numpy, "_core", None) or numpy.core
NUMPY_ARRAY_GLOBALS = (
    _NUMPY_CORE.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
    *(type(numpy.dtype(kind)) for kind in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                          "uint32", "uint64", "float16", "float32", "float64")),
)
# The only globals a fairseq checkpoint of the Transformer family pickles: its training
# args, and with --eval-bleu the BLEU counts fairseq keeps as numpy int arrays in
# extra_state["metrics"] (so that a resumed run goes on aggregating them).
FAIRSEQ_CHECKPOINT_GLOBALS = (argparse.Namespace, *NUMPY_ARRAY_GLOBALS)


# What torch.load raises for a truncated, corrupt or unreadable file.
UNREADABLE = (OSError, EOFError, RuntimeError, pickle.UnpicklingError)


class UnsafeCheckpointError(FairseqRopeError, pickle.UnpicklingError):
    """A checkpoint that torch's safe unpickler refused: it holds more than a fairseq checkpoint may."""


@contextmanager
def refusing_unsafe(path: PathLike) -> Iterator[None]:
    """Turn torch's weights-only refusal of ``path`` into an :class:`UnsafeCheckpointError`.

    Other errors (a missing or truncated file) pass through unchanged.
    """
    try:
        yield
    except pickle.UnpicklingError as error:
        if isinstance(error, UnsafeCheckpointError) or "Weights only load failed" not in str(error):
            raise
        # torch's own reason, without its advice to allowlist what the file asked for.
        match = re.search(r"WeightsUnpickler error:\s*(.*?)(?: Please use|\n|$)", str(error))
        reason = match.group(1).strip().rstrip(".") if match else "an object outside the allowlist"
        if reason.startswith("Unsupported operand"):
            # Not a pickle at all: damaged, or not a checkpoint (no code could have run).
            raise pickle.UnpicklingError(
                f"cannot read checkpoint {os.fspath(path)}: it is not a torch checkpoint or "
                f"it is corrupt ({reason}); copy or save it again"
            ) from None
        raise UnsafeCheckpointError(
            f"refused to load checkpoint {os.fspath(path)}: torch's safe unpickler "
            f"(weights_only=True) rejected it ({reason}). A fairseq checkpoint holds only "
            "tensors, plain containers, argparse.Namespace and numpy arrays; unpickling anything else can "
            "run arbitrary code. Load it unsafely only if you trust where the file came from."
        ) from None


def load_checkpoint(path: PathLike) -> Dict[str, Any]:
    """Load a fairseq checkpoint to CPU with the safe unpickler, whatever torch's default.

    An explicit ``weights_only=True`` wins over ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``.
    Needs :data:`FAIRSEQ_CHECKPOINT_GLOBALS` allowlisted (patch ``SAFE_GLOBALS``, on by default).
    """
    with refusing_unsafe(path), open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)
