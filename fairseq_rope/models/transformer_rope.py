"""``transformer_rope``: the Transformer with Rotary Position Embedding (RoFormer).

Encoder and decoder self-attention rotate queries and keys (RoPE); there are no
token position embeddings.

:data:`ROPE_ARCHITECTURES` is the table of architectures: each mirrors a stock
fairseq one (``transformer_rope_wmt_en_de`` has exactly the parameters of
``transformer_wmt_en_de``, since RoPE has none) and none changes a RoPE option,
so all rotate every head dimension with θ = 10000 in the paper's interleaved
layout unless the command line says otherwise. :data:`ROPE_OPTIONS` declares
the options once (see :mod:`fairseq_rope.models.architectures`).
"""

from __future__ import annotations

from argparse import Namespace

from fairseq.models.transformer import (
    tiny_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)

from fairseq_rope.models.architectures import (
    Architecture,
    EncodingOptions,
    Option,
    register_family,
)
from fairseq_rope.models.positional_transformer import (
    PositionalTransformerModel,
    head_dims,
    register_position_encoding,
)
from fairseq_rope.rotary import DEFAULT_THETA, LAYOUTS, RotaryEmbedding, validate_rope_options


def validate_rope_args(args: Namespace) -> None:
    """RoPE options against both head dimensions (rope_dim None: the whole head)."""
    for dim in head_dims(args):
        rope_dim = dim if args.rope_dim is None else args.rope_dim
        validate_rope_options(dim, rope_dim, args.rope_theta, args.rope_layout)


ROPE_OPTIONS = EncodingOptions(
    title="rotary position embedding",
    options=(
        Option("rope_theta", DEFAULT_THETA, shown_default=f"{DEFAULT_THETA:g}",
               help="base of the RoPE frequencies θ_i = BASE^(-2(i-1)/d)",
               argparse={"type": float, "metavar": "BASE"}),
        Option("rope_dim", None, shown_default="all",
               help="rotate the first D dimensions of each head (even)",
               argparse={"type": int, "metavar": "D"}),
        Option("rope_layout", "interleaved",
               help="pairs of rotated dimensions: 'interleaved' (the paper's adjacent pairs) "
                    "or 'half' (GPT-NeoX rotate-half)",
               argparse={"choices": LAYOUTS}),
    ),
    validate=validate_rope_args,
)

# architecture → the stock fairseq architecture it mirrors (no RoPE overrides).
ROPE_ARCHITECTURES = {
    "transformer_rope": Architecture(transformer_wmt_en_de),
    "transformer_rope_wmt_en_de": Architecture(transformer_wmt_en_de),
    "transformer_rope_wmt_en_de_big": Architecture(transformer_wmt_en_de_big),
    "transformer_rope_iwslt_de_en": Architecture(transformer_iwslt_de_en),
    "transformer_rope_tiny": Architecture(tiny_architecture),
}


@register_position_encoding("rope")
def build_rotary_embedding(cfg, head_dim: int) -> RotaryEmbedding:
    return RotaryEmbedding(
        head_dim, rope_dim=cfg.rope_dim, theta=cfg.rope_theta, layout=cfg.rope_layout
    )


@register_family("transformer_rope", ROPE_OPTIONS, ROPE_ARCHITECTURES)
class TransformerRopeModel(PositionalTransformerModel):
    """Transformer with rotary position embedding in encoder and decoder self-attention."""

    position_encoding = "rope"
