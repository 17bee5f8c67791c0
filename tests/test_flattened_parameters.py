"""The RoPE attention under fairscale's FSDP (``--ddp-backend fully_sharded``).

fairscale's FlattenParamsWrapper copies a module's parameters into one flat
parameter, deletes them from their modules and sets plain tensors, views into the
flat one, in their place. fairscale is not a dependency, so that is done here by
hand, as its ``_flatten_params`` does it (``delattr``, then ``setattr`` of views)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import Tensor, nn

from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.rotary import RotaryEmbedding

EMBED, HEADS = 32, 4


class Flattened(nn.Module):
    """What FlattenParamsWrapper leaves: the module's parameters gone, one flat
    parameter here, and each old name a plain attribute viewing into it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        named = [(m, n, p) for m in module.modules() for n, p in m.named_parameters(recurse=False)]
        self.flat_param = nn.Parameter(torch.cat([p.detach().reshape(-1) for _, _, p in named]))
        self.module = module
        self.names = [(m, n, p.shape) for m, n, p in named]
        for m, n, _ in self.names:
            delattr(m, n)
        self.set_views()
        assert not list(module.parameters())  # as under fairscale: only the flat one is left

    def set_views(self) -> None:
        """The views, made afresh (fairscale does it before every forward)."""
        views = self.flat_param.split([shape.numel() for _, _, shape in self.names])
        for (m, n, shape), view in zip(self.names, views):
            setattr(m, n, view.view(shape))


def decode(attn: nn.Module, x: Tensor) -> Tensor:
    """Incremental steps over x (T, B, C), as beam search makes them (without gradients:
    the lean step where the projections are packed)."""
    state: dict = {}
    with torch.no_grad():
        return torch.cat([attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state,
                               need_weights=False)[0] for t in range(x.size(0))])


def forwards(attn: PositionalMultiheadAttention, x: Tensor, kpm: Tensor):
    """The forwards that read the projections: with and without gradients, fused and
    explicit attention, and a beam-search decode."""
    with torch.no_grad():
        fused = attn(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
        weighted, weights = attn(x, x, x, key_padding_mask=kpm, need_weights=True)
    trained = attn(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    return fused, weighted, weights, trained.detach(), decode(attn, x)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_flattened_parameters_fall_back_to_three_projections(layout):
    """Every forward of the flattened module equals the intact module's, with the
    flat parameter changed after flattening (as an optimizer step would), so that a
    stale packed copy of the old weights could not pass; gradients reach the flat
    parameter; a conversion (``_apply``) afterwards does not try to repack."""
    torch.manual_seed(0)
    attn, intact = (PositionalMultiheadAttention(EMBED, HEADS, RotaryEmbedding(EMBED // HEADS, layout=layout)).eval()
                    for _ in range(2))
    intact.load_state_dict(attn.state_dict())  # in place (a deepcopy would clone the parameters out of the pack)
    wrapper = Flattened(attn)
    with torch.no_grad():
        wrapper.flat_param.mul_(0.5)
        for p in intact.parameters():
            p.mul_(0.5)  # in place: intact stays packed
    wrapper.set_views()
    assert intact._packed_projection() is not None
    x = torch.randn(5, 3, EMBED)
    kpm = torch.arange(5)[None, :] >= torch.tensor([5, 3, 1])[:, None]
    for got, expected in zip(forwards(attn, x, kpm), forwards(intact, x, kpm)):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)

    attn(x, x, x, key_padding_mask=kpm, need_weights=False)[0].sum().backward()
    assert wrapper.flat_param.grad is not None and wrapper.flat_param.grad.abs().sum() > 0

    wrapper.float()  # an _apply that finds no projection parameters: nothing to pack
    with torch.no_grad():
        wrapper.flat_param.mul_(2.0)
        for p in intact.parameters():
            p.mul_(2.0)
    wrapper.set_views()
    torch.testing.assert_close(decode(attn, x), decode(intact, x), atol=1e-6, rtol=1e-6)


def test_flattening_leaves_no_packed_copy_alive():
    """The packed q/k/v tensor held the old parameters' storage; flattening them away lets it go,
    rather than keep an unsharded copy (and no forward can use it)."""
    attn = PositionalMultiheadAttention(EMBED, HEADS, RotaryEmbedding(EMBED // HEADS)).eval()
    packed_weight = weakref.ref(attn._packed_projection()[0])
    wrapper = Flattened(attn)
    gc.collect()
    assert packed_weight() is None, "the packed copy of the old weights is still alive"
    assert attn._packed_projection() is None
    assert wrapper.flat_param.numel() == 4 * (EMBED * EMBED + EMBED)  # q, k, v, out: all flattened
