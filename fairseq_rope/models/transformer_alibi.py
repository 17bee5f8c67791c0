"""``transformer_alibi``: the Transformer with attention with linear biases
(ALiBi, Press et al. 2022) in encoder and decoder self-attention, and no
position embeddings.

:data:`ALIBI_ARCHITECTURES` is the table of architectures; each mirrors a stock
fairseq one with its exact parameters (ALiBi has none). ALiBi has no options
of its own: its slopes follow from the number of heads
(:func:`fairseq_rope.alibi.alibi_slopes`).
"""

from __future__ import annotations

from argparse import Namespace

from fairseq.models.transformer import (
    tiny_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)

from fairseq_rope.alibi import AlibiBias
from fairseq_rope.models.architectures import Architecture, EncodingOptions, register_family
from fairseq_rope.models.positional_transformer import PositionalTransformerModel, register_position_encoding


def validate_alibi_args(args: Namespace) -> None:
    """Nothing to check: the slopes need only the number of heads."""


ALIBI_OPTIONS = EncodingOptions(title="attention with linear biases", options=(), validate=validate_alibi_args)

# architecture → the stock fairseq architecture it mirrors.
ALIBI_ARCHITECTURES = {
    "transformer_alibi": Architecture(transformer_wmt_en_de),
    "transformer_alibi_wmt_en_de": Architecture(transformer_wmt_en_de),
    "transformer_alibi_wmt_en_de_big": Architecture(transformer_wmt_en_de_big),
    "transformer_alibi_iwslt_de_en": Architecture(transformer_iwslt_de_en),
    "transformer_alibi_tiny": Architecture(tiny_architecture),
}


@register_position_encoding("alibi")
def build_alibi(cfg, num_heads: int, head_dim: int) -> AlibiBias:
    return AlibiBias(num_heads)


@register_family("transformer_alibi", ALIBI_OPTIONS, ALIBI_ARCHITECTURES)
class TransformerAlibiModel(PositionalTransformerModel):
    """Transformer with ALiBi biases in encoder (symmetric) and decoder (causal) self-attention."""

    position_encoding = "alibi"
