"""Two threads decoding one model at once (the hub interface, a server's worker threads) each get
what they decode alone: what the positions decide lives in each forward's own context, never on
a module the threads share.

The worst case is forced, not hoped for: thread A's beam search pauses before its decoder's second
layer in its fourth step while thread B runs a whole beam search of its own, then A goes on. With a dynamic RoPE
scaling each sentence's angles follow its source length, and the batches have equal sizes and
different lengths: a source length left behind by B on a shared module would rotate A's queries
and keys at B's scales, silently, since the shapes still agree.
"""

from __future__ import annotations

import threading
from typing import List

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from tests.conftest import build_model
from tests.models.test_positional_transformer import tokens

# L = 4: every test sentence (5 to 11 source tokens) is past it, each at the scale of its length.
DYNAMIC_YARN = ("transformer_rope_tiny", "--rope-scaling", "dynamic-yarn", "--rope-scaling-factor", "2",
                "--rope-original-length", "4")


@pytest.fixture(scope="module")
def model_and_dictionary(dict_dir):
    model, task = build_model(dict_dir, *DYNAMIC_YARN, "--share-all-embeddings", "--dropout", "0")
    return model.eval(), task.target_dictionary


def beam_search(model, dictionary, src: torch.Tensor) -> List[List[dict]]:
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_a=0, max_len_b=8,
                                  search_strategy=search.BeamSearch(dictionary))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    return generator.forward(sample)


def assert_same(got: List[List[dict]], expected: List[List[dict]]) -> None:
    for beam, expected_beam in zip(got, expected, strict=True):
        for hypo, expected_hypo in zip(beam, expected_beam, strict=True):
            assert torch.equal(hypo["tokens"], expected_hypo["tokens"])
            torch.testing.assert_close(hypo["positional_scores"], expected_hypo["positional_scores"],
                                       atol=0, rtol=0)


def test_two_threads_decoding_one_model_each_get_what_they_decode_alone(model_and_dictionary):
    model, dictionary = model_and_dictionary
    source_a = tokens(dictionary, 2, 11, seed=1, pad_left=6)  # 5 and 11 source tokens
    source_b = tokens(dictionary, 2, 9, seed=2, pad_left=1)  # 8 and 9: the same batch size, other lengths
    alone_a = beam_search(model, dictionary, source_a)
    alone_b = beam_search(model, dictionary, source_b)

    results = {}
    calls, paused = [], []

    def run_b() -> None:
        results["b"] = beam_search(model, dictionary, source_b)

    def pause_a_once(module, args):
        # In A's fourth decoding step, between its decoder's first and second layer, B runs whole
        # (a later step than the first: position 0 rotates by no angle, and one key takes all the
        # attention whatever its logit).
        if threading.current_thread() is not threading.main_thread():
            return
        calls.append(True)
        if len(calls) == 4:
            paused.append(True)
            thread_b = threading.Thread(target=run_b)
            thread_b.start()
            thread_b.join()

    hook = model.decoder.layers[1].register_forward_pre_hook(pause_a_once)
    try:
        results["a"] = beam_search(model, dictionary, source_a)
    finally:
        hook.remove()
    assert paused
    assert_same(results["b"], alone_b)
    assert_same(results["a"], alone_a)
