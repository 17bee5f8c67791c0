"""fairseq-generate as the tables decode: beam 4, length penalty 0.6, the whole subset, on CPU.

``scripts/evaluate.sh`` is the shell form of the same command; the studies
(:mod:`fairseq_rope.experiments.bleu_curve`, :mod:`fairseq_rope.experiments.runaways`) call
:func:`generate` to decode other checkpoints, subsets or settings.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping

from fairseq_rope.base import PLUGIN_DIR
from fairseq_rope.evaluation.scoring import ScoringError

#: The paper's decoding (fairseq's default length limit: 0 x source + 200 subwords).
TABLE_DECODING: Dict[str, Any] = {"beam": 4, "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200}


def fairseq_command(name: str) -> str:
    """A fairseq console script beside this interpreter (a venv not on PATH), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else (shutil.which(name) or name)


def generate(checkpoint: Path, data_bin: Path, out: Path, subset: str = "test",
             settings: Mapping[str, Any] = TABLE_DECODING, score_reference: bool = False) -> List[str]:
    """Decode (or with ``score_reference`` force-decode) ``subset`` into ``out``; returns the command.

    ``--required-batch-size-multiple 1``: fairseq's default of 8 drops the last
    batch of the test set (facebookresearch/fairseq#5036).
    """
    command = [fairseq_command("fairseq-generate"), str(data_bin), "--user-dir", str(PLUGIN_DIR),
               "--path", str(checkpoint), "--gen-subset", subset, "--beam", str(settings["beam"]),
               "--lenpen", str(settings["lenpen"]), "--max-len-a", str(settings["max_len_a"]),
               "--max-len-b", str(settings["max_len_b"]), "--remove-bpe", "--max-tokens", "8192",
               "--required-batch-size-multiple", "1", "--cpu"]
    if score_reference:
        command.append("--score-reference")
    with open(out, "w", encoding="utf-8") as f:
        result = subprocess.run(command, stdout=f, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ScoringError(f"fairseq-generate failed on {checkpoint}:\n{result.stderr[-3000:]}")
    return command
