"""Relative position representations (Shaw, Uszkoreit and Vaswani, 2018).

Self-attention over keys k_j and values v_j for a query q_i becomes (Eqs. 3-4)

    e_ij = q_i · (k_j + a^K_ij) / √d,     z_i = Σ_j softmax(e_i)_j (v_j + a^V_ij),

with a^K_ij = w^K_clip(j−i, k) and a^V_ij = w^V_clip(j−i, k): one learned
vector per relative distance, distances beyond the maximum k sharing the
embedding of ±k (Eq. 5-6), shared by the heads of a layer. There is no
absolute position anywhere, so a left-padded sentence encodes exactly like the
unpadded one.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from fairseq_rope.position_encoding import PositionEncoding

DEFAULT_MAX_DISTANCE = 16


def relative_buckets(tgt_len: int, src_len: int, offset: int, max_distance: int, device=None) -> Tensor:
    """Index of w for every (query i, key j): clip(j − i, −k, k) + k, shape (T, S).

    Queries are at positions offset … offset+T−1, keys at 0 … S−1.
    """
    queries = torch.arange(offset, offset + tgt_len, device=device)
    keys = torch.arange(src_len, device=device)
    return (keys[None, :] - queries[:, None]).clamp(-max_distance, max_distance) + max_distance


def validate_rpe_options(max_distance: int) -> None:
    """Raise ``ValueError`` naming the option when RPE cannot be built."""
    if max_distance < 1:
        raise ValueError(f"--rpe-max-distance must be >= 1, got {max_distance}")


class RelativePositionEncoding(PositionEncoding):
    """Learned relative key and value embeddings w^K, w^V ∈ R^{(2k+1) × head_dim}."""

    needs_probabilities = True

    def __init__(self, head_dim: int, max_distance: int = DEFAULT_MAX_DISTANCE) -> None:
        super().__init__()
        validate_rpe_options(max_distance)
        self.max_distance = max_distance
        self.key_embeddings = nn.Embedding(2 * max_distance + 1, head_dim)
        self.value_embeddings = nn.Embedding(2 * max_distance + 1, head_dim)
        nn.init.normal_(self.key_embeddings.weight, std=head_dim**-0.5)
        nn.init.normal_(self.value_embeddings.weight, std=head_dim**-0.5)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}"

    def _buckets(self, like: Tensor, src_len: int, offset: int) -> Tensor:
        """Bucket indices expanded to (B, H, T, S) for gather/scatter along the last dim."""
        batch, heads, tgt_len = like.shape[:3]
        buckets = relative_buckets(tgt_len, src_len, offset, self.max_distance, like.device)
        return buckets.expand(batch, heads, tgt_len, src_len)

    def logit_bias(self, q: Tensor, offset: int, src_len: int) -> Optional[Tensor]:
        # q_i · w^K_r for the 2k+1 distances r, then each (i, j) picks its own:
        # O(T·(2k+1)·d) instead of materializing a^K_ij, O(T·S·d).
        per_distance = torch.matmul(q, self.key_embeddings.weight.to(q.dtype).t())
        return per_distance.gather(-1, self._buckets(q, src_len, offset))

    def value_term(self, probs: Tensor, offset: int) -> Optional[Tensor]:
        # Σ_j α_ij w^V_clip(j−i): sum the probability mass per distance, then mix.
        buckets = self._buckets(probs, probs.size(-1), offset)
        mass = probs.new_zeros(*probs.shape[:3], 2 * self.max_distance + 1)
        mass.scatter_add_(-1, buckets, probs)
        return torch.matmul(mass, self.value_embeddings.weight.to(probs.dtype))
