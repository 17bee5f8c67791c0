"""Two threads decoding at once (the hub interface) never get each other's cached tables.

Each single-entry cache (RoPE's last cos/sin lookup and last per-sentence angles, ALiBi's last
bias, the attention's last additive mask) keeps one (key, value) tuple, read once: a cache that
read its key and its value separately could compare its own key, let another thread store its
entry, and return that thread's value. The tests force that interleaving: a key element whose
comparison runs the other thread to completion in between (``Interleaving``); the attention's
mask cache, compared by identity, has the other thread run right after its comparison.
"""

from __future__ import annotations

import builtins
import threading
from typing import Callable

import torch

from fairseq_rope import attention
from fairseq_rope.alibi import AlibiBias
from fairseq_rope.attention import _MASKS
from fairseq_rope.rope_scaling import RopeScaling
from fairseq_rope.rotary import clear_cos_sin_cache, cos_sin, sentence_cos_sin


def interleaving(value_type: type):
    """A ``value_type`` (float or int) that, the first time it is compared for equality, runs
    ``other`` in another thread to completion before answering: a thread switch at the worst time."""

    class Interleaving(value_type):
        other: Callable[[], None] = staticmethod(lambda: None)
        fired = False

        def __eq__(self, value):
            if not Interleaving.fired:
                Interleaving.fired = True
                thread = threading.Thread(target=Interleaving.other)
                thread.start()
                thread.join()
            return value_type(self) == value_type(value)

        def __ne__(self, value):
            return not self.__eq__(value)

        __hash__ = value_type.__hash__

    return Interleaving


def test_cos_sin_lookup_returns_its_own_positions_when_another_thread_looks_up_between():
    clear_cos_sin_cache()
    cpu = torch.device("cpu")
    cos_sin(5, 8, 10000.0, cpu, torch.float32)  # the entry this thread will compare with
    Theta = interleaving(float)
    Theta.other = staticmethod(lambda: cos_sin(7, 8, 10000.0, cpu, torch.float32, offset=100))
    cos, sin = cos_sin(5, 8, Theta(10000.0), cpu, torch.float32)  # equal key, compared through Theta
    assert Theta.fired
    assert cos.shape == (5, 4)
    torch.testing.assert_close(cos[:, 0], torch.arange(5.0).cos(), atol=0, rtol=0)


def test_sentence_angles_are_their_own_when_another_thread_looks_up_between():
    clear_cos_sin_cache()
    scaling = RopeScaling("dynamic-ntk", 1.0, 4)
    lengths = torch.tensor([3, 9])
    sentence_cos_sin(scaling, lengths, 5, 8, 10000.0, torch.float32)
    Theta = interleaving(float)
    Theta.other = staticmethod(lambda: sentence_cos_sin(scaling, lengths, 2, 8, 10000.0, torch.float32))
    cos, _, _ = sentence_cos_sin(scaling, lengths, 5, 8, Theta(10000.0), torch.float32)
    assert Theta.fired
    assert cos.shape == (2, 1, 5, 4)


def test_alibi_bias_is_its_own_when_another_thread_builds_one_between():
    q = torch.zeros(1, 4, 3, 8)
    AlibiBias(4).logit_bias(q, 0, 3)
    SourceLength = interleaving(int)
    SourceLength.other = staticmethod(lambda: AlibiBias(4).logit_bias(torch.zeros(1, 4, 6, 8), 0, 6))
    bias = AlibiBias(4).logit_bias(q, 0, SourceLength(3))
    assert SourceLength.fired
    assert bias.shape == (4, 3, 3)


def test_attention_mask_is_its_own_when_another_thread_builds_one_between(monkeypatch):
    """The mask cache compares its inputs by identity, in one ``any(...)``: the other thread runs
    right after that comparison (the module's ``any`` wrapped), before the mask is returned."""
    masks = [torch.tensor([[False, True]]), torch.tensor([[True, False]])]
    _MASKS.additive(None, masks[0], torch.float32)  # the entry this thread will find
    other = threading.Thread(target=lambda: _MASKS.additive(None, masks[1], torch.float32))

    def any_then_switch(values) -> bool:
        found = builtins.any(values)
        if not other.is_alive() and other.ident is None:
            other.start()
            other.join()
        return found

    monkeypatch.setattr(attention, "any", any_then_switch, raising=False)
    got = _MASKS.additive(None, masks[0], torch.float32)
    assert other.ident is not None
    assert torch.equal(got[0, 0, 0].isinf(), masks[0][0])
