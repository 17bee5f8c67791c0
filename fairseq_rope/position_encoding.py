"""The contract between self-attention and a position encoding inside it.

:class:`~fairseq_rope.attention.PositionalMultiheadAttention` computes, per
head, with q, k, v of shape (batch, heads, time, head_dim)::

    q, k   = encoding.encode_qk(q, k, offset)                  # e.g. RoPE rotation
    logits = q·kᵀ / √d + encoding.logit_bias(q, offset, S) + masks
    out    = softmax(logits)·v + encoding.value_term(probs, offset)

``offset`` is the position of the first query (the cached length during
incremental decoding, else 0); keys are at positions 0 … S−1. The bias joins
the scaled logits: an encoding whose term belongs before the 1/√d (Shaw et
al.'s q·a^K) scales it itself. Every hook defaults to "no position
information", so an encoding overrides only what it uses.

A model builds one encoding per attention module, given that module's number
of heads and head dimension (for per-head tables and slopes).

An encoding that acts on q and k alone (it overrides neither ``logit_bias``
nor ``value_term``; :attr:`PositionEncoding.qk_only` says so, derived from the
class) lets the attention take a lean beam-search step, which asks for one new
position through :meth:`PositionEncoding.encode_step` instead.

Per-forward state, used by RoPE alone (its dynamic scaling): an encoding that
depends on each sentence's source length says so with
:attr:`PositionEncoding.uses_source_lengths`, and the model's encoder and
decoder then give it the lengths before each forward
(:meth:`PositionEncoding.set_source_lengths`), the decoder those of the
sentences its batch rows translate (beam search reorders them with the encoder
output). Every other hook is a function of its arguments and the encoding's
parameters.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn


class PositionEncoding(nn.Module):
    #: True if :meth:`value_term` needs the attention probabilities, which rules
    #: out fused attention kernels that never materialize them.
    needs_probabilities: bool = False

    #: True if the encoding acts through :meth:`encode_qk` alone. Derived from
    #: the class (neither ``logit_bias`` nor ``value_term`` overridden), so an
    #: encoding cannot claim it by mistake.
    qk_only: bool = True

    #: True if the encoding needs :meth:`set_source_lengths` before each forward
    #: (RoPE's dynamic scaling; no other encoding keeps per-forward state).
    uses_source_lengths: bool = False

    #: The number of heads it was built for, where that shapes it (per-head tables,
    #: slopes): the attention module refuses another count.
    num_heads: Optional[int] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.qk_only = (cls.logit_bias is PositionEncoding.logit_bias
                       and cls.value_term is PositionEncoding.value_term)

    def set_source_lengths(self, lengths: Optional[Tensor]) -> None:
        """RoPE-only per-forward state: told, when :attr:`uses_source_lengths`, each
        sentence's number of source tokens (EOS included, padding not), shape (B,), or
        None where there is no source."""

    def encode_qk(self, q: Tensor, k: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
        return q, k

    def encode_qkv(self, qkv: Tensor, offset: int) -> Tuple[Tensor, Tensor, Tensor]:
        """q, k and v, each (B, H, T, head_dim), from the packed projection qkv (T, B, 3, H,
        head_dim), q and k encoded: this default splits the heads (views) and calls
        :meth:`encode_qk`; an encoding may fuse the two (RoPE's kernel writes SDPA's layout)."""
        q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
        q, k = self.encode_qk(q, k, offset)
        return q, k, v

    def encode_step(self, qkv: Tensor, offset: int, q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        """One decoding step's queries, keys and values, at position ``offset``, with the
        queries also multiplied by ``q_scale`` (the attention's 1/√d).

        qkv: (B, 3, H, head_dim), queries, keys and values at index 0, 1 and 2 of dim 1 (how
        the packed projection lays them out); returns q, k and v, each (B, H, head_dim). This
        default goes through :meth:`encode_qk`; an encoding may fuse the two.
        """
        q, k = self.encode_qk(qkv[:, 0, :, None], qkv[:, 1, :, None], offset)
        return q[:, :, 0] * q_scale, k[:, :, 0], qkv[:, 2]

    def logit_bias(self, q: Tensor, offset: int, src_len: int) -> Optional[Tensor]:
        """Additive term of the scaled logits (those already divided by √d), broadcastable
        to (B, H, T, S)."""
        return None

    def value_term(self, probs: Tensor, offset: int) -> Optional[Tensor]:
        """Term added to ``probs @ v``, shape (B, H, T, head_dim)."""
        return None
