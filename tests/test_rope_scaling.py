"""RoPE scaling (fairseq_rope/rope_scaling.py) against the papers' equations, written out
here in fp64 without any helper of the code under test:

* position interpolation (Chen et al. 2023 §2.2): f′(x, m) = f(x, m/s) — positions shrunk,
  not frequencies, so the reference rotates at the fractional position m/s;
* NTK-aware (Peng et al. 2023 §3.2): the base b′ = b·s^(d/(d−2)) in RoFormer's Eq. 15;
* YaRN (Peng et al. §3.2, §3.4): NTK-by-parts, h(θ) = (1 − γ(r))·θ/s + γ(r)·θ with r = L/λ,
  λ = 2π/θ, and softmax(q·k / (t·√d)) with √(1/t) = 0.1·ln s + 1;
* the dynamic rule as Hugging Face computes Dynamic NTK: base·(S·ℓ/L − (S − 1))^(d/(d−2)) with
  ℓ raised to L when shorter; its scale, here followed by every method.
"""

import math

import pytest
import torch

from tests.conftest import attend_step_by_step

from fairseq_rope.position_context import PositionContext
from fairseq_rope import rotary
from fairseq_rope.attention import PositionalMultiheadAttention
from fairseq_rope.rope_scaling import RopeScaling, validate_rope_scaling
from fairseq_rope.rotary import RotaryEmbedding, layout_permutation

D = 32  # head dim = rope dim
THETA = 10000.0
# L = 1024 puts RoFormer's θ_i (d = 32) on all three parts of YaRN's ramp (checked below).
L = 1024


# --- References (fp64, from the papers)


def rope_frequencies(base: float, d: int = D) -> list:
    """RoFormer Eq. 15: θ_i = base^(−2(i−1)/d), i = 1 … d/2."""
    return [base ** (-2 * (i - 1) / d) for i in range(1, d // 2 + 1)]


def rotate(x: torch.Tensor, positions, frequencies) -> torch.Tensor:
    """RoFormer Eq. 34 on adjacent pairs, one position per row of x (T, d), in fp64."""
    out = x.double().clone()
    for t, m in enumerate(positions):
        for i, theta in enumerate(frequencies):
            c, s = math.cos(m * theta), math.sin(m * theta)
            a, b = x[t, 2 * i].item(), x[t, 2 * i + 1].item()
            out[t, 2 * i], out[t, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out


def ramp(r: float, alpha: float = 1.0, beta: float = 32.0) -> float:
    """YaRN's γ(r) (§3.2)."""
    if r < alpha:
        return 0.0
    if r > beta:
        return 1.0
    return (r - alpha) / (beta - alpha)


def yarn_reference(s: float, original_length: float = L, d: int = D) -> list:
    """h(θ_d) = (1 − γ(r(d)))·θ_d/s + γ(r(d))·θ_d, r(d) = L/λ_d, λ_d = 2π/θ_d (YaRN §3.2)."""
    out = []
    for theta in rope_frequencies(THETA, d):
        gamma = ramp(original_length / (2 * math.pi / theta))
        out.append((1 - gamma) * theta / s + gamma * theta)
    return out


def hf_dynamic_scale(length: int, original_length: int, factor: float) -> float:
    """Hugging Face's Dynamic NTK: ℓ raised to L, then S·ℓ/L − (S − 1)."""
    length = max(length, original_length)
    return factor * length / original_length - (factor - 1)


def temperature(s: float) -> float:
    """t of softmax(q·k / (t·√d)), from √(1/t) = 0.1·ln s + 1 (YaRN §3.4)."""
    return 1 / (0.1 * math.log(s) + 1) ** 2


def reference(method: str, s: float, x: torch.Tensor, positions, original_length: int = L) -> torch.Tensor:
    """x (T, d) rotated as ``method`` at scale s rotates it, at ``positions``."""
    if method == "linear":
        return rotate(x, [m / s for m in positions], rope_frequencies(THETA))
    if method == "ntk":
        return rotate(x, positions, rope_frequencies(THETA * s ** (D / (D - 2))))
    return rotate(x, positions, yarn_reference(s, original_length))


def encode(scaling: RopeScaling, q: torch.Tensor, k: torch.Tensor, offset: int, lengths=None, layout="interleaved"):
    """q, k (B, H, T, d) through the encoding the attention uses."""
    encoding = RotaryEmbedding(D, theta=THETA, layout=layout, scaling=scaling)
    return encoding.encode_qk(q, k, PositionContext(offset, lengths))


METHODS = ["linear", "ntk", "yarn"]


# --- Formulas


def test_the_reference_yarn_ramp_has_all_three_parts():
    gammas = {ramp(L * theta / (2 * math.pi)) for theta in rope_frequencies(THETA)}
    assert 0.0 in gammas and 1.0 in gammas and any(0 < g < 1 for g in gammas)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("s", [1.5, 4.0])
def test_fixed_scaling_rotates_as_the_papers_equation(method, s):
    """q and k at positions 1000 … 1004 in fp64: the rotation of the reference; with YaRN,
    q·k also divided by t (q carries 1/t, k none), so the logits are the paper's."""
    scaling = RopeScaling(method, s, L if method == "yarn" else None)
    q, k = torch.randn(2, 1, 1, 5, D, dtype=torch.float64).unbind(0)
    rq, rk = encode(scaling, q, k, offset=1000)
    positions = range(1000, 1005)
    expected_q, expected_k = reference(method, s, q[0, 0], positions), reference(method, s, k[0, 0], positions)
    t = temperature(s) if method == "yarn" else 1.0
    torch.testing.assert_close(rk[0, 0], expected_k, atol=1e-10, rtol=0)
    torch.testing.assert_close(rq[0, 0], expected_q / t, atol=1e-10, rtol=0)
    torch.testing.assert_close(rq[0, 0] @ rk[0, 0].T, (expected_q @ expected_k.T) / t, atol=1e-9, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_the_half_layout_is_the_same_scaling(method):
    scaling = RopeScaling(method, 3.0, L if method == "yarn" else None)
    x = torch.randn(1, 2, 6, D, dtype=torch.float64)
    perm = layout_permutation(D)
    half, _ = encode(scaling, x, x, offset=40, layout="half")
    interleaved, _ = encode(scaling, x[..., perm], x[..., perm], offset=40)
    torch.testing.assert_close(interleaved, half[..., perm], atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_dynamic_scaling_gives_each_sentence_the_scale_of_its_source_length(method, factor):
    """A batch of three sentences of 5, 40 and 100 source tokens with L = 32: each is rotated
    (and, for YaRN, its logits divided by t) exactly as the fixed scaling at Hugging Face's
    s for its own length — the first at s = 1, plain RoPE."""
    original_length = 32
    lengths = torch.tensor([5, 40, 100])
    scaling = RopeScaling(f"dynamic-{method}", factor, original_length)
    q, k = torch.randn(2, 3, 1, 4, D, dtype=torch.float64).unbind(0)
    rq, rk = encode(scaling, q, k, offset=7, lengths=lengths)
    # The first sentence, shorter than L: RoFormer's rotation at θ_i, no temperature.
    for rotated, x in ((rq, q), (rk, k)):
        torch.testing.assert_close(rotated[0, 0], rotate(x[0, 0], range(7, 11), rope_frequencies(THETA)),
                                   atol=1e-10, rtol=0)
    for b, length in enumerate(lengths.tolist()):
        s = hf_dynamic_scale(length, original_length, factor)
        expected_q, expected_k = (reference(method, s, x[b, 0], range(7, 11), original_length) for x in (q, k))
        t = temperature(s) if method == "yarn" else 1.0
        torch.testing.assert_close(rk[b, 0], expected_k, atol=1e-10, rtol=0)
        torch.testing.assert_close(rq[b, 0], expected_q / t, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kind", [*METHODS, *(f"dynamic-{m}" for m in METHODS)])
def test_scale_one_gives_the_unscaled_frequencies_exactly(kind):
    """At s = 1 every method returns θ_i bit for bit (and YaRN's 1/t is exactly 1), so a
    scaled model translates sentences within the training length as the unscaled one."""
    inv_freq = rotary.inverse_frequencies(D, THETA, dtype=torch.float64)
    scaling = RopeScaling(kind, 1.0, L if kind != "linear" and kind != "ntk" else None)
    assert torch.equal(scaling.frequencies(inv_freq, 1.0), inv_freq)
    assert torch.equal(scaling.frequencies(inv_freq, torch.ones(3, 1, dtype=torch.float64)), inv_freq.expand(3, -1))
    assert scaling.logit_factor(1.0) == 1.0


def test_fixed_scaling_at_one_is_bit_identical_to_no_scaling():
    x = torch.randn(2, 2, 9, D)
    plain = RotaryEmbedding(D).encode_qk(x, x, PositionContext(3))
    for scaling in (RopeScaling("linear", 1.0), RopeScaling("ntk", 1.0), RopeScaling("yarn", 1.0, L)):
        for got, expected in zip(RotaryEmbedding(D, scaling=scaling).encode_qk(x, x, PositionContext(3)), plain):
            assert torch.equal(got, expected)


# --- In the attention: the fused and explicit paths, and the lean decoding step


def reference_attention(attn, x, method, s, mask=None):
    """softmax(q·k / (t·√d))·v with q, k rotated by the reference, per head, in fp64."""
    T, B, C = x.shape
    H = attn.num_heads
    heads = lambda t: t.view(T, B, H, D).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    rq = torch.stack([torch.stack([reference(method, s, q[b, h], range(T)) for h in range(H)]) for b in range(B)])
    rk = torch.stack([torch.stack([reference(method, s, k[b, h], range(T)) for h in range(H)]) for b in range(B)])
    t = temperature(s) if method == "yarn" else 1.0
    logits = rq @ rk.transpose(-1, -2) / (t * D**0.5)
    if mask is not None:
        logits = logits + mask
    z = torch.softmax(logits, -1) @ v
    return attn.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, C))


@pytest.mark.parametrize("method", METHODS)
def test_attention_and_its_decoding_steps_follow_the_equations(method):
    """The fused path (no weights), the explicit one (weights) and beam search's lean
    steps (the scaled table; YaRN's 1/t folded into q's scaling) all compute the
    reference attention."""
    s = 3.0
    scaling = RopeScaling(method, s, L if method == "yarn" else None)
    attn = PositionalMultiheadAttention(2 * D, 2, RotaryEmbedding(D, scaling=scaling)).double().eval()
    x = torch.randn(7, 2, 2 * D, dtype=torch.float64)
    causal = torch.triu(torch.full((7, 7), float("-inf"), dtype=torch.float64), 1)
    expected = reference_attention(attn, x, method, s, causal)
    for need_weights in (False, True):
        out, _ = attn(x, x, x, attn_mask=causal, need_weights=need_weights)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(attend_step_by_step(attn, x), expected, atol=1e-10, rtol=0)


def test_dynamic_scaling_trains_and_gradients_pass_gradcheck():
    """Each sentence's cos/sin broadcast over the heads and YaRN's 1/t: through the rotation's
    own backward; the cos/sin computed under inference mode are never reused by training."""
    scaling = RopeScaling("dynamic-yarn", 2.0, 4)
    encoding = RotaryEmbedding(8, rope_dim=6, scaling=scaling)
    lengths = torch.tensor([3, 9])
    with torch.inference_mode():
        encoding.encode_qk(torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), PositionContext(2, lengths))
    q, k = (torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b: encoding.encode_qk(a, b, PositionContext(2, lengths)), (q, k))
    q32 = torch.randn(2, 2, 5, 8, requires_grad=True)
    sum(t.sum() for t in encoding.encode_qk(q32, q32, PositionContext(2, lengths))).backward()
    assert q32.grad is not None and torch.isfinite(q32.grad).all()


def test_dynamic_scaling_without_source_lengths_is_a_clear_error():
    encoding = RotaryEmbedding(8, scaling=RopeScaling("dynamic-ntk", 1.0, 16))
    x = torch.randn(2, 1, 3, 8)
    with pytest.raises(RuntimeError, match="scales each sentence by its source length"):
        encoding.encode_qk(x, x, PositionContext(0))
    with pytest.raises(RuntimeError, match=r"\(3,\) source lengths for queries of shape \(2, 1, 3, 8\)"):
        encoding.encode_qk(x, x, PositionContext(0, torch.tensor([4, 5, 6])))


@pytest.mark.parametrize("args, message", [
    (("linear", None, None), "--rope-scaling linear needs --rope-scaling-factor S"),
    (("yarn", 2.0, None), "--rope-scaling yarn needs --rope-original-length L"),
    (("dynamic-ntk", None, None), "--rope-scaling dynamic-ntk needs --rope-original-length L"),
    (("none", 2.0, None), "--rope-scaling-factor 2.0 is set, but --rope-scaling is 'none'"),
    (("none", None, 64), "--rope-original-length 64 is set, but --rope-scaling is 'none'"),
    (("ntk", 0.5, None), "--rope-scaling-factor must be a finite number >= 1, got 0.5"),
    (("ntk", float("inf"), None), "--rope-scaling-factor must be a finite number >= 1, got inf"),
    (("ntk", "2", None), "--rope-scaling-factor must be a finite number >= 1, got '2'"),
    (("dynamic-yarn", None, 0), "--rope-original-length must be an integer >= 1, got 0"),
    (("dynamic-yarn", None, 64.0), "--rope-original-length must be an integer >= 1, got 64.0"),
    (("ntk", 2.0, None, 2), r"--rope-scaling ntk needs --rope-dim >= 4 \(b·s\^\(d/\(d-2\)\)\), got 2"),
    (("cubic", 2.0, None), "--rope-scaling must be one of none, linear, ntk, yarn, dynamic-linear, "
                           "dynamic-ntk, dynamic-yarn, got 'cubic'"),
])
def test_invalid_scaling_options_are_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        validate_rope_scaling(*args)


def test_linear_and_ntk_accept_the_length_they_do_not_use():
    """One set of overrides (with L) serves every method of a sweep."""
    for kind in ("linear", "ntk"):
        validate_rope_scaling(kind, 2.0, 64)
        x = torch.randn(1, 1, 5, D)
        for got, expected in zip(RotaryEmbedding(D, scaling=RopeScaling(kind, 2.0, 64)).encode_qk(x, x, PositionContext(9)),
                                 RotaryEmbedding(D, scaling=RopeScaling(kind, 2.0)).encode_qk(x, x, PositionContext(9))):
            assert torch.equal(got, expected)
