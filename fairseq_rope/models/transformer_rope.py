"""``transformer_rope``: the Transformer with Rotary Position Embedding (RoFormer).

Encoder and decoder self-attention rotate queries and keys (RoPE); there are no
token position embeddings. Architectures mirror fairseq's stock ones, so
``transformer_rope_wmt_en_de`` has exactly the parameters of
``transformer_wmt_en_de``.
"""

from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    tiny_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)

from fairseq_rope.models.positional_transformer import (
    PositionalTransformerModel,
    head_dims,
    register_position_encoding,
)
from fairseq_rope.rotary import DEFAULT_THETA, LAYOUTS, RotaryEmbedding, validate_rope_options


@register_position_encoding("rope")
def build_rotary_embedding(cfg, head_dim: int) -> RotaryEmbedding:
    return RotaryEmbedding(
        head_dim, rope_dim=cfg.rope_dim, theta=cfg.rope_theta, layout=cfg.rope_layout
    )


@register_model("transformer_rope")
class TransformerRopeModel(PositionalTransformerModel):
    """Transformer with rotary position embedding in encoder and decoder self-attention."""

    position_encoding = "rope"

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        group = parser.add_argument_group("rotary position embedding")
        group.add_argument(
            "--rope-theta", type=float, metavar="BASE",
            help=f"base of the RoPE frequencies θ_i = BASE^(-2(i-1)/d) (default {DEFAULT_THETA:g})",
        )
        group.add_argument(
            "--rope-dim", type=int, metavar="D",
            help="rotate the first D dimensions of each head (even; default: all)",
        )
        group.add_argument(
            "--rope-layout", choices=LAYOUTS,
            help="pairs of rotated dimensions: 'interleaved' (the paper's adjacent "
            "pairs, default) or 'half' (GPT-NeoX rotate-half)",
        )


def check_rope_args(args) -> None:
    """Validate the RoPE options once the architecture has set the dimensions: at
    parse time, so fairseq-train fails before it creates its save dir."""
    for dim in head_dims(args):
        rope_dim = dim if args.rope_dim is None else args.rope_dim
        validate_rope_options(dim, rope_dim, args.rope_theta, args.rope_layout)


def rope_defaults(args) -> None:
    """Fill the RoPE options the command line left unset (None: rotate all dims)."""
    for name, default in (
        ("rope_theta", DEFAULT_THETA), ("rope_dim", None), ("rope_layout", "interleaved")
    ):
        if getattr(args, name, None) is None:
            setattr(args, name, default)


@register_model_architecture("transformer_rope", "transformer_rope")
def transformer_rope(args):
    rope_defaults(args)
    transformer_wmt_en_de(args)
    check_rope_args(args)


@register_model_architecture("transformer_rope", "transformer_rope_wmt_en_de")
def transformer_rope_wmt_en_de(args):
    transformer_rope(args)


@register_model_architecture("transformer_rope", "transformer_rope_wmt_en_de_big")
def transformer_rope_wmt_en_de_big(args):
    rope_defaults(args)
    transformer_wmt_en_de_big(args)
    check_rope_args(args)


@register_model_architecture("transformer_rope", "transformer_rope_iwslt_de_en")
def transformer_rope_iwslt_de_en(args):
    rope_defaults(args)
    transformer_iwslt_de_en(args)
    check_rope_args(args)


@register_model_architecture("transformer_rope", "transformer_rope_tiny")
def transformer_rope_tiny(args):
    rope_defaults(args)
    tiny_architecture(args)
    check_rope_args(args)
