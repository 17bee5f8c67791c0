"""The device a table run trains and decodes on: ``reproduce_table.sh --device``.

The table's configs name no device. A run's training and decoding
subprocesses see exactly one device through ``CUDA_VISIBLE_DEVICES``: one GPU
(``cuda``, ``cuda:N``), or none (``cpu``), so that fairseq, which trains on
every GPU it sees and falls back to the CPU when it sees none, runs the
table's one-process recipe wherever it runs: on a node with 8 GPUs the batch
stays the config's, and several runs can share a node, one GPU each.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Mapping

import torch

from fairseq_rope.experiments.table import TableError

CHOICES = "auto, cpu, cuda or cuda:N"
_SPEC = re.compile(r"(auto|cpu|cuda)(?::(\d+))?")


@dataclass(frozen=True)
class Device:
    """``cpu``, or the ``index``-th GPU torch sees (``cuda``)."""

    kind: str
    index: int = 0

    @classmethod
    def resolve(cls, spec: str = "auto") -> "Device":
        """The device ``spec`` names (``auto``: the first GPU if torch sees one, else the CPU);
        TableError for a GPU torch does not see."""
        match = _SPEC.fullmatch(spec.strip().lower())
        if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
            raise TableError(f"--device {spec!r}: expected {CHOICES}")
        kind, index = match.group(1), int(match.group(2) or 0)
        if kind == "auto":
            return cls("cuda") if torch.cuda.is_available() else cls("cpu")
        if kind == "cpu":
            return cls("cpu")
        if not torch.cuda.is_available():
            raise TableError(
                f"--device {spec}: torch sees no CUDA device (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda or 'none'}; CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}). Leave --device out, or "
                "--device cpu, to run on the CPU")
        if index >= torch.cuda.device_count():
            raise TableError(f"--device {spec}: torch sees {torch.cuda.device_count()} GPU(s), "
                             f"numbered 0 to {torch.cuda.device_count() - 1}")
        return cls("cuda", index)

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def environment(self, environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
        """``environ`` with ``CUDA_VISIBLE_DEVICES`` showing this device only (no GPU for the CPU)."""
        if self.kind == "cpu":
            visible = ""
        else:
            # Index N counts the GPUs this process sees: the N-th of an existing CUDA_VISIBLE_DEVICES.
            already = environ.get("CUDA_VISIBLE_DEVICES")
            visible = already.split(",")[self.index].strip() if already else str(self.index)
        return {**environ, "CUDA_VISIBLE_DEVICES": visible}

    def name(self) -> str:
        """What a run record says it ran on: ``cpu`` or the GPU's name."""
        return "cpu" if self.kind == "cpu" else torch.cuda.get_device_name(self.index)


CPU = Device("cpu")
