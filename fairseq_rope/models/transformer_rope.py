"""``transformer_rope``: the Transformer with Rotary Position Embedding (RoFormer).

Encoder and decoder self-attention rotate queries and keys (RoPE); there are no
token position embeddings. ``--rope-sides encoder`` (or ``decoder``) keeps RoPE on one side
only, the other side fairseq's own with its sinusoidal embeddings: the ablation that asks
which side carries RoPE's early lead (issue 66).

:data:`ROPE_ARCHITECTURES` is the table of architectures: each mirrors a stock
fairseq one (``transformer_rope_wmt_en_de`` has exactly the parameters of
``transformer_wmt_en_de``, since RoPE has none) and none changes a RoPE option,
so all rotate every head dimension with θ = 10000 in the paper's interleaved
layout unless the command line says otherwise. :data:`ROPE_OPTIONS` declares
the options once (see :mod:`fairseq_rope.models.architectures`).

``--rope-scaling`` (:mod:`fairseq_rope.rope_scaling`) scales the frequencies for
inputs longer than training; it holds no parameters, so it can be set when
decoding an existing checkpoint (``--model-overrides``, or a keyword of the
hub's ``from_pretrained``). Checkpoints from before it load with ``none``.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Tuple

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
    SIDES,
    PositionalTransformerModel,
    head_dims,
    register_position_encoding,
)
from fairseq_rope.rope_scaling import SCALINGS, RopeScaling, validate_rope_scaling
from fairseq_rope.rotary import DEFAULT_THETA, LAYOUTS, RotaryEmbedding, validate_rope_options


def validate_rope_args(args: Namespace) -> None:
    """RoPE options against both head dimensions (rope_dim None: the whole head)."""
    for dim in head_dims(args):
        rope_dim = dim if args.rope_dim is None else args.rope_dim
        validate_rope_options(dim, rope_dim, args.rope_theta, args.rope_layout)
        validate_rope_scaling(args.rope_scaling, args.rope_scaling_factor, args.rope_original_length, rope_dim)


#: --rope-sides: RoPE on both sides (the paper), or on one, the other side stock.
ROPE_SIDES = ("both", *SIDES)

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
        Option("rope_scaling", "none",
               help="scale the frequencies for inputs longer than training: 'linear' (position "
                    "interpolation), 'ntk' (NTK-aware base), 'yarn' (NTK-by-parts + temperature) at "
                    "the fixed scale S; 'dynamic-*' the same at s = max(1, S*len/L - (S-1)), len the "
                    "sentence's source length (encoder and decoder alike)",
               argparse={"choices": SCALINGS}),
        Option("rope_scaling_factor", None, shown_default="none",
               help="S: the scale of linear/ntk/yarn (required); the slope of the dynamic rule "
                    "(1 if unset)",
               argparse={"type": float, "metavar": "S"}),
        Option("rope_original_length", None, shown_default="none",
               help="L: the training length in source tokens, EOS included (required by yarn and "
                    "dynamic-*; linear and ntk ignore it)",
               argparse={"type": int, "metavar": "L"}),
        Option("rope_sides", "both",
               help="self-attention that rotates: 'both' (RoFormer), or 'encoder' or 'decoder' alone, "
                    "the other side fairseq's own, with sinusoidal position embeddings (the ablation "
                    "rows rope_enc and rope_dec)",
               argparse={"choices": ROPE_SIDES}),
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
def build_rotary_embedding(cfg, num_heads: int, head_dim: int) -> RotaryEmbedding:
    # getattr: args that no architecture function completed (checkpoints from before scaling
    # are completed by theirs on load, to the same 'none').
    scaling = RopeScaling.from_options(getattr(cfg, "rope_scaling", "none"),
                                       getattr(cfg, "rope_scaling_factor", None),
                                       getattr(cfg, "rope_original_length", None))
    return RotaryEmbedding(
        head_dim, rope_dim=cfg.rope_dim, theta=cfg.rope_theta, layout=cfg.rope_layout, scaling=scaling
    )


@register_family("transformer_rope", ROPE_OPTIONS, ROPE_ARCHITECTURES)
class TransformerRopeModel(PositionalTransformerModel):
    """Transformer with rotary position embedding in encoder and decoder self-attention (or in one
    of them: ``--rope-sides``)."""

    position_encoding = "rope"

    @classmethod
    def positional_sides(cls, args) -> Tuple[str, ...]:
        sides = getattr(args, "rope_sides", "both") or "both"  # checkpoints from before the option: both
        return SIDES if sides == "both" else (sides,)
