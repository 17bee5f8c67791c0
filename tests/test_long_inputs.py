"""Long inputs: RoPE and RPE have no maximum position, so a model whose
--max-source/target-positions only filtered its (short) training data translates
a 1024-token source; the stock rows report their limits with fairseq's message.

Batches are made the way fairseq-generate, fairseq-interactive and the hub do:
the running command's task limits, resolved with the model's ``max_positions()``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Tuple

import pytest
import torch

from fairseq_rope.models.positional_transformer import UNBOUNDED_POSITIONS
from tests.conftest import TOY_LEXICON, build_model, fairseq_cli, parse_train_args

SOURCE_TOKENS = 1024
# What the models were "trained" with: a filter set from short training data.
SHORT = ("--max-source-positions", "16", "--max-target-positions", "16")
# The running command's data filter (fairseq-generate/interactive --max-source-positions).
RUNNING = ("--max-source-positions", "2048", "--max-target-positions", "2048")


def running_task(data_dir: Path, arch: str):
    from fairseq import tasks

    return tasks.setup_task(parse_train_args(data_dir, arch, *RUNNING))


def long_batches(task, model, skip_invalid: bool = False) -> List[dict]:
    """fairseq-interactive's batching of one 1024-token line (plus EOS)."""
    from fairseq import utils

    line = " ".join(f"w{i % 60}" for i in range(SOURCE_TOKENS))
    tokens, lengths = task.get_interactive_tokens_and_lengths([line], lambda x: x)
    return list(task.get_batch_iterator(
        dataset=task.build_dataset_for_inference(tokens, lengths),
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=skip_invalid,
    ).next_epoch_itr(shuffle=False))


@pytest.mark.parametrize("arch", ["transformer_rope_tiny", "transformer_rpe_tiny"])
def test_position_free_rows_translate_a_1024_token_source(arch, dict_dir):
    from fairseq.dataclass.configs import GenerationConfig

    model, _ = build_model(dict_dir, arch, *SHORT)
    model.eval()
    assert model.max_positions() == (UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS)
    task = running_task(dict_dir, arch)
    (batch,) = long_batches(task, model)

    seen: List[Tuple[int, ...]] = []  # (time, batch, dim) out of the last encoder layer
    hook = model.encoder.layers[-1].register_forward_hook(
        lambda module, args, out: seen.append(tuple(out.shape)))
    generator = task.build_generator([model], GenerationConfig(beam=4, lenpen=0.6, max_len_b=8))
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], batch)
    hook.remove()

    assert seen and seen[0][0] == SOURCE_TOKENS + 1  # every token and EOS, none cut
    best = hypos[0][0]
    assert math.isfinite(best["score"]) and torch.isfinite(best["positional_scores"]).all()


@pytest.mark.parametrize("extra", [
    pytest.param(("--encoder-learned-pos", "--decoder-learned-pos"), id="learned"),  # a table of 16 positions
    pytest.param((), id="sinusoidal"),  # fairseq keeps the training limit as the stock model's
])
def test_stock_rows_report_their_limit_instead_of_crashing(extra, dict_dir):
    model, _ = build_model(dict_dir, "transformer_tiny", *extra, *SHORT)
    assert model.max_positions() == (16, 16)
    task = running_task(dict_dir, "transformer_tiny")
    # fairseq's message: the source's size (1025 with EOS), the limit, the way to skip.
    with pytest.raises(Exception, match=(
        rf"Size of sample #0 is invalid \(.*\b{SOURCE_TOKENS + 1}\b.*\) since max_positions=\(16, 16\), "
        "skip this example with --skip-invalid-size-inputs-valid-test"
    )):
        long_batches(task, model)
    assert long_batches(task, model, skip_invalid=True) == []


def test_trained_rope_translates_a_1024_token_source_through_interactive(toy_data_bin, trained_rope_checkpoint):
    """The fixture's model saw sentences of 2-7 words; its --max-source-positions (fairseq's
    default 1024) was a data filter, so only the running command's filter applies."""
    words = sorted(TOY_LEXICON)
    source = " ".join(words[i % len(words)] for i in range(SOURCE_TOKENS))
    out = fairseq_cli("fairseq-interactive", [
        toy_data_bin, "--user-dir", "fairseq_rope", "--path", trained_rope_checkpoint, "--cpu",
        "--source-lang", "en", "--target-lang", "de", "--beam", "4", "--lenpen", "0.6", *RUNNING,
    ], input=source + "\n")
    fields = {line.split("\t")[0]: line.split("\t")[1:] for line in out.stdout.splitlines() if "\t" in line}
    assert fields["S-0"][0] == source  # the encoder got all 1024 tokens
    score, hypothesis = fields["H-0"]
    assert math.isfinite(float(score)) and hypothesis
    assert all(math.isfinite(float(p)) for p in fields["P-0"][0].split())
