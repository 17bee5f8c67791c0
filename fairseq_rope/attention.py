"""Self-attention that applies a position encoding to queries and keys.

:class:`PositionalMultiheadAttention` is fairseq's :class:`MultiheadAttention`
(same parameters, same incremental-state layout, same beam reordering) with a
self-attention forward that calls a position encoding between the q/k
projections and the key cache. The cache therefore holds keys that are already
rotated, and each decoding step rotates only its new query and key, at the
position its :class:`~fairseq_rope.position_context.PositionContext` gives.

Two paths: a whole sequence (SDPA, or the explicit softmax where the weights or
the encoding need the probabilities) and a decoding step (one query: the
explicit softmax, its q already scaled where the encoding folds 1/√d into its
rotation). Both project through :meth:`_encoded_qkv`, append to the cache
through :meth:`_extend_cache` and share :meth:`_attend_explicitly`.

fairseq's own forward is not reused for this path on purpose: its fast path
hands the raw projection weights to ``F.multi_head_attention_forward`` (or
xformers), which would silently skip any rotation.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_rope.position_context import PositionContext
from fairseq_rope.position_context import current as current_position_context
from fairseq_rope.position_encoding import PositionEncoding

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class _Packing:
    """The packed q/k/v weight and bias of one attention (None: not packed), shared with its three
    projections, which drop it when their parameters are replaced."""

    __slots__ = ("tensors",)

    def __init__(self) -> None:
        self.tensors: Optional[Tuple[Tensor, Optional[Tensor]]] = None


class _DropsPacking:
    """Assigning or deleting one of a module's ``_PACKED_ATTRIBUTES`` (the attention's projections, a
    projection's weight and bias) drops its ``_packing``'s tensors, which would be stale."""

    _PACKED_ATTRIBUTES: FrozenSet[str] = frozenset(("q_proj", "k_proj", "v_proj"))

    def __setattr__(self, name: str, value) -> None:
        if name in self._PACKED_ATTRIBUTES and "_packing" in self.__dict__:
            self._packing.tensors = None
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._PACKED_ATTRIBUTES and "_packing" in self.__dict__:
            self._packing.tensors = None
        super().__delattr__(name)


class PositionalMultiheadAttention(_DropsPacking, MultiheadAttention):
    """Multi-head self-attention with a :class:`PositionEncoding` inside.

    The encoding's hooks (see :mod:`fairseq_rope.position_encoding`) act on
    (batch, heads, time, head_dim) tensors: RoPE rotates q and k, Shaw et al.'s
    relative representations add to the logits and to the values.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        position_encoding: PositionEncoding,
        dropout: float = 0.0,
        **kwargs,
    ) -> None:
        for unsupported in ("add_bias_kv", "add_zero_attn", "xformers_att_config"):
            if kwargs.get(unsupported):
                raise ValueError(f"{type(self).__name__} does not support {unsupported}")
        super().__init__(
            embed_dim, num_heads, dropout=dropout, self_attention=True, **kwargs
        )
        if position_encoding.num_heads not in (None, num_heads):
            raise ValueError(f"the position encoding was built for {position_encoding.num_heads} "
                             f"heads, not {num_heads}")
        self.position_encoding = position_encoding
        self._packing = _Packing()
        self.register_load_state_dict_post_hook(PositionalMultiheadAttention._repack_after_load)
        self._pack_projections()

    # --- q, k, v projections: packed side by side

    def _pack_projections(self) -> None:
        """Store the q, k and v projection weights (and biases) side by side in one tensor each, the
        parameters becoming views into it, so that one matmul projects all three. Parameters, state
        dict and training are unchanged. Nothing is checked per forward: whatever gives the
        parameters new storage repacks (``.to()``, ``.half()``: :meth:`_apply`; a deep copy or
        unpickling: :meth:`__setstate__`; ``load_state_dict(assign=True)``: the load hook), and
        whatever replaces or removes a projection or its parameters (FSDP's flattening, a new
        ``nn.Parameter``, a quantized module) drops the packing (:class:`_DropsPacking`: the
        projections' weights and biases, and the projections themselves). Not seen: a parameter's ``.data`` swapped by hand; assign a new
        ``nn.Parameter`` instead, or call this method again."""
        self._packing.tensors = None
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if any(type(p) not in (torch.nn.Linear, _PackedRowsLinear) or "weight" not in p._parameters
               or p._forward_pre_hooks or p._forward_hooks for p in projections):
            return  # flattened (FSDP), replaced, or hooked (quant-noise): three projections
        if len({p.bias is not None for p in projections}) > 1:
            return
        with torch.no_grad():
            packed = tuple(
                torch.cat([getattr(p, name) for p in projections]) if has else None
                for name, has in (("weight", True), ("bias", self.q_proj.bias is not None))
            )
        for i, projection in enumerate(projections):
            rows = slice(i * self.embed_dim, (i + 1) * self.embed_dim)
            projection.weight.data = packed[0][rows]
            if packed[1] is not None:
                projection.bias.data = packed[1][rows]
            projection.__class__ = _PackedRowsLinear  # fairseq built it: it now reports replacements
            projection._packing = self._packing
        self._packing.tensors = packed

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self._pack_projections()  # the conversion gave the parameters new storage
        return module

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._pack_projections()  # a deep copy or unpickling cloned the parameters out of the pack

    @staticmethod
    def _repack_after_load(module: "PositionalMultiheadAttention", incompatible_keys) -> None:
        if module._packing.tensors is None:  # load_state_dict(assign=True) replaced the parameters
            module._pack_projections()

    def _packed_projection(self) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
        """The packed q/k/v weight and bias, or None (three projections). With gradients, only
        through :class:`_PackedLinear`: the packed tensors are not the parameters autograd updates."""
        return self._packing.tensors

    def _encoded_qkv(
        self, query: Tensor, context: PositionContext, step: bool
    ) -> Tuple[Tensor, Tensor, Tensor, float]:
        """q, k, v as (B, H, T, D), q and k encoded, and the factor that still scales q: one matmul
        with the packed weights (with gradients through :class:`_PackedLinear`), else three. A
        decoding step of a q/k-only encoding takes q, k and v of its one position in one call that
        also scales q by 1/√d (its q then comes as (B, H, D))."""
        tgt_len, bsz, _ = query.size()
        encoding: PositionEncoding = self._modules["position_encoding"]  # (no nn.Module.__getattr__ per step)
        projections = (self.q_proj, self.k_proj, self.v_proj)
        packed = self._packed_projection()
        if packed is not None and torch.is_grad_enabled() and (
            torch.is_autocast_enabled() or any(p._forward_pre_hooks or p._forward_hooks for p in projections)
        ):
            packed = None  # autocast casts inside the matmul; hooks want their module calls
        if packed is None:
            q, k, v = (x.view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
                       for x in (_project(p, query) for p in projections))
            q, k = encoding.encode_qk(q, k, context)
            return q, k, v, self.scaling
        if torch.is_grad_enabled():
            qkv = _PackedLinear.apply(query, *packed, *(p.weight for p in projections),
                                      *(p.bias for p in projections if p.bias is not None))
        else:
            qkv = F.linear(query, *packed)  # (T, B, 3C)
        if step and encoding.qk_only:
            q, k, v = encoding.encode_step(qkv.view(bsz, 3, self.num_heads, self.head_dim), context, self.scaling)
            return q, k.unsqueeze(2), v.unsqueeze(2), 1.0  # q (B, H, D): a step's one query
        q, k, v = encoding.encode_qkv(qkv.view(tgt_len, bsz, 3, self.num_heads, self.head_dim), context)
        return q, k, v, self.scaling

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Same contract as :meth:`MultiheadAttention.forward` for self-attention.

        query: (T, B, C); ``key``/``value`` must be the query itself (or None):
        keys and values are always projected from the query, so any other
        tensor is refused rather than silently ignored. fairseq's layers pass
        ``key=x, value=x`` (encoder) and ``key=y, value=y`` with ``y = x``
        (decoder without cross_self_attention, which the models refuse).

        The positions come from the forward's :class:`PositionContext`, which the
        model binds (:mod:`fairseq_rope.position_context`); called on its own, the
        module makes one: the queries follow the cached keys.
        """
        if static_kv or before_softmax:
            raise ValueError(
                f"{type(self).__name__} is self-attention only "
                "(static_kv and before_softmax are not supported)"
            )
        for name, tensor in (("key", key), ("value", value)):
            if tensor is not None and not _same_tensor(tensor, query):
                raise ValueError(
                    f"{type(self).__name__} is self-attention only: {name} must be the "
                    f"query itself or None, got a different tensor of shape "
                    f"{tuple(tensor.shape)} (query {tuple(query.shape)})"
                )
        need_weights = need_weights or need_head_weights
        saved_state = None if incremental_state is None else self._get_input_buffer(incremental_state)
        context = current_position_context()
        if context is None:
            context = PositionContext(saved_state["prev_key"].size(2) if saved_state and "prev_key" in saved_state
                                      else 0)
        if torch.is_grad_enabled():
            return self._attend(query, context, incremental_state, saved_state, key_padding_mask, attn_mask,
                                need_weights, need_head_weights)
        # No gradient wanted (decoding): inference mode drops the autograd
        # bookkeeping of the dozen small ops and views of a step. The results
        # (and cached keys) are inference tensors, which fairseq only reads.
        with torch.inference_mode():
            return self._attend(query, context, incremental_state, saved_state, key_padding_mask, attn_mask,
                                need_weights, need_head_weights)

    def _attend(
        self,
        query: Tensor,
        context: PositionContext,
        incremental_state: Optional[IncrementalState],
        saved_state: Optional[Dict[str, Optional[Tensor]]],
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        need_weights: bool,
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, bsz, _ = query.size()
        encoding: PositionEncoding = self._modules["position_encoding"]
        step = incremental_state is not None and tgt_len == 1  # a beam-search step: one position
        q, k, v, q_scale = self._encoded_qkv(query, context, step)
        if incremental_state is not None:
            k, v, key_padding_mask = self._extend_cache(incremental_state, saved_state, k, v, key_padding_mask, bsz)
        if step:  # each step's cached padding differs: its own mask
            mask = additive_mask(attn_mask, key_padding_mask, q.dtype)
        else:  # every layer of a pass has the same masks: built once
            mask = context.shared(("additive mask", q.dtype, torch.is_inference_mode_enabled()),
                                  lambda: additive_mask(attn_mask, key_padding_mask, q.dtype))
        if step or need_weights or encoding.needs_probabilities:
            out, weights = self._attend_explicitly(q.reshape(-1, tgt_len, self.head_dim), k, v, mask, context,
                                                   q_scale, need_weights)
            if weights is not None:
                weights = weights.transpose(0, 1) if need_head_weights else weights.mean(dim=1)
        else:
            bias = encoding.logit_bias(q, context, k.size(2))
            if bias is not None:  # a term of the scaled logits, as the masks are
                mask = bias if mask is None else bias + mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self._dropout_p(),
                                                 scale=self.scaling)
            weights = None
        # A single query's output already lies in (1, B, C) order for out_proj: no permute copy.
        out = out.view(1, bsz, self.embed_dim) if tgt_len == 1 else (
            out.view(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3).reshape(
                tgt_len, bsz, self.embed_dim))
        return _project(self.out_proj, out), weights

    def _extend_cache(
        self,
        incremental_state: IncrementalState,
        saved_state: Dict[str, Optional[Tensor]],
        k: Tensor,
        v: Tensor,
        key_padding_mask: Optional[Tensor],
        bsz: int,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Append this step's (already encoded) keys/values to fairseq's cache."""
        cached = "prev_key" in saved_state
        if cached:
            k = torch.cat((saved_state["prev_key"], k), dim=2)
            v = torch.cat((saved_state["prev_value"], v), dim=2)
        prev_key_padding_mask = saved_state.get("prev_key_padding_mask")
        if key_padding_mask is not None or prev_key_padding_mask is not None:  # else it stays None
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=prev_key_padding_mask,
                batch_size=bsz,
                src_len=k.size(2),
                static_kv=False,
            )
        saved_state["prev_key"] = k
        saved_state["prev_value"] = v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        if not cached:  # a cached state is the incremental state's own dict, updated in place
            self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask

    def _dropout_p(self) -> float:
        dropout = self._modules["dropout_module"]
        return dropout.p if self.training or dropout.apply_during_inference else 0.0

    def _attend_explicitly(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], context: PositionContext, q_scale: float,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Softmax attention that materializes the probabilities: for a decoding step (one query:
        two small matmuls beat a fused kernel), for the weights when asked, and for encodings that
        need the probabilities. q: (B·H, T, D), heads folded into the batch for ``bmm`` (without
        matmul's broadcasting work), q times ``q_scale`` the scaled query; k, v: (B, H, S, D).
        Returns the output (B·H, T, D) and, when asked, the per-head weights (B, H, T, S)."""
        encoding = self._modules["position_encoding"]
        heads, head_dim = self.num_heads, self.head_dim
        tgt_len, src_len = q.size(1), k.size(2)
        scaled = q * q_scale if q_scale != 1.0 else q
        logits = torch.bmm(scaled, k.reshape(-1, src_len, head_dim).transpose(1, 2))  # (B·H, T, S)
        if not encoding.qk_only:  # an encoding that has these terms never folds q_scale into q
            bias = encoding.logit_bias(q.view(-1, heads, tgt_len, head_dim), context, src_len)
            if bias is not None:
                mask = bias if mask is None else bias + mask
        if mask is not None:
            logits = (logits.view(-1, heads, tgt_len, src_len) + mask).view(-1, tgt_len, src_len)
        weights = _softmax(logits)
        probs = self._modules["dropout_module"](weights) if self._dropout_p() else weights
        out = torch.bmm(probs, v.reshape(-1, src_len, head_dim))
        if not encoding.qk_only:
            value_term = encoding.value_term(probs.view(-1, heads, tgt_len, src_len), context)
            if value_term is not None:
                out = out + value_term.reshape(-1, tgt_len, head_dim)
        return out, weights.view(-1, heads, tgt_len, src_len) if need_weights else None


class _PackedRowsLinear(_DropsPacking, torch.nn.Linear):
    """An ``nn.Linear`` whose weight and bias are row blocks of its attention's packed tensors
    (fairseq builds the projections; packing gives them this class). Assigning or deleting either
    (``load_state_dict(assign=True)``, FSDP's flattening, a new ``nn.Parameter``) drops the packing,
    which would otherwise go on projecting with the old weights."""

    _PACKED_ATTRIBUTES = frozenset(("weight", "bias"))


class _PackedLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` with the packed q/k/v weight and bias, whose row blocks are the
    three projections' parameters (passed after them, only for autograd to route their gradients):
    one matmul forward; backward one matmul for x, one for the packed weight (each parameter's
    gradient is a view of its block) and one sum for the packed bias, where three projections
    take three of each and two additions."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], *parameters: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        weights_wanted = any(ctx.needs_input_grad[3:6])
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        rows = grad.reshape(-1, grad.size(-1))
        grad_weights = rows.t().mm(x.reshape(-1, x.size(-1))).chunk(3) if weights_wanted else (None,) * 3
        grad_biases = rows.sum(0).chunk(3) if ctx.has_bias else ()
        return (grad_x, None, None, *grad_weights, *grad_biases)


def _softmax(logits: Tensor) -> Tensor:
    """Softmax over the keys; in fp32 for half-precision logits."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(logits, dim=-1, dtype=torch.float32).to(logits.dtype)
    return torch.softmax(logits, dim=-1)


def _project(linear: torch.nn.Linear, x: Tensor) -> Tensor:
    """``linear(x)``, without the module call when nothing hooks into it (quant-noise
    training does): four per layer and decoding step, where overhead is most of the time."""
    if linear._forward_pre_hooks or linear._forward_hooks:
        return linear(x)
    return F.linear(x, linear.weight, linear.bias)


def additive_mask(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], dtype: torch.dtype
) -> Optional[Tensor]:
    """fairseq's masks as one additive mask broadcastable to (B, H, T, S).

    attn_mask: (T, S), additive float (or bool, True = masked);
    key_padding_mask: (B, S), nonzero = padding.
    """
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(
                attn_mask.shape, dtype=dtype, device=attn_mask.device
            ).masked_fill(attn_mask, float("-inf"))
        mask = attn_mask.to(dtype)
    if key_padding_mask is not None:
        padding = key_padding_mask.to(torch.bool)[:, None, None, :]
        base = mask if mask is not None else torch.zeros((), dtype=dtype, device=padding.device)
        mask = base.masked_fill(padding, float("-inf"))
    return mask


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    """``a is b``, or ``a`` an identical view of ``b``'s memory (as ``x[t:t+1]``
    taken once per argument is): same storage, offset, shape, strides and dtype."""
    return a is b or (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
    )
