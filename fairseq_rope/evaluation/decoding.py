"""fairseq-generate as the tables decode: beam 4, length penalty 0.6, the whole subset, on CPU.

:mod:`fairseq_rope.evaluation.evaluate` decodes a run's averaged checkpoint with it; the studies
(:mod:`fairseq_rope.experiments.bleu_curve`, :mod:`fairseq_rope.experiments.runaways`) call
:func:`generate` to decode other checkpoints, subsets or settings.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, List, Mapping, Sequence

import torch
from fairseq_rope_serve.decoding import TABLE_DECODING  # noqa: F401 (the harness imports it from here)

from fairseq_rope.base import PLUGIN_DIR, TABLE_DECODING, fairseq_command
from fairseq_rope.evaluation.scoring import ScoringError


def generate_command(checkpoint: Path, data_bin: Path, subset: str = "test",
                     settings: Mapping[str, Any] = TABLE_DECODING, max_tokens: int = 8192) -> List[str]:
    """fairseq-generate's command line, program name first, as results record it.

    ``--required-batch-size-multiple 1``: with fairseq's default of 8 the last
    batch (the longest sentences) is dropped unless its size is a multiple of 8
    (facebookresearch/fairseq#5036), and BLEU would be on an incomplete test set.
    """
    command = ["fairseq-generate", str(data_bin), "--user-dir", str(PLUGIN_DIR),
               "--path", str(checkpoint), "--gen-subset", subset, "--beam", str(settings["beam"]),
               "--lenpen", str(settings["lenpen"]), "--max-len-a", str(settings["max_len_a"]),
               "--max-len-b", str(settings["max_len_b"]), "--remove-bpe", "--max-tokens", str(max_tokens),
               "--required-batch-size-multiple", "1"]
    if not torch.cuda.is_available():
        command.append("--cpu")  # fairseq would fall back to CPU anyway; this says so
    return command


def generate(checkpoint: Path, data_bin: Path, out: Path, subset: str = "test",
             settings: Mapping[str, Any] = TABLE_DECODING, score_reference: bool = False,
             extra: Sequence[str] = ()) -> List[str]:
    """Decode (or with ``score_reference`` force-decode) ``subset`` into ``out``, with ``extra``
    fairseq-generate arguments last (``--model-overrides …``); returns the command."""
    command = generate_command(checkpoint, data_bin, subset, settings)
    if score_reference:
        command.append("--score-reference")
    command += extra
    with open(out, "w", encoding="utf-8") as f:
        result = subprocess.run([*fairseq_command(command[0]), *command[1:]], stdout=f,
                                stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ScoringError(f"fairseq-generate failed on {checkpoint}:\n{result.stderr[-3000:]}")
    return command
