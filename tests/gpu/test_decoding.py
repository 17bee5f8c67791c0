"""Decoding exactness of tiny transformer_rope and transformer_rpe models on the device,
in fp32, fp16 and bf16: incremental decoding computes what the full (teacher-forced)
forward computes, and beam search (fairseq's SequenceGenerator) scores every
hypothesis as forced rescoring (fairseq's SequenceScorer) does.

Tolerance: the two paths round differently, so in each dtype they agree up to
rounding. Its scale is what fairseq's own model makes of the same task: the stock
transformer_tiny (sinusoidal positions, fairseq's attention) decodes the same
inputs on the same device in the same dtype, by both paths, and e_stock is the
larger error of the two against that model's own fp64 forward (its weights as
rounded to the dtype, on the CPU). If each of our paths errs by at most 2·e_stock
against our fp64 forward, the two differ by at most 4·e_stock (triangle
inequality): the tests assert 4·e_stock for both, in root mean square for the
log-probabilities and in the worst token for beam scores. Measured on the CPU
(4 seeds, both models, every dtype): each path's error ≤ 1.7·e_stock in root
mean square and ≤ 2.2·e_stock in the worst element, their difference likewise.
The models' attention is sharpened (see :func:`build`) so that positions weigh:
a decoding step one position off then misses the bound in every dtype (in bf16
by 3×).
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, Tuple

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from fairseq.sequence_scorer import SequenceScorer
from torch import Tensor

from tests.conftest import build_model
from tests.gpu.conftest import DTYPES

pytestmark = pytest.mark.gpu

RATIO = 4.0
SHARPEN = 3.0
BEAM, LENPEN, MAX_LEN = 4, 0.6, 12
ARCHS = {
    "rope": ("transformer_rope_tiny",),
    "rpe": ("transformer_rpe_tiny", "--rpe-max-distance", "4"),  # short k: clipping happens
}
Errors = Dict[str, float]  # "rms" and "max" of the error of log-probabilities


def build(dict_dir, *arch: str):
    """``arch`` with dropout off, its self-attention logits scaled by SHARPEN² (q and k
    weights by SHARPEN): peaked attention, as trained models have, rather than the
    near-uniform attention of a fresh one, so that every position counts."""
    torch.manual_seed(0)
    model, task = build_model(dict_dir, *arch, "--share-all-embeddings", "--dropout", "0")
    with torch.no_grad():
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
            layer.self_attn.k_proj.weight.mul_(SHARPEN)
    return model.eval(), task


def tokens(dictionary, batch: int, length: int, seed: int, pad_left: int = 0) -> Tensor:
    """Random real tokens ending in EOS; the first row left-padded by ``pad_left``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=g)
    x[:, -1] = dictionary.eos()
    x[0, :pad_left] = dictionary.pad()
    return x


def teacher_forcing_batch(dictionary) -> Tuple[Tensor, Tensor, Tensor]:
    """(source, source lengths, previous output tokens) of 3 sentences, the first left-padded."""
    src = tokens(dictionary, 3, 11, seed=1, pad_left=4)
    prev = tokens(dictionary, 3, 13, seed=2)
    prev[:, 0] = dictionary.eos()
    return src, src.ne(dictionary.pad()).sum(1), prev


@torch.no_grad()
def log_probs(model, src: Tensor, lengths: Tensor, prev: Tensor, incremental: bool) -> Tensor:
    """Log-probabilities (B, T, V) in fp64 on the CPU, of the full forward or step by step."""
    device = next(model.parameters()).device
    src, lengths, prev = src.to(device), lengths.to(device), prev.to(device)
    if incremental:
        encoder_out = model.encoder(src, lengths)
        state: dict = {}
        logits = torch.cat([model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0]
                            for t in range(prev.size(1))], dim=1)
    else:
        logits = model(src, lengths, prev)[0]
    return torch.log_softmax(logits.cpu().double(), dim=-1)


def rms(t: Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


def both_paths(model, dictionary, device: torch.device, dtype: torch.dtype):
    """The model in ``dtype`` on ``device``: its full and incremental log-probs, and its
    fp64 full forward on the CPU with the same (rounded) weights."""
    model = copy.deepcopy(model).to(device, dtype)
    batch = teacher_forcing_batch(dictionary)
    full, incremental = (log_probs(model, *batch, incremental=inc) for inc in (False, True))
    exact = log_probs(copy.deepcopy(model).to("cpu", torch.float64), *batch, incremental=False)
    return full, incremental, exact


@pytest.fixture(scope="module")
def stock_error(dict_dir, device) -> Callable[[torch.dtype], Errors]:
    """e_stock per dtype: fairseq's transformer_tiny's larger error (of its two paths)."""
    model, task = build(dict_dir, "transformer_tiny")
    cache: Dict[torch.dtype, Errors] = {}

    def error(dtype: torch.dtype) -> Errors:
        if dtype not in cache:
            full, incremental, exact = both_paths(model, task.target_dictionary, device, dtype)
            cache[dtype] = {
                "rms": max(rms(full - exact), rms(incremental - exact)),
                "max": max((full - exact).abs().max().item(), (incremental - exact).abs().max().item()),
            }
            assert cache[dtype]["rms"] > 0  # the dtype does round: a scale to compare with
        return cache[dtype]

    return error


@pytest.fixture(scope="module", params=list(ARCHS), ids=list(ARCHS))
def tiny_model(request, dict_dir):
    return build(dict_dir, *ARCHS[request.param])


@pytest.mark.parametrize("dtype", DTYPES)
def test_incremental_decoding_equals_the_full_forward(tiny_model, stock_error, device, dtype):
    model, task = tiny_model
    full, incremental, exact = both_paths(model, task.target_dictionary, device, dtype)
    tolerance = RATIO * stock_error(dtype)["rms"]
    for name, error in [("incremental - full", rms(incremental - full)), ("full - fp64", rms(full - exact)),
                        ("incremental - fp64", rms(incremental - exact))]:
        assert error <= tolerance, f"{name}: rms {error:.3g} > {tolerance:.3g} ({RATIO:g} e_stock)"


@pytest.mark.parametrize("dtype", DTYPES)
def test_beam_search_scores_equal_forced_rescoring(tiny_model, stock_error, device, dtype):
    model, task = tiny_model
    model = copy.deepcopy(model).to(device, dtype)
    d = task.target_dictionary
    src = tokens(d, 3, 10, seed=4, pad_left=3).to(device)
    lengths = src.ne(d.pad()).sum(1)
    generator = SequenceGenerator([model], d, beam_size=BEAM, len_penalty=LENPEN, max_len_a=0, max_len_b=MAX_LEN,
                                  search_strategy=search.BeamSearch(d))
    hypotheses = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})

    # Every hypothesis rescored in one teacher-forced batch, padded on the right.
    sentence = [i for i, beam in enumerate(hypotheses) for _ in beam]
    targets = [hypo["tokens"] for beam in hypotheses for hypo in beam]
    assert len(targets) == 3 * BEAM
    target = torch.full((len(targets), max(map(len, targets))), d.pad(), dtype=torch.long, device=device)
    prev = target.clone()
    for row, tokens_ in enumerate(targets):
        assert tokens_[-1] == d.eos() and d.eos() not in tokens_[:-1]
        target[row, : len(tokens_)] = tokens_
        prev[row, : len(tokens_)] = torch.cat([tokens_.new_tensor([d.eos()]), tokens_[:-1]])
    sample = {"net_input": {"src_tokens": src[sentence], "src_lengths": lengths[sentence],
                            "prev_output_tokens": prev}, "target": target}
    rescored = SequenceScorer(d).generate([model], sample)

    tolerance = RATIO * stock_error(dtype)["max"]
    for hypo, [forced] in zip((h for beam in hypotheses for h in beam), rescored):
        assert torch.equal(forced["tokens"], hypo["tokens"])
        gap = (hypo["positional_scores"].double() - forced["positional_scores"].double()).abs().max().item()
        assert gap <= tolerance, f"positional scores differ by {gap:.3g} > {tolerance:.3g} ({RATIO:g} e_stock)"
        # The score beam search ranks by: Σ log p over the tokens (EOS included) / length^lenpen.
        length = len(hypo["tokens"])
        expected = forced["positional_scores"].double().sum().item() / length**LENPEN
        assert abs(float(hypo["score"]) - expected) <= tolerance * length ** (1 - LENPEN)
