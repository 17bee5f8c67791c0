"""Relative position representations (Shaw, Uszkoreit and Vaswani, 2018).

Self-attention over keys k_j and values v_j for a query q_i becomes (Eqs. 3-4)

    e_ij = q_i · (k_j + a^K_ij) / √d,     z_i = Σ_j softmax(e_i)_j (v_j + a^V_ij),

with a^K_ij = w^K_clip(j−i, k) and a^V_ij = w^V_clip(j−i, k): one learned
vector per relative distance, distances beyond the maximum k sharing the
embedding of ±k (Eqs. 5-6). There is no absolute position anywhere, so a
left-padded sentence encodes exactly like the unpadded one.

Who owns the tables w (§4.1): by default every layer and head has its own,
w ∈ R^{H × (2k+1) × d}, as in the paper's base model ("unique edge
representations per layer and head"); with ``shared_heads`` the heads of a
layer share one, w ∈ R^{(2k+1) × d}, the variant of §3.3 (efficient
implementation) and of the paper's big model.
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_rope.position_context import PositionContext
from fairseq_rope.position_encoding import PositionEncoding

DEFAULT_MAX_DISTANCE = 16
TABLES = ("key_embeddings", "value_embeddings")  # w^K, w^V
EXPANDED_SHARED_TABLES = (
    "checkpoint with relative tables shared by the heads: copied to every head of this "
    "per-head model (same outputs); to resume its training with its optimizer state, "
    "pass --rpe-shared-heads"
)


def relative_buckets(tgt_len: int, src_len: int, offset: int, max_distance: int, device=None) -> Tensor:
    """Index of w for every (query i, key j): clip(j − i, −k, k) + k, shape (T, S).

    Queries are at positions offset … offset+T−1, keys at 0 … S−1.
    """
    queries = torch.arange(offset, offset + tgt_len, device=device)
    keys = torch.arange(src_len, device=device)
    return (keys[None, :] - queries[:, None]).clamp(-max_distance, max_distance) + max_distance


def validate_rpe_options(max_distance: int, shared_heads: bool = False) -> None:
    """Raise ``ValueError`` naming the option when RPE cannot be built."""
    if max_distance < 1:
        raise ValueError(f"--rpe-max-distance must be >= 1, got {max_distance}")
    # A string from --model-overrides or a config ("False") would be truthy: refuse it.
    if not isinstance(shared_heads, bool):
        raise ValueError(f"--rpe-shared-heads must be a boolean, got {shared_heads!r}")


class RelativeTable(nn.Module):
    """w^K or w^V: ``weight`` of shape (2k+1, d), or (H, 2k+1, d) with one table per head.

    A module rather than a bare parameter so that the state-dict key stays
    ``<table>.weight``, as with the ``nn.Embedding`` of earlier checkpoints.
    """

    def __init__(self, shape: Tuple[int, ...], std: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))
        nn.init.normal_(self.weight, std=std)


class RelativePositionEncoding(PositionEncoding):
    """Learned relative key and value embeddings w^K, w^V (Eqs. 3-6) for ``num_heads`` heads.

    Per head (default): w ∈ R^{H × (2k+1) × head_dim}.
    ``shared_heads=True``: w ∈ R^{(2k+1) × head_dim} for all heads (§3.3).
    """

    needs_probabilities = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        max_distance: int = DEFAULT_MAX_DISTANCE,
        shared_heads: bool = False,
    ) -> None:
        super().__init__()
        validate_rpe_options(max_distance, shared_heads)
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.max_distance = max_distance
        self.shared_heads = shared_heads
        # The key term joins the scaled logits (the contract): q·a^K/√d, Eq. 4's scaling.
        self.scaling = head_dim**-0.5
        shape = (*(() if shared_heads else (num_heads,)), 2 * max_distance + 1, head_dim)
        for name in TABLES:
            setattr(self, name, RelativeTable(shape, std=head_dim**-0.5))

    def extra_repr(self) -> str:
        heads = "shared_heads=True" if self.shared_heads else f"num_heads={self.num_heads}"
        return f"max_distance={self.max_distance}, {heads}"

    def _table(self, name: str, dtype: torch.dtype) -> Tensor:
        return getattr(self, name).weight.to(dtype)  # fp16/bf16 activations: compute in their dtype

    def _buckets(self, like: Tensor, src_len: int, context: PositionContext) -> Tensor:
        """Bucket indices expanded to (B, H, T, S) for gather/scatter along the last dim; the
        indices made once per pass (every layer asks for the same)."""
        batch, heads, tgt_len = like.shape[:3]
        device = like.device
        buckets = context.shared(
            ("rpe buckets", tgt_len, src_len, self.max_distance, device),
            lambda: relative_buckets(tgt_len, src_len, context.offset, self.max_distance, device))
        return buckets.expand(batch, heads, tgt_len, src_len)

    def logit_bias(self, q: Tensor, context: PositionContext, src_len: int) -> Optional[Tensor]:
        # q_i · w^K_r for the 2k+1 distances r, then each (i, j) picks its own:
        # O(T·(2k+1)·d) instead of materializing a^K_ij, O(T·S·d).
        w = self._table("key_embeddings", q.dtype)
        if w.dim() == 2:
            per_distance = torch.matmul(q, w.t())
        else:
            # einsum, not a broadcast matmul: that copies the tables for every
            # sentence (~60× slower for a 640-sentence decoding step on CPU, measured).
            per_distance = torch.einsum("bhtd,hrd->bhtr", q, w)
        # Scaled per distance, before the gather: 2k+1 products per query, not S.
        return (per_distance * self.scaling).gather(-1, self._buckets(q, src_len, context))

    def value_term(self, probs: Tensor, context: PositionContext) -> Optional[Tensor]:
        # Σ_j α_ij w^V_clip(j−i): sum the probability mass per distance, then mix.
        # On CUDA scatter_add_ (and gather's backward) add atomically, in no fixed
        # order: not bitwise deterministic there (docs/design.md).
        buckets = self._buckets(probs, probs.size(-1), context)
        mass = probs.new_zeros(*probs.shape[:3], 2 * self.max_distance + 1)
        mass.scatter_add_(-1, buckets, probs)
        w = self._table("value_embeddings", probs.dtype)
        if w.dim() == 2:
            return torch.matmul(mass, w)
        return torch.einsum("bhtr,hrd->bhtd", mass, w)

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> None:
        """Load checkpoints whose tables are shared by the heads into per-head tables.

        Called by fairseq's ``load_state_dict``. Checkpoints from before per-head
        tables hold (2k+1, d) tables; H identical copies compute exactly what
        the shared table did (Eqs. 3-4 apply it to every head).
        """
        prefix = f"{name}." if name else ""
        for table in TABLES:
            key = f"{prefix}{table}.weight"
            saved = state_dict.get(key)
            if saved is None or saved.dim() == (2 if self.shared_heads else 3):
                continue
            if self.shared_heads:
                raise ValueError(
                    f"{key} holds per-head tables {tuple(saved.shape)}; this model shares one "
                    "table across heads (--rpe-shared-heads): build it without that option"
                )
            state_dict[key] = saved.unsqueeze(0).repeat(self.num_heads, 1, 1)
            warnings.warn(EXPANDED_SHARED_TABLES)  # constant text: shown once, not per layer
