"""``transformer_rpe``: the Transformer with Shaw et al. (2018) relative position
representations in encoder and decoder self-attention, and no absolute
position embeddings — the "RPE" row of the RoFormer table."""

from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    tiny_architecture,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)

from fairseq_rope.models.positional_transformer import (
    PositionalTransformerModel,
    register_position_encoding,
)
from fairseq_rope.relative import DEFAULT_MAX_DISTANCE, RelativePositionEncoding, validate_rpe_options


@register_position_encoding("rpe")
def build_relative_encoding(cfg, head_dim: int) -> RelativePositionEncoding:
    return RelativePositionEncoding(head_dim, cfg.rpe_max_distance)


@register_model("transformer_rpe")
class TransformerRpeModel(PositionalTransformerModel):
    """Transformer with learned relative position representations (keys and values)."""

    position_encoding = "rpe"

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument_group("relative position representations").add_argument(
            "--rpe-max-distance", type=int, metavar="K",
            help=f"clip relative distances at ±K (default {DEFAULT_MAX_DISTANCE}, Shaw et al.'s k)",
        )


def rpe_defaults(args) -> None:
    if getattr(args, "rpe_max_distance", None) is None:
        args.rpe_max_distance = DEFAULT_MAX_DISTANCE


@register_model_architecture("transformer_rpe", "transformer_rpe")
def transformer_rpe(args):
    rpe_defaults(args)
    transformer_wmt_en_de(args)
    validate_rpe_options(args.rpe_max_distance)


@register_model_architecture("transformer_rpe", "transformer_rpe_wmt_en_de")
def transformer_rpe_wmt_en_de(args):
    transformer_rpe(args)


@register_model_architecture("transformer_rpe", "transformer_rpe_wmt_en_de_big")
def transformer_rpe_wmt_en_de_big(args):
    rpe_defaults(args)
    transformer_wmt_en_de_big(args)
    validate_rpe_options(args.rpe_max_distance)


@register_model_architecture("transformer_rpe", "transformer_rpe_tiny")
def transformer_rpe_tiny(args):
    rpe_defaults(args)
    tiny_architecture(args)
    validate_rpe_options(args.rpe_max_distance)
