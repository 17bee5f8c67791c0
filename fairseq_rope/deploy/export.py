"""``fairseq-rope-export-ct2 CHECKPOINT OUT_DIR``: a checkpoint as a self-contained CTranslate2 model.

::

    fairseq-rope-export-ct2 CHECKPOINT OUT_DIR [--data DATA_BIN] [--bpe-codes FILE]
        [--source-lang SRC --target-lang TGT] [--quantization int8|int8_float32|float16|…]
        [--model-overrides "{'rope_scaling': 'linear', 'rope_scaling_factor': 2.0}"] [--force]

CHECKPOINT is any checkpoint of a fairseq-rope run (``checkpoint_avg_last5.pt`` included),
loaded with the safe unpickler. ``--data`` is the fairseq-preprocess directory the model was
trained on (default: the one its checkpoint names, relative to the working directory, as
fairseq-train was given it); its ``dict.SRC.txt``/``dict.TGT.txt`` are the vocabularies.
``--bpe-codes`` defaults to ``DATA_BIN/../bpe/codes``, where ``fairseq-rope-prepare`` puts
them. Both dictionaries, the codes and the tokenization settings are copied into OUT_DIR
(``fairseq_rope_serve.model_dir``), so that ``fairseq-rope-translate OUT_DIR`` needs
nothing else. ``--model-overrides`` changes model options before the export, as
fairseq-generate's does (a Python dict literal, read with ``ast.literal_eval``): a RoPE
scaling chosen for long inputs, for instance, on a checkpoint trained without one.

Before OUT_DIR appears, the float32 export is checked against the fairseq model: forced
decoding of a probe batch (mixed lengths, up to :data:`PROBE_LENGTHS`) must give the same
log-probabilities within :data:`TOLERANCE`, so that whatever the exporter does not know about
a model fails here rather than in production. OUT_DIR is written atomically: a failed export
leaves no directory, and an existing one is kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from fairseq_rope_serve.model_dir import BPE_CODES, ModelDirectory
from fairseq_rope_serve.text import TOKENIZER_OPTIONS

from fairseq_rope import base
from fairseq_rope.base import TABLE_DECODING, FairseqRopeError, PathLike, report_error
from fairseq_rope.checkpoints import UNREADABLE, load_checkpoint
from fairseq_rope.data.data_bin import DataBinError, infer_language_pair
from fairseq_rope.deploy import DeployError, require_ctranslate2, spec as specs

#: Largest difference of a forced-decoding log-probability allowed between the fairseq model
#: and its float32 export (measured: about 1e-5 on the tiny models, fp32 rounding).
TOLERANCE = 1e-3
#: Source and target lengths (subwords) of the verification probe: one sentence each.
PROBE_LENGTHS = ((1, 3), (6, 1), (17, 11), (9, 24))
#: ``bpe_codes`` default: DATA_BIN/../bpe/codes (fairseq-rope-prepare's layout).
AUTO = "auto"


def default_bpe_codes(data_bin: PathLike) -> Path:
    """Where fairseq-rope-prepare puts the BPE codes of DATA/data-bin: DATA/bpe/codes."""
    return Path(data_bin).resolve().parent / "bpe" / "codes"


def export_checkpoint(
    checkpoint: PathLike,
    out_dir: PathLike,
    *,
    data_bin: Optional[PathLike] = None,
    bpe_codes: Union[PathLike, None, str] = AUTO,
    source_lang: Optional[str] = None,
    target_lang: Optional[str] = None,
    quantization: Optional[str] = None,
    model_overrides: Optional[Mapping[str, Any]] = None,
    force: bool = False,
    verify: bool = True,
) -> ModelDirectory:
    """Export ``checkpoint`` to the CTranslate2 model directory ``out_dir``; returns its settings.

    ``bpe_codes``: a subword-nmt codes file, ``"auto"`` (``DATA_BIN/../bpe/codes``, which must
    exist) or None (no codes: the directory can decode binarized data, not raw text).
    Raises a :class:`~fairseq_rope.base.FairseqRopeError` (nothing written) for an existing
    ``out_dir`` without ``force``, an unreadable or unsafe checkpoint, missing dictionaries or
    codes, and any model CTranslate2 cannot compute exactly.
    """
    ctranslate2 = require_ctranslate2()
    out_dir = Path(out_dir)
    if (out_dir.exists() or out_dir.is_symlink()) and not force:
        raise DeployError(f"{out_dir} exists: pass --force to replace it")
    _check_quantization(quantization)
    state = _load(Path(checkpoint))
    args = _model_args(state, checkpoint, model_overrides or {})
    family = specs.check_exportable(args)
    data_bin, source_lang, target_lang = _data(state, args, data_bin, source_lang, target_lang)
    codes = _bpe_codes(bpe_codes, data_bin)
    model, task = _build_model(state, args, data_bin, source_lang, target_lang, checkpoint)

    def build():
        spec = specs.build_spec(model, args, task)
        for lang in dict.fromkeys((source_lang, target_lang)):
            spec.register_file(str(data_bin / f"dict.{lang}.txt"))
        if codes is not None:
            spec.register_file(str(codes), BPE_CODES)
        return spec

    source_positions, target_positions = specs.max_positions(args, family)
    settings = ModelDirectory(
        source_lang=source_lang, target_lang=target_lang, architecture=args.arch, family=family,
        pad_token=specs.pad_token(task.target_dictionary), eos_token=task.target_dictionary.eos_word,
        max_source_positions=source_positions, max_target_positions=target_positions,
        tokenizer={"moses": True, "lang": source_lang, "detokenizer_lang": target_lang, **TOKENIZER_OPTIONS},
        bpe_codes=BPE_CODES if codes is not None else None, bpe_separator="@@",
        decoding=dict(TABLE_DECODING), quantization=quantization,
        provenance=_provenance(checkpoint, args, family, data_bin, codes, ctranslate2.__version__),
    )
    with base.atomic_directory(out_dir) as tmp:
        _convert(build, tmp)
        if verify:
            verify_export(model, task, tmp)
        if quantization not in (None, "float32"):
            _convert(build, tmp, quantization)  # a fresh spec: quantization changes it in place
        settings.write(tmp)
    return settings


def _convert(build, directory: Path, quantization: Optional[str] = None) -> None:
    """CTranslate2's Converter (validation, quantization, saving) over the spec ``build()`` makes."""
    require_ctranslate2()
    from ctranslate2.converters.converter import Converter

    class SpecConverter(Converter):
        def _load(self):
            return build()

    SpecConverter().convert(str(directory), quantization=quantization, force=True)


def _check_quantization(quantization: Optional[str]) -> None:
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise DeployError(f"--quantization {quantization!r}: expected one of {', '.join(ACCEPTED_MODEL_TYPES)}")


def _load(path: Path) -> Dict[str, Any]:
    """The checkpoint, loaded safely; its unreadability or unsafety as a FairseqRopeError."""
    if not path.is_file():
        raise DeployError(f"{path}: no such checkpoint")
    try:
        state = load_checkpoint(path)
    except FairseqRopeError:
        raise  # refused by the safe unpickler: it says why
    except UNREADABLE as e:
        raise DeployError(f"cannot read checkpoint {path} ({type(e).__name__}: {e}): it is truncated, "
                          "corrupt or not a checkpoint") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise DeployError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def _model_args(state: Dict[str, Any], path: PathLike, overrides: Mapping[str, Any]) -> Namespace:
    """A copy of the checkpoint's model options (fairseq-train's ``cfg.model``, or old ``args``),
    ``overrides`` applied."""
    cfg = state.get("cfg")
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = args if args is not None else state.get("args")
    if not isinstance(args, Namespace) or not getattr(args, "arch", None):
        raise DeployError(f"{path}: the checkpoint has no model options (cfg.model or args with an --arch)")
    args = copy.deepcopy(args)
    known = set(vars(args)) | {option.name for family in specs.FAMILY_OPTIONS.values() for option in family.options}
    for name, value in overrides.items():
        if name not in known:
            raise DeployError(f"--model-overrides: {name!r} is not an option of this model")
        setattr(args, name, value)
    return args


def _data(state: Dict[str, Any], args: Namespace, data_bin: Optional[PathLike],
          source_lang: Optional[str], target_lang: Optional[str]) -> Tuple[Path, str, str]:
    """The data directory and the languages: given, else as the checkpoint says, else inferred."""
    task = state["cfg"].get("task") if isinstance(state.get("cfg"), dict) else None
    task = task or {}
    named = task.get("data") if isinstance(task, dict) else None
    named = named or getattr(args, "data", None)
    if data_bin is None:
        if not named or not Path(str(named).split(":")[0]).is_dir():
            raise DeployError(f"the checkpoint's data directory {named!r} is not here (it is relative to "
                              "where fairseq-train ran): pass --data DATA_BIN")
        data_bin = str(named).split(":")[0]
    data_bin = Path(data_bin)
    if not data_bin.is_dir():
        raise DeployError(f"--data {data_bin}: no such directory")
    source_lang = source_lang or task.get("source_lang") or getattr(args, "source_lang", None)
    target_lang = target_lang or task.get("target_lang") or getattr(args, "target_lang", None)
    if not (source_lang and target_lang):
        source_lang, target_lang = _infer_languages(data_bin, source_lang, target_lang)
    for lang in (source_lang, target_lang):
        if not (data_bin / f"dict.{lang}.txt").is_file():
            raise DeployError(f"missing dictionary {data_bin / f'dict.{lang}.txt'}: --data must be the "
                              "fairseq-preprocess directory the model was trained on")
    return data_bin, source_lang, target_lang


def _infer_languages(data_bin: Path, source: Optional[str], target: Optional[str]) -> Tuple[str, str]:
    for subset in ("train", "valid", "test"):
        try:
            return infer_language_pair(data_bin, subset)
        except DataBinError:
            continue
    raise DeployError(f"cannot tell the languages of {data_bin} (no binarized subset): pass "
                      "--source-lang and --target-lang")


def _bpe_codes(bpe_codes: Union[PathLike, None, str], data_bin: Path) -> Optional[Path]:
    if bpe_codes is None:
        return None
    codes = default_bpe_codes(data_bin) if bpe_codes == AUTO else Path(bpe_codes)
    if not codes.is_file():
        hint = " (the default, DATA_BIN/../bpe/codes)" if bpe_codes == AUTO else ""
        raise DeployError(f"no BPE codes at {codes}{hint}: pass --bpe-codes FILE, the subword-nmt codes "
                          "the training data were segmented with")
    return codes


def _build_model(state: Dict[str, Any], args: Namespace, data_bin: Path, source_lang: str,
                 target_lang: str, checkpoint: PathLike):
    """The fairseq model of the checkpoint, weights loaded, in eval mode; and its task."""
    from fairseq import tasks
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args.data, args.source_lang, args.target_lang = str(data_bin), source_lang, target_lang
    try:
        ARCH_CONFIG_REGISTRY[args.arch](args)  # options newer than the checkpoint: their defaults
        task = tasks.setup_task(args)
        model = task.build_model(args)
    except (ValueError, KeyError) as e:
        raise DeployError(f"{checkpoint}: cannot build its model ({e})") from None
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=args)
    except RuntimeError as e:
        raise DeployError(f"{checkpoint} does not fit its architecture with the dictionaries of "
                          f"{data_bin} (is it the data the model was trained on?): {e}") from None
    return model.float().eval(), task


# ---------------------------------------------------------------- verification


def verify_export(model: torch.nn.Module, task, model_dir: PathLike, tolerance: float = TOLERANCE) -> float:
    """Forced-decoding log-probabilities of a probe batch by ``model`` and by the CTranslate2
    model in ``model_dir`` (float32); the largest difference, or an
    :class:`~fairseq_rope.deploy.spec.UnsupportedModelError` above ``tolerance``."""
    ctranslate2 = require_ctranslate2()
    sources, targets = probe_batch(task)
    reference = forced_log_probs(model, task, sources, targets)
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type="float32", intra_threads=1)
    results = translator.score_batch(
        [_strings(task.source_dictionary, s) for s in sources],
        [_strings(task.target_dictionary, t) for t in targets], max_input_length=0)
    worst = 0.0
    for expected, result in zip(reference, results):
        got = torch.tensor(result.log_probs, dtype=torch.float64)
        if got.shape != expected.shape:
            raise specs.UnsupportedModelError(f"CTranslate2 scored {got.numel()} target tokens, fairseq "
                                              f"{expected.numel()}: the export is not this model")
        worst = max(worst, float((got - expected).abs().max()))
    if not worst <= tolerance:
        raise specs.UnsupportedModelError(
            f"the CTranslate2 model does not compute what the fairseq model computes: forced-decoding "
            f"log-probabilities differ by up to {worst:.3g} (tolerance {tolerance:g}) on a probe batch, "
            "so the model uses something the exporter does not map; nothing was written")
    return worst


def probe_batch(task, lengths: Sequence[Tuple[int, int]] = PROBE_LENGTHS) -> Tuple[List[List[int]], List[List[int]]]:
    """Sources and targets of ``lengths`` (without EOS), of ordinary symbols, drawn with a fixed seed."""
    generator = torch.Generator().manual_seed(0)

    def draw(dictionary, n: int) -> List[int]:
        ids = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator)
        return ids.tolist()

    sources = [draw(task.source_dictionary, s) for s, _ in lengths]
    targets = [draw(task.target_dictionary, t) for _, t in lengths]
    return sources, targets


def forced_log_probs(model: torch.nn.Module, task, sources: Sequence[List[int]],
                     targets: Sequence[List[int]]) -> List[torch.Tensor]:
    """log p(target token | source, prefix) by the fairseq model, for each target token and EOS
    (what CTranslate2's ``score_batch`` returns), one unpadded sentence at a time."""
    eos = task.target_dictionary.eos()
    out = []
    with torch.no_grad():
        for source, target in zip(sources, targets):
            src = torch.tensor([source + [task.source_dictionary.eos()]])
            prev = torch.tensor([[eos] + target])
            logits, _ = model(src, torch.tensor([src.size(1)]), prev)
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)[0].double()
            out.append(lprobs.gather(-1, torch.tensor(target + [eos])[:, None])[:, 0])
    return out


def _strings(dictionary, ids: Sequence[int]) -> List[str]:
    return [dictionary[i] for i in ids]


def _provenance(checkpoint: PathLike, args: Namespace, family: str, data_bin: Path,
                codes: Optional[Path], ct2_version: str) -> Dict[str, Any]:
    options = {name: getattr(args, name, None) for name in sorted(vars(args))
               if name.startswith(("rope_", "rpe_")) or name in (
                   "encoder_learned_pos", "decoder_learned_pos", "encoder_normalize_before",
                   "decoder_normalize_before", "share_all_embeddings")}
    return {
        "checkpoint": str(Path(checkpoint).resolve()),
        "data": str(data_bin.resolve()),
        "bpe_codes": str(codes.resolve()) if codes is not None else None,
        "options": options,
        "ctranslate2": ct2_version,
        "git_commit": base.git_commit(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------- command line


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fairseq-rope-export-ct2",
        description="Export a fairseq-rope checkpoint (transformer_rope, the stock sinusoidal and "
        "learned Transformer, transformer_rpe with shared tables) to a self-contained CTranslate2 "
        "model directory: model, dictionaries, BPE codes and tokenization settings.")
    parser.add_argument("checkpoint", type=Path, help="e.g. SAVE_DIR/checkpoint_avg_last5.pt")
    parser.add_argument("out_dir", type=Path, help="the model directory to write")
    parser.add_argument("--data", type=Path, help="fairseq-preprocess directory the model was trained on "
                        "(default: the checkpoint's, relative to the working directory)")
    parser.add_argument("--bpe-codes", type=Path, help="subword-nmt codes (default: DATA/../bpe/codes)")
    parser.add_argument("--source-lang", help="default: the checkpoint's, else inferred from --data")
    parser.add_argument("--target-lang", help="default: the checkpoint's, else inferred from --data")
    parser.add_argument("--quantization", help="weights' type: int8, int8_float32, int8_float16, int16, "
                        "float16, bfloat16, float32 (default: as trained, float32)")
    parser.add_argument("--model-overrides", type=_overrides, default={}, metavar="DICT",
                        help="model options to change, a Python dict literal as fairseq-generate's, e.g. "
                        "\"{'rope_scaling': 'ntk', 'rope_scaling_factor': 2.0}\"")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    return parser.parse_args(argv)


def _overrides(text: str) -> Dict[str, Any]:
    try:
        overrides = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        overrides = None
    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
        raise argparse.ArgumentTypeError(f"expected a dict literal of option names, got {text!r}")
    return overrides


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = export_checkpoint(
            args.checkpoint, args.out_dir, data_bin=args.data,
            bpe_codes=args.bpe_codes if args.bpe_codes is not None else AUTO,
            source_lang=args.source_lang, target_lang=args.target_lang,
            quantization=args.quantization, model_overrides=args.model_overrides, force=args.force)
    except FairseqRopeError as e:
        return report_error(e)
    print(f"exported {settings.architecture} ({settings.source_lang}->{settings.target_lang}, "
          f"{settings.quantization or 'float32'}) to {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
