"""Attention with Linear Biases (ALiBi), after Press, Smith and Lewis, *Train
Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation* (ICLR 2022).

There are no position embeddings. Each head h penalises its attention scores
linearly in the distance between query i and key j (§3):

    softmax(q_i·Kᵀ/√d + m_h·[−(i−1), …, −2, −1, 0])

(the paper writes the scores without the 1/√d; its implementation, in
fairseq, adds the bias to the scaled scores, as here). The slopes m_h are
fixed, not learned: for n heads, n a power of 2, the geometric sequence that
starts at 2^(−8/n) with that same ratio, m_h = 2^(−8h/n), h = 1 … n; for
other n, the 2^⌊log₂ n⌋ slopes of the nearest smaller power of 2 followed by
the first n − 2^⌊log₂ n⌋ of the odd-indexed slopes of twice that power
(their code's ``get_slopes``).

The paper's model is a decoder, where the bias is −m_h·(i − j) for the keys
j ≤ i it sees. The encoder's bidirectional self-attention takes the symmetric
−m_h·|i − j|; a decoder gets the same expression, which its causal mask
reduces to −m_h·(i − j). Cross-attention has no bias.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from fairseq_rope.position_context import PositionContext
from fairseq_rope.position_encoding import PositionEncoding


def alibi_slopes(num_heads: int) -> Tuple[float, ...]:
    """m_1 … m_n of Press et al. §3 (and their interpolation for n not a power of 2)."""
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one attention head, got {num_heads}")
    power = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * h / power) for h in range(1, power + 1)]
    # The in-between slopes of the sequence for 2·power heads: 2^(−8h/(2·power)), h odd.
    slopes += [2.0 ** (-8.0 * h / (2 * power)) for h in range(1, 2 * (num_heads - power), 2)]
    return tuple(slopes)


class AlibiBias(PositionEncoding):
    """ALiBi as a position encoding: a logit bias per head, no parameters, no buffers."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.slopes = alibi_slopes(num_heads)
        self.num_heads = num_heads

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def logit_bias(self, q: Tensor, context: PositionContext, src_len: int) -> Optional[Tensor]:
        """−m_h·|i − j|, (H, T, S): Press et al.'s bias, joining the scaled scores; made once per
        pass (every layer has the same slopes and positions)."""
        tgt_len, dtype, device = q.size(-2), q.dtype, q.device
        key = ("alibi", self.slopes, tgt_len, src_len, dtype, device, torch.is_inference_mode_enabled())
        return context.shared(key, lambda: self._bias(context.offset, tgt_len, src_len, dtype, device))

    def _bias(self, offset: int, tgt_len: int, src_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        # Distances and slopes in fp64, rounded once to q's dtype.
        queries = torch.arange(offset, offset + tgt_len, device=device, dtype=torch.float64)
        keys = torch.arange(src_len, device=device, dtype=torch.float64)
        distance = (keys[None, :] - queries[:, None]).abs()  # (T, S)
        slopes = torch.tensor(self.slopes, dtype=torch.float64, device=device)
        return (-slopes[:, None, None] * distance).to(dtype)
