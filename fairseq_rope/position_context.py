"""What the positions decide for one forward pass, computed once and handed to every layer.

A :class:`PositionContext` is made by the model (:mod:`fairseq_rope.models.positional_transformer`)
at the start of each forward of its encoder, of its decoder and of each decoding step: the
position of the first query (``offset``: the step's position, else 0) and each sentence's source
length where an encoding scales by it. What the encodings derive from those (RoPE's cos/sin
slices or a step's multipliers, per-sentence tables, ALiBi's bias, the additive masks) is built
by the first layer that asks and kept in the context (:meth:`PositionContext.shared`), so every
later layer of that pass reuses it: a decoding step's per-layer work is the rotation alone.

How it reaches the layers: fairseq's encoder and decoder loops call each layer with their own
arguments only, so the model binds its context for the duration of its forward
(:func:`bound`), and each self-attention reads it (:func:`current`). The binding is a
:class:`contextvars.ContextVar`: private to the thread (and asyncio task) that runs the forward,
so two threads decoding one model never see each other's positions or lengths, and it ends with
the forward. Nothing outlives the pass: no module attribute, no module-level cache. A
self-attention called outside such a model (or recomputed by activation checkpointing, after
the forward returned) makes its own from its arguments (the offset its key cache implies): the
same positions; only a scaling by source length then has no lengths, and says so.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Dict, Hashable, Optional

from torch import Tensor


class PositionContext:
    """The positions of one forward pass: ``offset`` (the first query's position; the keys are at
    0 … offset + T − 1) and ``source_lengths`` ((B,) source tokens of each sentence, EOS included,
    padding not, in the batch's row order; None where no encoding asks for them)."""

    __slots__ = ("offset", "source_lengths", "_shared")

    def __init__(self, offset: int = 0, source_lengths: Optional[Tensor] = None) -> None:
        self.offset = offset
        self.source_lengths = source_lengths
        self._shared: Dict[Hashable, Any] = {}

    def shared(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, made once per context: every layer of a pass asks with an equal ``key`` (by
        value: what the result depends on besides the context itself)."""
        try:
            return self._shared[key]
        except KeyError:
            value = self._shared[key] = build()
            return value

    def __repr__(self) -> str:
        lengths = None if self.source_lengths is None else tuple(self.source_lengths.shape)
        return f"PositionContext(offset={self.offset}, source_lengths={lengths})"


_CURRENT: contextvars.ContextVar[Optional[PositionContext]] = contextvars.ContextVar(
    "fairseq_rope_position_context", default=None
)


class bound:
    """``with bound(context):`` makes ``context`` :func:`current` in this thread (and task) for the
    duration. A class, not a generator: it is entered once per decoding step."""

    __slots__ = ("context", "_token")

    def __init__(self, context: PositionContext) -> None:
        self.context = context

    def __enter__(self) -> PositionContext:
        self._token = _CURRENT.set(self.context)
        return self.context

    def __exit__(self, *exc_info: object) -> None:
        _CURRENT.reset(self._token)


def current() -> Optional[PositionContext]:
    """The context the running model's forward bound, or None outside one."""
    return _CURRENT.get()
