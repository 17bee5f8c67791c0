"""The runtime's BPE removal is fairseq's ``--remove-bpe`` (fairseq's own function as reference)."""

from __future__ import annotations

import pytest
from fairseq.data.data_utils import post_process

from fairseq_rope_serve.bpe import remove_bpe


@pytest.mark.parametrize("tokens", [
    ["Das", "Haus", "."], ["H@@", "a@@", "us", "ist", "gr@@", "oß"], ["end@@"], ["a@@", "@@", "b"], ["@@"],
    ["x@@y", "z"], [], ["re@@", "-@@", "do"],
])
def test_remove_bpe_is_fairseqs(tokens):
    assert remove_bpe(tokens) == post_process(" ".join(tokens), "@@ ")
