"""Safe loading of fairseq checkpoints under torch's ``weights_only`` unpickler.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses
any global outside an allowlist. fairseq checkpoints of args-configured
("legacy") models, the Transformer family included, pickle exactly one such
global: the ``argparse.Namespace`` holding the training args. We allow that
type, and nothing else, so fairseq's own loaders (``fairseq-generate``,
``fairseq-interactive``, ``--restore-file``, the hub interface) keep loading
safely; a checkpoint carrying anything else (code, say) is refused before any
of it runs.

Importing this module also wraps fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``
(which every one of those loaders calls) so that

* it unpickles safely even if ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set (a
  common workaround for fairseq under torch >= 2.6), since fairseq's
  ``torch.load`` takes torch's default;
* a refusal names the file and says why (:class:`UnsafeCheckpointError`),
  instead of torch's advice to allowlist whatever the file asked for.
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import re
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator

import torch
from fairseq import checkpoint_utils

from fairseq_rope.base import FairseqRopeError, PathLike


FAIRSEQ_CHECKPOINT_GLOBALS = (argparse.Namespace,)
# torch.load's switches (read at each call): force safe loads, or make unsafe loads the default.
FORCE_SAFE_VARIABLE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_UNSAFE_VARIABLE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UnsafeCheckpointError(FairseqRopeError, pickle.UnpicklingError):
    """A checkpoint that torch's safe unpickler refused: it holds more than a fairseq checkpoint may."""


def allow_fairseq_checkpoint_globals() -> None:
    """Add the types fairseq checkpoints pickle to torch's safe-load allowlist."""
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))


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
            "tensors, plain containers and argparse.Namespace; unpickling anything else can "
            "run arbitrary code. Load it unsafely only if you trust where the file came from."
        ) from None


@contextmanager
def _safe_by_default() -> Iterator[None]:
    """torch.load without ``weights_only`` loads safely in this block, whatever the environment."""
    saved = {name: os.environ.get(name) for name in (FORCE_SAFE_VARIABLE, FORCE_UNSAFE_VARIABLE)}
    os.environ.pop(FORCE_UNSAFE_VARIABLE, None)  # torch refuses both set at once
    os.environ[FORCE_SAFE_VARIABLE] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _safe_fairseq_loader(load: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        with refusing_unsafe(path), _safe_by_default():
            return load(path, *args, **kwargs)

    load_checkpoint_to_cpu.safe_fairseq_rope_loader = True
    return load_checkpoint_to_cpu


def install_safe_fairseq_loader() -> None:
    """Wrap fairseq's ``load_checkpoint_to_cpu`` (once); its callers look it up on the module."""
    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "safe_fairseq_rope_loader", False):
        checkpoint_utils.load_checkpoint_to_cpu = _safe_fairseq_loader(
            checkpoint_utils.load_checkpoint_to_cpu
        )


def load_checkpoint(path: PathLike) -> Dict[str, Any]:
    """Load a fairseq checkpoint to CPU with the safe unpickler, whatever torch's default."""
    with refusing_unsafe(path), open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


allow_fairseq_checkpoint_globals()
install_safe_fairseq_loader()
