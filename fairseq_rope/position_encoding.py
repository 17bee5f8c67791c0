"""The contract between self-attention and a position encoding inside it.

:class:`~fairseq_rope.attention.PositionalMultiheadAttention` computes, per
head, with q, k, v of shape (batch, heads, time, head_dim)::

    q, k   = encoding.encode_qk(q, k, offset)                  # e.g. RoPE rotation
    logits = (q·kᵀ + encoding.logit_bias(q, offset, S)) / √d + masks
    out    = softmax(logits)·v + encoding.value_term(probs, offset)

``offset`` is the position of the first query (the cached length during
incremental decoding, else 0); keys are at positions 0 … S−1. Every hook
defaults to "no position information", so an encoding overrides only what it
uses.
"""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor, nn


class PositionEncoding(nn.Module):
    #: True if :meth:`value_term` needs the attention probabilities, which rules
    #: out fused attention kernels that never materialize them.
    needs_probabilities: bool = False

    def bind_heads(self, num_heads: int) -> None:
        """Told by the owning attention module its number of heads (for per-head parameters)."""

    def encode_qk(self, q: Tensor, k: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
        return q, k

    def logit_bias(self, q: Tensor, offset: int, src_len: int) -> Optional[Tensor]:
        """Additive term of the unscaled logits, broadcastable to (B, H, T, S)."""
        return None

    def value_term(self, probs: Tensor, offset: int) -> Optional[Tensor]:
        """Term added to ``probs @ v``, shape (B, H, T, head_dim)."""
        return None
