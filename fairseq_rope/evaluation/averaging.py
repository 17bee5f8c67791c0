"""Checkpoint averaging (Vaswani et al.: the last N checkpoints' parameters, averaged).

The plugin's own version of fairseq's ``scripts/average_checkpoints.py`` (pip
does not install fairseq's scripts): it picks checkpoints by fairseq's naming
(``checkpoint_<epoch>_<update>.pt`` every ``--save-interval-updates``,
``checkpoint<epoch>.pt`` at epoch ends), sorted numerically. Compared with
fairseq's script it

* loads with the safe unpickler (:func:`fairseq_rope.checkpoints.load_checkpoint`);
* checks that all checkpoints are of one architecture (name, dimensions and
  position-encoding options), of one vocabulary and have the same parameter
  names and shapes, and reports an unreadable or truncated file by name;
* averages floating-point tensors in float64 and casts back to each tensor's
  dtype (fp16 weights are not summed in fp16), and copies non-float tensors
  (e.g. ``version`` buffers) after checking they agree, instead of averaging them;
* keeps tied parameters tied: entries that share one tensor in the newest
  checkpoint (``--share-all-embeddings`` stores the embedding three times, as
  encoder/decoder ``embed_tokens`` and ``output_projection``) are averaged once
  and saved as one tensor, so the file holds it once and parameter counts stay right;
* keeps the newest checkpoint's other entries (args, cfg, extra_state, ...) but
  drops ``last_optimizer_state``, which is useless for decoding and is twice
  the size of the model with Adam;
* writes the output atomically (a temporary file in the same directory, then
  ``os.replace``), so a failure never leaves a partial or stale-looking file,
  and refuses to replace an existing output unless asked to (``--force``).
"""

from __future__ import annotations

import argparse
import pickle
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import torch

from fairseq_rope.base import FairseqRopeError, PathLike, atomic_path, report_error
from fairseq_rope.checkpoints import UNREADABLE, load_checkpoint

Kind = Literal["update", "epoch"]

UPDATE_CHECKPOINT = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")
# Entries not carried into the averaged checkpoint.
DROPPED_ENTRIES = ("last_optimizer_state",)
# Model options that define what the parameters mean (dimensions are also in
# the shapes, but RoPE's theta or layout are not); regularization is left out.
ARCHITECTURE_OPTIONS = ("arch", "activation_fn", "position_encoding", "no_scale_embedding",
                        "layernorm_embedding", "cross_self_attention")
ARCHITECTURE_PREFIXES = ("encoder_", "decoder_", "rope_", "rpe_", "share_")
# One row per dictionary entry: a shape mismatch here is a different vocabulary.
VOCABULARY_PARAMETERS = ("embed_tokens.weight", "output_projection.weight")
NOT_ARCHITECTURE = re.compile(r"dropout|layerdrop|_path$")


class AveragingError(FairseqRopeError, ValueError):
    """Checkpoints that cannot be selected or averaged."""


@dataclass(frozen=True, order=True)
class CheckpointFile:
    """A checkpoint found on disk; orders by (update, epoch) for update checkpoints, epoch otherwise."""

    sort_key: Tuple[int, ...]
    path: Path

    @property
    def number(self) -> int:
        """The update (update checkpoints) or epoch (epoch checkpoints) number."""
        return self.sort_key[0]


def find_checkpoints(directory: PathLike, kind: Kind) -> List[CheckpointFile]:
    """fairseq's update or epoch checkpoints in ``directory``, oldest first (numeric order)."""
    found = []
    for path in Path(directory).iterdir():
        if kind == "update":
            m = UPDATE_CHECKPOINT.fullmatch(path.name)
            key = (int(m.group(2)), int(m.group(1))) if m else None
        elif kind == "epoch":
            m = EPOCH_CHECKPOINT.fullmatch(path.name)
            key = (int(m.group(1)),) if m else None
        else:
            raise ValueError(f"unknown checkpoint kind {kind!r}")
        if key is not None and path.is_file():
            found.append(CheckpointFile(key, path))
    return sorted(found)


def last_checkpoints(
    directory: PathLike,
    num: int,
    kind: Union[Kind, Literal["auto"]] = "update",
    upper_bound: Optional[int] = None,
) -> List[Path]:
    """The last ``num`` checkpoints of a kind, oldest first.

    ``kind="auto"`` uses update checkpoints if there are any, else epoch ones.
    ``upper_bound`` excludes checkpoints past that update (epoch) number.
    """
    if num < 1:
        raise AveragingError(f"the number of checkpoints to average must be >= 1, not {num}")
    if not Path(directory).is_dir():
        raise AveragingError(f"no such checkpoint directory: {directory}")
    if kind == "auto":
        kind = "update" if find_checkpoints(directory, "update") else "epoch"
    candidates = [
        c for c in find_checkpoints(directory, kind)
        if upper_bound is None or c.number <= upper_bound
    ]
    if len(candidates) < num:
        pattern = "checkpoint_<epoch>_<update>.pt" if kind == "update" else "checkpoint<epoch>.pt"
        bound = f" up to {kind} {upper_bound}" if upper_bound is not None else ""
        found = ", ".join(c.path.name for c in candidates) or "none"
        raise AveragingError(
            f"asked for the last {num} {kind} checkpoints ({pattern}){bound} in {directory}, "
            f"found {len(candidates)}: {found}"
        )
    return [c.path for c in candidates[-num:]]


def average_checkpoints(paths: Sequence[PathLike]) -> Dict[str, Any]:
    """Average the ``model`` parameters of ``paths``; other entries come from the last (newest) path.

    Checkpoints are loaded one at a time, so memory holds one checkpoint plus
    the float64 sums.
    """
    if not paths:
        raise AveragingError("no checkpoints to average")
    newest = Path(paths[-1])
    state = _load(newest)
    reference = _model_state(state, newest)
    reference_arch = architecture(state)
    state = {k: v for k, v in state.items() if k not in DROPPED_ENTRIES}
    aliases = tied_aliases(reference)
    # copy=True: .double() of a float64 tensor would alias (and then mutate) the reference.
    sums = {
        k: v.to(torch.float64, copy=True)
        for k, v in reference.items() if _is_float_tensor(v) and k not in aliases
    }
    for path in map(Path, paths[:-1]):
        other = _load(path)
        _check_same_architecture(architecture(other), path, reference_arch, newest)
        model = _model_state(other, path)
        _check_compatible(model, path, reference, newest)
        for key, total in sums.items():
            total += model[key].double()

    averaged = {
        key: (sums[key] / len(paths)).to(value.dtype) if key in sums else value
        for key, value in reference.items()
    }
    for alias, key in aliases.items():
        averaged[alias] = averaged[key]
    return {**state, "model": averaged}


def tied_aliases(model: Mapping[str, Any]) -> Dict[str, str]:
    """``{alias: key}`` for state-dict entries that are the same tensor as an earlier ``key``.

    Tied parameters are one tensor under several names; ``torch.save``/``load``
    keep that sharing, so equal storage, offset, shape and strides identify them.
    """
    first: Dict[Tuple[Any, ...], str] = {}
    aliases: Dict[str, str] = {}
    for key, value in model.items():
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        identity = (value.untyped_storage().data_ptr(), value.storage_offset(),
                    tuple(value.shape), value.stride())
        if identity in first:
            aliases[key] = first[identity]
        else:
            first[identity] = key
    return aliases


def _load(path: Path) -> Dict[str, Any]:
    try:
        return load_checkpoint(path)
    except UNREADABLE as e:
        # A safe-loading refusal explains itself; the rest are damaged files.
        hint = "" if isinstance(e, (OSError, pickle.UnpicklingError)) else (
            "; the file is truncated or corrupt (e.g. a run killed while saving it): delete it, "
            "or exclude it with --checkpoint-upper-bound")
        raise AveragingError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}{hint}") from None


def architecture(state: Mapping[str, Any]) -> Dict[str, Any]:
    """The architecture-defining model options of a checkpoint (``cfg.model``, else ``args``)."""
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, Mapping) else None
    if model is None:
        model = state.get("args")
    if isinstance(model, argparse.Namespace):
        model = vars(model)
    if not isinstance(model, Mapping):
        return {}
    return {
        key: value for key, value in model.items()
        if isinstance(key, str) and not NOT_ARCHITECTURE.search(key)
        and (key in ARCHITECTURE_OPTIONS or key.startswith(ARCHITECTURE_PREFIXES))
    }


def _check_same_architecture(
    arch: Mapping[str, Any], path: Path, reference: Mapping[str, Any], reference_path: Path
) -> None:
    for key in sorted(set(arch) | set(reference)):
        if arch.get(key) != reference.get(key):
            raise AveragingError(
                f"{path} and {reference_path} are of different architectures "
                f"({key} = {arch.get(key)!r} vs {reference.get(key)!r}); average checkpoints "
                "of one training run only"
            )


def _model_state(state: Any, path: Path) -> Mapping[str, Any]:
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AveragingError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state["model"]


def _is_float_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _check_compatible(
    model: Mapping[str, Any], path: Path, reference: Mapping[str, Any], reference_path: Path
) -> None:
    """Same keys, shapes and kinds as the reference; non-float entries equal (they are copied)."""
    missing = [k for k in reference if k not in model]
    extra = [k for k in model if k not in reference]
    if missing or extra:
        key, what = (missing[0], "lacks") if missing else (extra[0], "has extra")
        raise AveragingError(
            f"{path} {what} parameter {key!r} compared with {reference_path} "
            f"({len(missing)} missing, {len(extra)} extra)"
        )
    for key, ref in reference.items():
        value = model[key]
        if isinstance(ref, torch.Tensor) != isinstance(value, torch.Tensor):
            raise AveragingError(f"{path}: {key!r} is a tensor in only one of it and {reference_path}")
        if not isinstance(ref, torch.Tensor):
            if value != ref:
                raise AveragingError(f"{path}: non-tensor entry {key!r} differs from {reference_path}")
            continue
        if value.shape != ref.shape and key.endswith(VOCABULARY_PARAMETERS):
            raise AveragingError(
                f"{path} and {reference_path} have different vocabularies: {key!r} has "
                f"{value.shape[0]} rows, but {ref.shape[0]} in {reference_path}; checkpoints "
                "trained on different data-bin dictionaries cannot be averaged"
            )
        if value.shape != ref.shape:
            raise AveragingError(
                f"{path}: parameter {key!r} has shape {tuple(value.shape)}, "
                f"but {tuple(ref.shape)} in {reference_path}"
            )
        if value.is_floating_point() != ref.is_floating_point():
            raise AveragingError(
                f"{path}: {key!r} is {value.dtype}, but {ref.dtype} in {reference_path}"
            )
        if not ref.is_floating_point() and not torch.equal(value, ref):
            raise AveragingError(
                f"{path}: non-float tensor {key!r} differs from {reference_path}; "
                "it is copied, not averaged, so it must be equal in all checkpoints"
            )


def save_atomically(state: Mapping[str, Any], output: PathLike) -> None:
    """``torch.save`` to a temporary file beside ``output``, then rename it over ``output``."""
    with atomic_path(output) as tmp:
        torch.save(state, tmp)


def average_last_checkpoints(
    directory: PathLike,
    output: PathLike,
    num: int,
    kind: Union[Kind, Literal["auto"]] = "update",
    upper_bound: Optional[int] = None,
    force: bool = False,
) -> List[Path]:
    """Average the last ``num`` checkpoints of ``directory`` into ``output``; returns the inputs.

    An existing ``output`` is replaced only with ``force``.
    """
    if Path(output).exists() and not force:
        raise AveragingError(
            f"output {output} already exists; pass --force to replace it, or choose another --output"
        )
    paths = last_checkpoints(directory, num, kind, upper_bound)
    if Path(output).resolve() in {p.resolve() for p in paths}:
        raise AveragingError(f"--output {output} is one of the checkpoints to average")
    save_atomically(average_checkpoints(paths), output)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line of ``scripts/average_checkpoints.py``."""
    parser = argparse.ArgumentParser(
        description="Average the last N fairseq checkpoints of a directory into one file. "
        "Prints the averaged checkpoints, oldest first, one per line.",
    )
    parser.add_argument("--inputs", required=True, metavar="DIR", help="checkpoint directory")
    parser.add_argument("--output", required=True, metavar="FILE", help="averaged checkpoint to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--num-update-checkpoints", type=int, metavar="N",
                       help="average the last N checkpoint_<epoch>_<update>.pt")
    which.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                       help="average the last N checkpoint<epoch>.pt")
    which.add_argument("--num-checkpoints", type=int, metavar="N",
                       help="the last N update checkpoints if there are any, else epoch checkpoints")
    parser.add_argument("--checkpoint-upper-bound", type=int, metavar="N",
                        help="ignore checkpoints after update (epoch) N")
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)

    if args.num_update_checkpoints is not None:
        num, kind = args.num_update_checkpoints, "update"
    elif args.num_epoch_checkpoints is not None:
        num, kind = args.num_epoch_checkpoints, "epoch"
    else:
        num, kind = args.num_checkpoints, "auto"
    try:
        paths = average_last_checkpoints(
            args.inputs, args.output, num, kind, args.checkpoint_upper_bound, args.force
        )
    except AveragingError as e:
        return report_error(e)
    print(f"averaged {len(paths)} checkpoints into {args.output}", file=sys.stderr)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
