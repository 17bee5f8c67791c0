"""A fairseq Transformer of this project as a CTranslate2 ``TransformerSpec``.

Three families, told apart by the model an architecture belongs to:

* ``transformer`` (the sinusoidal and learned rows): CTranslate2's own fairseq converter
  decides the spec (``_get_model_spec``, with its own refusals) and fills it
  (``set_transformer_encoder``/``set_transformer_decoder``), position table included;
* ``transformer_rope``: encoder and decoder specs with rotary self-attention
  (``rotary_dim``, ``rotary_interleave``, ``rotary_base``) and no position table, filled by
  the same converter's per-layer helpers. ``rotary_dim`` must be set on *both* specs: an
  encoder spec without it gets sinusoidal positions from CTranslate2, silently;
* ``transformer_rpe``: relative position representations (Shaw et al.), which CTranslate2
  has with one key and one value table of 2k+1 rows per layer, shared by the heads
  (``relative_position_keys/values``), clipped at ±k like ours, in encoder and decoder
  self-attention alike. Models with per-head tables (the default) are refused, unless every
  head's table is the same (a checkpoint upgraded from shared tables).

RoPE scaling (:mod:`fairseq_rope.rope_scaling`) is carried where CTranslate2 computes it: a
fixed ``linear`` scale as its ``RotaryScalingType.Linear`` (positions divided by S, i.e.
θ_i/S), a fixed ``ntk`` scale as the rescaled base b·S^(d/(d−2)). YaRN (a ramp over the
frequencies and an attention temperature) and the ``dynamic-*`` rules (a scale per sentence)
have no CTranslate2 counterpart and are refused. So is ``transformer_alibi``: CTranslate2 has
ALiBi in its decoder only, and this row biases encoder self-attention too.

Any option of a family that this module does not map (:data:`SUPPORTED_OPTIONS`) must be at
its default, so an option added to a family later (a RoPE scaling mode, say) is refused
until someone maps it, instead of being exported wrong. Options of the stock Transformer
that CTranslate2's Transformer lacks are refused by :func:`check_exportable`.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Callable, Dict, FrozenSet, Mapping, Optional, Tuple

import torch
from torch import nn

from fairseq_rope.deploy import DeployError, require_ctranslate2
from fairseq_rope.models.architectures import EncodingOptions
from fairseq_rope.models.transformer_rope import ROPE_OPTIONS
from fairseq_rope.models.transformer_rpe import RPE_OPTIONS
from fairseq_rope.rope_scaling import SCALINGS, ntk_base

STOCK, ROPE, RPE = "transformer", "transformer_rope", "transformer_rpe"
FAMILIES = (STOCK, ROPE, RPE)

#: A family's options and the ones this module maps onto a CTranslate2 spec; every other
#: option of the family must be at its default.
FAMILY_OPTIONS: Mapping[str, EncodingOptions] = {ROPE: ROPE_OPTIONS, RPE: RPE_OPTIONS}
SUPPORTED_OPTIONS: Mapping[str, FrozenSet[str]] = {
    ROPE: frozenset({"rope_theta", "rope_dim", "rope_layout", "rope_scaling", "rope_scaling_factor",
                     "rope_original_length"}),
    RPE: frozenset({"rpe_max_distance", "rpe_shared_heads"}),
}


#: --rope-scaling values CTranslate2 computes (:func:`rotary_options`).
CT2_ROPE_SCALINGS = ("none", "linear", "ntk")
#: Registered models CTranslate2 cannot compute, and why.
UNEXPORTABLE: Mapping[str, str] = {
    "transformer_alibi": "CTranslate2 has ALiBi only in decoder self-attention "
                         "(TransformerDecoderSpec(alibi=True)); its encoder has no attention bias, and "
                         "transformer_alibi biases encoder self-attention by |i - j| too",
}


class UnsupportedModelError(DeployError):
    """A model that CTranslate2 cannot compute exactly: exporting it would change its outputs."""


def model_family(args: Namespace) -> str:
    """The fairseq model (``transformer``, ``transformer_rope``, …) of ``args.arch``, if exportable."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = getattr(args, "arch", None)
    if arch not in ARCH_MODEL_NAME_REGISTRY:
        raise UnsupportedModelError(f"unknown architecture {arch!r}: not a fairseq or fairseq-rope model")
    family = ARCH_MODEL_NAME_REGISTRY[arch]
    if family in UNEXPORTABLE:
        raise UnsupportedModelError(f"architecture {arch!r} cannot be exported to CTranslate2: {UNEXPORTABLE[family]}")
    if family not in FAMILIES:
        raise UnsupportedModelError(
            f"architecture {arch!r} (model {family!r}) cannot be exported to CTranslate2: the exporter "
            f"knows the models {', '.join(FAMILIES)}"
        )
    return family


def check_exportable(args: Namespace) -> str:
    """Refuse (before any weight is read) a model whose options CTranslate2 cannot represent;
    returns its family."""
    family = model_family(args)
    if family in FAMILY_OPTIONS:
        _refuse_unmapped_options(args, FAMILY_OPTIONS[family], SUPPORTED_OPTIONS[family])
    if family == ROPE:
        _refuse_unmapped_scaling(args)
    ct2_fairseq = _ct2_fairseq()
    problems = []
    if getattr(args, "activation_fn", "relu") not in ct2_fairseq._SUPPORTED_ACTIVATIONS:
        problems.append(f"--activation-fn {args.activation_fn} (CTranslate2 has "
                        f"{', '.join(ct2_fairseq._SUPPORTED_ACTIVATIONS)})")
    for option in ("adaptive_softmax_cutoff", "adaptive_input", "tie_adaptive_weights",
                   "no_cross_attention", "cross_self_attention", "encoder_layers_to_keep",
                   "decoder_layers_to_keep"):
        if getattr(args, option, None):
            problems.append(f"--{option.replace('_', '-')}")
    embed = args.decoder_embed_dim
    for option in ("decoder_input_dim", "decoder_output_dim"):
        if getattr(args, option, embed) != embed:
            problems.append(f"--{option.replace('_', '-')} other than --decoder-embed-dim")
    if problems:
        raise UnsupportedModelError(
            f"architecture {args.arch!r} cannot be exported to CTranslate2: it uses "
            f"{'; '.join(problems)}, which the exporter does not map"
        )
    return family


def _refuse_unmapped_options(args: Namespace, family: EncodingOptions, supported: FrozenSet[str]) -> None:
    """Every option of ``family`` outside ``supported`` at its default (unset counts as default)."""
    for option in family.options:
        value = getattr(args, option.name, None)
        if option.name in supported or value is None or value == option.default:
            continue
        mapped = ", ".join(sorted(o.flag for o in family.options if o.name in supported))
        raise UnsupportedModelError(
            f"{option.flag} {value!r} cannot be exported to CTranslate2: of the {family.title} "
            f"options the exporter maps only {mapped}; CTranslate2 would compute the model as if "
            f"{option.flag} were at its default ({option.default!r})"
        )


def _rope_scaling(args: Namespace) -> str:
    """The model's --rope-scaling (checkpoints from before scaling have none)."""
    return getattr(args, "rope_scaling", None) or "none"


def _refuse_unmapped_scaling(args: Namespace) -> None:
    scaling = _rope_scaling(args)
    if scaling in SCALINGS and scaling not in CT2_ROPE_SCALINGS:  # a bad value fails the model's validation
        lacks = ("a scale per sentence (its rotary scaling is fixed at conversion)" if scaling.startswith("dynamic-")
                 else "YaRN's ramp over the frequencies and its attention temperature")
        raise UnsupportedModelError(
            f"--rope-scaling {scaling} cannot be exported to CTranslate2: it has no {lacks}. The exporter "
            f"carries {', '.join(CT2_ROPE_SCALINGS[1:])} at a fixed --rope-scaling-factor"
        )


def rotary_options(args: Namespace, head_dim: int) -> Dict[str, object]:
    """The rotary arguments of CTranslate2's attention specs for a RoPE model's options."""
    from ctranslate2.specs.attention_spec import RotaryScalingType

    rope_dim = args.rope_dim or head_dim
    # rotary_dim 0: every dimension of the head (CTranslate2's convention); ours is None.
    rotary = {"rotary_dim": args.rope_dim or 0, "rotary_interleave": args.rope_layout == "interleaved",
              "rotary_base": float(args.rope_theta)}
    scaling = _rope_scaling(args)
    if scaling == "linear":  # CTranslate2 divides the positions by the factor: θ_i/S
        rotary.update(rotary_scaling_type=RotaryScalingType.Linear, rotary_scaling_factor=float(args.rope_scaling_factor))
    elif scaling == "ntk":
        rotary["rotary_base"] = ntk_base(float(args.rope_theta), float(args.rope_scaling_factor), rope_dim)
    return rotary


def build_spec(model: nn.Module, args: Namespace, task) -> "object":
    """The CTranslate2 ``TransformerSpec`` of a fairseq model (in eval mode, on CPU) and its task's
    dictionaries, weights filled, vocabularies registered, not yet validated or quantized."""
    family = check_exportable(args)
    model.requires_grad_(False)  # .numpy() refuses tensors that require grad
    with torch.no_grad():
        spec = _BUILDERS[family](model, args)
    _register_vocabularies(spec, task)
    return spec


# ---------------------------------------------------------------- the families


def _stock_spec(model: nn.Module, args: Namespace):
    ct2_fairseq = _ct2_fairseq()
    try:
        spec = ct2_fairseq._get_model_spec(args)
    except ValueError as e:  # CTranslate2's own list of what it does not support
        raise UnsupportedModelError(f"architecture {args.arch!r}: {e}") from None
    ct2_fairseq.set_transformer_encoder(spec.encoder, model.encoder)
    ct2_fairseq.set_transformer_decoder(spec.decoder, model.decoder)
    return spec


def _rope_spec(model: nn.Module, args: Namespace):
    spec = _position_free_spec(model, args, *(rotary_options(args, side.layers[0].self_attn.head_dim)
                                               for side in (model.encoder, model.decoder)))
    _fill_position_free(spec, model)
    return spec


def _rpe_spec(model: nn.Module, args: Namespace):
    relative = {"relative_position": True}
    spec = _position_free_spec(model, args, relative, relative)
    _fill_position_free(spec, model)
    for side in ("encoder", "decoder"):
        for i, (layer_spec, layer) in enumerate(zip(getattr(spec, side).layer, getattr(model, side).layers)):
            encoding = layer.self_attn.position_encoding
            attention = layer_spec.self_attention
            attention.relative_position_keys = _shared_table(encoding.key_embeddings.weight, side, i, "key")
            attention.relative_position_values = _shared_table(encoding.value_embeddings.weight, side, i, "value")
    return spec


_BUILDERS: Dict[str, Callable[[nn.Module, Namespace], object]] = {
    STOCK: _stock_spec, ROPE: _rope_spec, RPE: _rpe_spec,
}


def _shared_table(weight: torch.Tensor, side: str, layer: int, kind: str):
    """A (2k+1, head_dim) table: shared already, or per head with every head the same."""
    if weight.dim() == 3:
        if not bool((weight == weight[:1]).all()):
            raise UnsupportedModelError(
                f"transformer_rpe with relative tables per head cannot be exported to CTranslate2: "
                f"its relative position representations have one key and one value table per "
                f"layer, shared by all heads, and the {kind} tables of {side} layer {layer} differ "
                f"between the {weight.size(0)} heads. Models trained with --rpe-shared-heads "
                f"(the transformer_rpe_wmt_en_de_big default) export"
            )
        weight = weight[0]
    return weight.numpy()


def _position_free_spec(model: nn.Module, args: Namespace, encoder_positions: Mapping[str, object],
                        decoder_positions: Mapping[str, object]):
    """Encoder and decoder specs of a model whose positions live in self-attention only."""
    require_ctranslate2()
    from ctranslate2.specs import transformer_spec

    activation = _ct2_fairseq()._SUPPORTED_ACTIVATIONS[getattr(args, "activation_fn", "relu")]
    layernorm_embedding = bool(getattr(args, "layernorm_embedding", False))
    encoder = transformer_spec.TransformerEncoderSpec(
        len(model.encoder.layers), args.encoder_attention_heads, pre_norm=args.encoder_normalize_before,
        activation=activation, layernorm_embedding=layernorm_embedding, **encoder_positions)
    decoder = transformer_spec.TransformerDecoderSpec(
        len(model.decoder.layers), args.decoder_attention_heads, pre_norm=args.decoder_normalize_before,
        activation=activation, layernorm_embedding=layernorm_embedding,
        no_final_norm=bool(getattr(args, "no_decoder_final_norm", False)), **decoder_positions)
    return transformer_spec.TransformerSpec(encoder, decoder)


def _fill_position_free(spec, model: nn.Module) -> None:
    """Weights of a model without position tables, by CTranslate2's fairseq helpers (their
    ``set_transformer_encoder``/``decoder`` would also read ``embed_positions``, which is None)."""
    ct2_fairseq = _ct2_fairseq()
    for side, set_layer in (("encoder", ct2_fairseq.set_transformer_encoder_layer),
                            ("decoder", ct2_fairseq.set_transformer_decoder_layer)):
        side_spec, module = getattr(spec, side), getattr(model, side)
        ct2_fairseq.set_embeddings(side_spec.embeddings[0] if side == "encoder" else side_spec.embeddings,
                                   module.embed_tokens)
        side_spec.scale_embeddings = module.embed_scale
        for layer_spec, layer in zip(side_spec.layer, module.layers):
            set_layer(layer_spec, layer)
        for norm in ("layer_norm", "layernorm_embedding"):
            if getattr(module, norm, None) is not None:
                ct2_fairseq.set_layer_norm(getattr(side_spec, norm), getattr(module, norm))
    ct2_fairseq.set_linear(spec.decoder.projection, model.decoder.output_projection)


# ---------------------------------------------------------------- vocabularies


def _register_vocabularies(spec, task) -> None:
    """fairseq's dictionaries as CTranslate2 vocabularies (``<pad>`` named ``<blank>`` by the
    converter), with fairseq's special tokens: decoding starts from ``</s>``, sources end with it."""
    vocab = _ct2_fairseq()._get_vocab
    source, target = task.source_dictionary, task.target_dictionary
    specials = _special_tokens(target)
    if _special_tokens(source) != specials:
        raise UnsupportedModelError(f"the source and target dictionaries have different special symbols "
                                    f"({_special_tokens(source)} vs {specials})")
    spec.register_source_vocabulary(vocab(source))
    spec.register_target_vocabulary(vocab(target))
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = specials
    spec.config.decoder_start_token = spec.config.eos_token  # as CTranslate2's fairseq converter
    spec.config.add_source_eos = True


def _special_tokens(dictionary) -> Tuple[str, str, str]:
    return dictionary.unk_word, dictionary.bos_word, dictionary.eos_word


def pad_token(dictionary) -> str:
    """What ``<pad>`` is called in the exported vocabulary."""
    return _ct2_fairseq()._get_vocab(dictionary)[dictionary.pad()]


def _ct2_fairseq():
    require_ctranslate2()
    from ctranslate2.converters import fairseq as ct2_fairseq

    return ct2_fairseq


def max_positions(args: Namespace, family: str) -> Tuple[Optional[int], Optional[int]]:
    """(source, target) positions of the model's position tables; None: no table, no limit."""
    if family != STOCK:
        return None, None
    return int(args.max_source_positions), int(args.max_target_positions)
