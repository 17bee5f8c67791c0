"""fairseq's Transformer with a position encoding inside self-attention.

The encoder, decoder and their layers are fairseq's, subclassed only where the
self-attention module is built: encoder and decoder self-attention become
:class:`~fairseq_rope.attention.PositionalMultiheadAttention` carrying the
model's position encoding, cross-attention stays fairseq's (unencoded), and no
token position embeddings are added to the input. fairseq's xFormers options
(``--encoder/--decoder-xformers-att-config``) would reach at most fairseq's
cross-attention, never this self-attention: they are refused, not ignored.

A model family picks its encoding by name (``position_encoding``) from
:data:`POSITION_ENCODINGS`; the name travels in the checkpoint's args.

What the positions decide is computed once per forward of the encoder, of the
decoder and of each decoding step, and handed to every self-attention layer of
that pass: a :class:`~fairseq_rope.position_context.PositionContext`, bound for
the duration of the forward (:func:`fairseq_rope.position_context.bound`). It
holds the first query's position (a decoding step's, else 0) and, where an
encoding scales by it (``PositionEncoding.uses_source_lengths``), each
sentence's source length: the encoder's from its source tokens, the decoder's
from the encoder output it attends to (which beam search reorders with the
hypotheses).
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
)
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.position_context import PositionContext, bound
from fairseq_rope.position_encoding import PositionEncoding

# Positions enter only inside self-attention (rotations, clipped distances): no table
# bounds the length, so encoder and decoder report no limit (fairseq's own "unbounded",
# as in its EnsembleModel) and --max-source/target-positions only filter data.
UNBOUNDED_POSITIONS = sys.maxsize

# name → builder(cfg, num_heads, head_dim) of the per-layer position encoding module.
PositionEncodingBuilder = Callable[[Any, int, int], PositionEncoding]
POSITION_ENCODINGS: Dict[str, PositionEncodingBuilder] = {}


def register_position_encoding(name: str):
    def register(builder: PositionEncodingBuilder) -> PositionEncodingBuilder:
        POSITION_ENCODINGS[name] = builder
        return builder

    return register


def head_dim(embed_dim: int, heads: int) -> int:
    if embed_dim % heads:
        raise ValueError(f"embed dim {embed_dim} is not divisible by {heads} attention heads")
    return embed_dim // heads


def head_dims(args) -> Tuple[int, int]:
    """Encoder and decoder attention head dimensions of parsed fairseq args."""
    return (head_dim(args.encoder_embed_dim, args.encoder_attention_heads),
            head_dim(args.decoder_embed_dim, args.decoder_attention_heads))


def refuse_xformers(side: str, xformers_att_config: Optional[str]) -> None:
    """fairseq would hand --{side}-xformers-att-config to its own self-attention; ours
    computes attention itself, so the option would silently do nothing."""
    if xformers_att_config is not None:
        raise ValueError(
            f"--{side}-xformers-att-config is not supported: RoPE/RPE/ALiBi self-attention does not "
            f"support xformers (got {xformers_att_config!r}); remove the option"
        )


def build_self_attention(layer: nn.Module, embed_dim: int, side: str, cfg) -> nn.Module:
    """Self-attention of an encoder or decoder (``side``) layer, with the model's encoding."""
    side_cfg = getattr(cfg, side)  # TransformerConfig.encoder / .decoder
    refuse_xformers(side, side_cfg.xformers_att_config)
    heads = side_cfg.attention_heads
    encoding = POSITION_ENCODINGS[cfg.position_encoding](cfg, heads, head_dim(embed_dim, heads))
    return PositionalMultiheadAttention(
        embed_dim,
        heads,
        encoding,
        dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
    )


class PositionalEncoderLayer(TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return build_self_attention(self, embed_dim, "encoder", cfg)


class PositionalDecoderLayer(TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if cfg.cross_self_attention or add_bias_kv or add_zero_attn:
            raise ValueError(
                "--cross-self-attention and bias/zero attention are not supported "
                f"with position encoding {cfg.position_encoding!r}"
            )
        return build_self_attention(self, embed_dim, "decoder", cfg)


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping, as fairseq does for its layers."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = 0 if cfg.checkpoint_activations else cfg.min_params_to_wrap
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def uses_source_lengths(module: nn.Module) -> bool:
    return any(isinstance(m, PositionEncoding) and m.uses_source_lengths for m in module.modules())


def encoder_source_lengths(encoder_out: Optional[Dict[str, List[Tensor]]]) -> Optional[Tensor]:
    """Each sentence's number of source tokens, from an encoder output (B rows, as reordered)."""
    if encoder_out is None:
        return None
    states = encoder_out["encoder_out"][0]  # (S, B, C)
    if encoder_out.get("encoder_padding_mask"):
        return (~encoder_out["encoder_padding_mask"][0].bool()).sum(1)
    return torch.full((states.size(1),), states.size(0), device=states.device)


class PositionalTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        self.needs_source_lengths = uses_source_lengths(self)  # a model property: no search per forward

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        return wrap_layer(PositionalEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward_scriptable(self, src_tokens, *args, **kwargs):
        # fairseq's own count (its src_lengths output): non-pad tokens, EOS included.
        lengths = src_tokens.ne(self.padding_idx).sum(1) if self.needs_source_lengths else None
        with bound(PositionContext(0, lengths)):
            return super().forward_scriptable(src_tokens, *args, **kwargs)

    def max_positions(self) -> int:
        return UNBOUNDED_POSITIONS


class PositionalTransformerDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.needs_source_lengths = uses_source_lengths(self)

    def build_decoder_layer(self, args, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        return wrap_layer(PositionalDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, *args, **kwargs):
        # A step feeds fairseq only the last token: its position is the prefix's length − 1, as for
        # fairseq's own position embeddings (the cached keys hold the positions before it).
        offset = prev_output_tokens.size(1) - 1 if incremental_state is not None else 0
        lengths = encoder_source_lengths(encoder_out) if self.needs_source_lengths else None
        with bound(PositionContext(offset, lengths)):
            return super().extract_features(prev_output_tokens, encoder_out, incremental_state, *args, **kwargs)

    def max_positions(self) -> int:
        return UNBOUNDED_POSITIONS


SIDES = ("encoder", "decoder")


class PositionalTransformerModel(TransformerModel):
    """fairseq's ``TransformerModel`` with ``position_encoding`` in self-attention: on both sides, or
    on the sides :meth:`positional_sides` names, the other keeping fairseq's own encoder or decoder
    (its sinusoidal position embeddings added to the input, its self-attention)."""

    position_encoding: str = ""

    @classmethod
    def positional_sides(cls, args) -> Tuple[str, ...]:
        """The sides whose self-attention carries the encoding (a family may offer fewer)."""
        return SIDES

    @classmethod
    def stock_side_args(cls, args):
        """``args`` for a side built as fairseq's own: its token position embeddings on (the model's
        args turn them off for the positional sides, and keep saying so in the checkpoint)."""
        stock = copy.copy(args)
        stock.no_token_positional_embeddings = False
        return stock

    @classmethod
    def hub_models(cls):
        return {}  # no pretrained downloads; fairseq's transformer list is not ours

    @classmethod
    def build_model(cls, args, task):
        args.position_encoding = cls.position_encoding
        args.no_token_positional_embeddings = True
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        if "encoder" not in cls.positional_sides(args):
            return TransformerEncoder(cls.stock_side_args(args), src_dict, embed_tokens)
        return PositionalTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        if "decoder" not in cls.positional_sides(args):
            return TransformerDecoder(cls.stock_side_args(args), tgt_dict, embed_tokens,
                                      no_encoder_attn=args.no_cross_attention)
        return PositionalTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=args.no_cross_attention
        )
