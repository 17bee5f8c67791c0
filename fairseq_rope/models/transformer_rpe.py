"""``transformer_rpe``: the Transformer with Shaw et al. (2018) relative position
representations in encoder and decoder self-attention, and no absolute
position embeddings — the "RPE" row of the RoFormer table.

:data:`RPE_ARCHITECTURES` is the table of architectures; each mirrors a stock
fairseq one and follows the paper's §4.1 for its size: the base ones (and tiny)
keep :data:`RPE_OPTIONS`' defaults, clipping distance k = 16 and relative
tables per layer and head; the big one overrides them with k = 8 and one table
per layer, shared by its heads (``--rpe-shared-heads``). Options given on the
command line win over the table (see :mod:`fairseq_rope.models.architectures`).
"""

from __future__ import annotations

from argparse import Namespace

from fairseq.models.transformer import tiny_architecture, transformer_wmt_en_de, transformer_wmt_en_de_big

from fairseq_rope.models.architectures import Architecture, EncodingOptions, Option, register_family
from fairseq_rope.models.positional_transformer import PositionalTransformerModel, register_position_encoding
from fairseq_rope.relative import DEFAULT_MAX_DISTANCE, RelativePositionEncoding, validate_rpe_options


def validate_rpe_args(args: Namespace) -> None:
    validate_rpe_options(args.rpe_max_distance, args.rpe_shared_heads)


RPE_OPTIONS = EncodingOptions(
    title="relative position representations",
    options=(
        Option("rpe_max_distance", DEFAULT_MAX_DISTANCE,
               help="clip relative distances at ±K (Shaw et al.'s k)",
               argparse={"type": int, "metavar": "K"}),
        Option("rpe_shared_heads", False,
               help="one relative table per layer, shared by its heads (Shaw et al. §3.3, their "
                    "big model) instead of one per layer and head (their base model)",
               negation_help="one relative table per layer and head (overrides an "
                             "architecture's default)"),
    ),
    validate=validate_rpe_args,
)

# Shaw et al. §4.1: the big model clips at k = 8 and shares its tables across heads.
BIG = {"rpe_max_distance": 8, "rpe_shared_heads": True}

# architecture → the stock fairseq architecture it mirrors, and its RPE overrides.
RPE_ARCHITECTURES = {
    "transformer_rpe": Architecture(transformer_wmt_en_de),
    "transformer_rpe_wmt_en_de": Architecture(transformer_wmt_en_de),
    "transformer_rpe_wmt_en_de_big": Architecture(transformer_wmt_en_de_big, BIG),
    "transformer_rpe_tiny": Architecture(tiny_architecture),
}


@register_position_encoding("rpe")
def build_relative_encoding(cfg, num_heads: int, head_dim: int) -> RelativePositionEncoding:
    return RelativePositionEncoding(
        head_dim, num_heads, cfg.rpe_max_distance, shared_heads=getattr(cfg, "rpe_shared_heads", False)
    )


@register_family("transformer_rpe", RPE_OPTIONS, RPE_ARCHITECTURES)
class TransformerRpeModel(PositionalTransformerModel):
    """Transformer with learned relative position representations (keys and values).

    Checkpoints from before per-head tables (one table per layer, no
    ``rpe_shared_heads`` in their args) load into the default per-head model
    with the table copied to every head: identical outputs
    (:meth:`RelativePositionEncoding.upgrade_state_dict_named`).
    """

    position_encoding = "rpe"
