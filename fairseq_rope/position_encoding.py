"""The contract between self-attention and a position encoding inside it.

:class:`~fairseq_rope.attention.PositionalMultiheadAttention` computes, per
head, with q, k, v of shape (batch, heads, time, head_dim)::

    q, k   = encoding.encode_qk(q, k, context)                 # e.g. RoPE rotation
    logits = q·kᵀ / √d + encoding.logit_bias(q, context, S) + masks
    out    = softmax(logits)·v + encoding.value_term(probs, context)

``context`` (:class:`~fairseq_rope.position_context.PositionContext`) holds
what the positions decide for the whole forward pass: ``context.offset`` is the
position of the first query (a decoding step's position, else 0; keys are at
positions 0 … S−1) and ``context.source_lengths`` each sentence's source
length, given by the model to encodings that say they use it
(:attr:`PositionEncoding.uses_source_lengths`: RoPE's dynamic scaling). What an
encoding derives from them (tables, biases) it keeps in the context
(``context.shared``), so every layer of the pass reuses it; an encoding keeps
no per-forward state of its own. The bias joins the scaled logits: an encoding
whose term belongs before the 1/√d (Shaw et al.'s q·a^K) scales it itself.
Every hook defaults to "no position information", so an encoding overrides
only what it uses.

A model builds one encoding per attention module, given that module's number
of heads and head dimension (for per-head tables and slopes).

An encoding that acts on q and k alone (it overrides neither ``logit_bias``
nor ``value_term``; :attr:`PositionEncoding.qk_only` says so, derived from the
class) lets a beam-search step ask for its one new position through
:meth:`PositionEncoding.encode_step`, which also scales q by 1/√d.
"""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor, nn

from fairseq_rope.position_context import PositionContext


class PositionEncoding(nn.Module):
    #: True if :meth:`value_term` needs the attention probabilities, which rules
    #: out fused attention kernels that never materialize them.
    needs_probabilities: bool = False

    #: True if the encoding acts through :meth:`encode_qk` alone. Derived from
    #: the class (neither ``logit_bias`` nor ``value_term`` overridden), so an
    #: encoding cannot claim it by mistake.
    qk_only: bool = True

    #: True if the encoding reads ``context.source_lengths`` (RoPE's dynamic
    #: scaling): the model then computes them for each forward.
    uses_source_lengths: bool = False

    #: The number of heads it was built for, where that shapes it (per-head tables,
    #: slopes): the attention module refuses another count.
    num_heads: Optional[int] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.qk_only = (cls.logit_bias is PositionEncoding.logit_bias
                       and cls.value_term is PositionEncoding.value_term)

    def encode_qk(self, q: Tensor, k: Tensor, context: PositionContext) -> Tuple[Tensor, Tensor]:
        return q, k

    def encode_qkv(self, qkv: Tensor, context: PositionContext) -> Tuple[Tensor, Tensor, Tensor]:
        """q, k and v, each (B, H, T, head_dim), from the packed projection qkv (T, B, 3, H,
        head_dim), q and k encoded: this default splits the heads (views) and calls
        :meth:`encode_qk`; an encoding may fuse the two (RoPE's kernel writes SDPA's layout)."""
        q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
        q, k = self.encode_qk(q, k, context)
        return q, k, v

    def encode_step(self, qkv: Tensor, context: PositionContext, q_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        """One decoding step's queries, keys and values, at position ``context.offset``, with the
        queries also multiplied by ``q_scale`` (the attention's 1/√d).

        qkv: (B, 3, H, head_dim), queries, keys and values at index 0, 1 and 2 of dim 1 (how
        the packed projection lays them out); returns q, k and v, each (B, H, head_dim). This
        default goes through :meth:`encode_qk`; an encoding may fuse the two.
        """
        q, k = self.encode_qk(qkv[:, 0, :, None], qkv[:, 1, :, None], context)
        return q[:, :, 0] * q_scale, k[:, :, 0], qkv[:, 2]

    def logit_bias(self, q: Tensor, context: PositionContext, src_len: int) -> Optional[Tensor]:
        """Additive term of the scaled logits (those already divided by √d), broadcastable
        to (B, H, T, S)."""
        return None

    def value_term(self, probs: Tensor, context: PositionContext) -> Optional[Tensor]:
        """Term added to ``probs @ v``, shape (B, H, T, head_dim)."""
        return None
