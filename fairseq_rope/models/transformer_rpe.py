"""``transformer_rpe``: the Transformer with Shaw et al. (2018) relative position
representations in encoder and decoder self-attention, and no absolute
position embeddings — the "RPE" row of the RoFormer table.

The architectures follow the paper's §4.1: the base ones (and tiny) use
clipping distance k = 16 and relative tables per layer and head; the big one
k = 8 and one table per layer, shared by its heads (``--rpe-shared-heads``).
"""

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

BIG_MAX_DISTANCE = 8  # Shaw et al. §4.1, big model


@register_position_encoding("rpe")
def build_relative_encoding(cfg, head_dim: int) -> RelativePositionEncoding:
    # The number of heads comes from the attention module (bind_heads).
    return RelativePositionEncoding(
        head_dim, cfg.rpe_max_distance, shared_heads=getattr(cfg, "rpe_shared_heads", False)
    )


@register_model("transformer_rpe")
class TransformerRpeModel(PositionalTransformerModel):
    """Transformer with learned relative position representations (keys and values).

    Checkpoints from before per-head tables (one table per layer, no
    ``rpe_shared_heads`` in their args) load into the default per-head model
    with the table copied to every head: identical outputs
    (:meth:`RelativePositionEncoding.upgrade_state_dict_named`).
    """

    position_encoding = "rpe"

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        group = parser.add_argument_group("relative position representations")
        group.add_argument(
            "--rpe-max-distance", type=int, metavar="K",
            help=f"clip relative distances at ±K (default {DEFAULT_MAX_DISTANCE}, Shaw et al.'s k; "
                 f"{BIG_MAX_DISTANCE} for transformer_rpe_wmt_en_de_big)",
        )
        # default None: each architecture picks its own (the paper's base and big models differ).
        group.add_argument(
            "--rpe-shared-heads", action="store_true", default=None,
            help="one relative table per layer, shared by its heads (Shaw et al. §3.3, their big "
                 "model; default for transformer_rpe_wmt_en_de_big) instead of one per layer "
                 "and head (their base model; default otherwise)",
        )
        group.add_argument(
            "--no-rpe-shared-heads", dest="rpe_shared_heads", action="store_false", default=None,
            help="one relative table per layer and head (overrides an architecture's default)",
        )


def rpe_defaults(args, max_distance: int = DEFAULT_MAX_DISTANCE, shared_heads: bool = False) -> None:
    """Fill the RPE options the command line left unset."""
    if getattr(args, "rpe_max_distance", None) is None:
        args.rpe_max_distance = max_distance
    if getattr(args, "rpe_shared_heads", None) is None:
        args.rpe_shared_heads = shared_heads


def validate(args) -> None:
    validate_rpe_options(args.rpe_max_distance, args.rpe_shared_heads)


@register_model_architecture("transformer_rpe", "transformer_rpe")
def transformer_rpe(args):
    rpe_defaults(args)  # §4.1 base model: k = 16, per layer and head
    transformer_wmt_en_de(args)
    validate(args)


@register_model_architecture("transformer_rpe", "transformer_rpe_wmt_en_de")
def transformer_rpe_wmt_en_de(args):
    transformer_rpe(args)


@register_model_architecture("transformer_rpe", "transformer_rpe_wmt_en_de_big")
def transformer_rpe_wmt_en_de_big(args):
    rpe_defaults(args, BIG_MAX_DISTANCE, shared_heads=True)  # §4.1 big model: k = 8, per layer
    transformer_wmt_en_de_big(args)
    validate(args)


@register_model_architecture("transformer_rpe", "transformer_rpe_tiny")
def transformer_rpe_tiny(args):
    rpe_defaults(args)
    tiny_architecture(args)
    validate(args)
