"""A whole model through the fused rotation (interpreted on the CPU) against the PyTorch path: a
training step (loss and every parameter's gradient) and a beam search (the same hypotheses,
scores within rounding), in fp32; the kernel launched twice per self-attention layer and
training step, once per encoder layer in a beam search (its steps rotate with PyTorch)."""

from __future__ import annotations

import copy

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from tests.gpu.test_decoding import BEAM, LENPEN, MAX_LEN, build, teacher_forcing_batch, tokens

pytestmark = pytest.mark.triton

ARCHS = {
    "rope": ("transformer_rope_tiny",),
    "rope-half-partial-yarn": ("transformer_rope_tiny", "--rope-layout", "half", "--rope-dim", "4",
                               "--rope-scaling", "dynamic-yarn", "--rope-original-length", "6"),
}


@pytest.fixture(scope="module", params=list(ARCHS), ids=list(ARCHS))
def model(request, dict_dir):
    return build(dict_dir, *ARCHS[request.param])


def self_attention_layers(model) -> int:
    return len(model.encoder.layers) + len(model.decoder.layers)


def training_step(model, dictionary):
    """Loss and gradients of a teacher-forced batch (dropout off), through the model's forward."""
    model = copy.deepcopy(model).train()
    src, lengths, prev = teacher_forcing_batch(dictionary)
    logits = model(src, lengths, prev)[0]
    loss = torch.log_softmax(logits, -1).gather(-1, prev.roll(-1, 1)[..., None]).mean()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_a_training_step_equals_the_pytorch_path(paths, model):
    model, task = model
    with paths("fused") as launches:
        fused_loss, fused_grads = training_step(model, task.target_dictionary)
    with paths("pytorch"):
        loss, grads = training_step(model, task.target_dictionary)
    assert len(launches) == 2 * self_attention_layers(model)  # forward and backward, q and k (and v) at once
    torch.testing.assert_close(fused_loss, loss, atol=1e-6, rtol=1e-6)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # The gradient reached the self-attention's projections: through the packed projection's views.
    assert fused_grads["encoder.layers.0.self_attn.q_proj.weight"].abs().sum() > 0


def test_beam_search_equals_the_pytorch_path(paths, model):
    model, task = model
    d = task.target_dictionary
    src = tokens(d, 3, 10, seed=4, pad_left=3)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}

    def beam_search():
        generator = SequenceGenerator([model], d, beam_size=BEAM, len_penalty=LENPEN, max_len_a=0,
                                      max_len_b=MAX_LEN, search_strategy=search.BeamSearch(d))
        return generator.forward(sample)

    with paths("fused") as launches:
        fused = beam_search()
    with paths("pytorch"):
        expected = beam_search()
    # One launch per encoder layer; the decoding steps rotate one position each, with PyTorch.
    assert len(launches) == len(model.encoder.layers), launches
    for fused_beam, beam in zip(fused, expected):
        assert [h["tokens"].tolist() for h in fused_beam] == [h["tokens"].tolist() for h in beam]
        for fused_hypo, hypo in zip(fused_beam, beam):
            torch.testing.assert_close(fused_hypo["positional_scores"], hypo["positional_scores"],
                                       atol=1e-5, rtol=1e-5)
