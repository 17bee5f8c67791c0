"""What the numbers were measured on: machine, threads, versions, date, commit."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

from fairseq_rope import base


#: Where the benchmark and diagnostic reports are written unless told otherwise.
REPORTS_DIR = base.project_dir() / "docs" / "benchmarks"


def device_slug(device: torch.device) -> str:
    """File-name form of the device: ``cpu``, or the GPU's name (``nvidia-h100-80gb-hbm3``)."""
    if device.type == "cuda":
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")
    return device.type


def describe(device: torch.device) -> Dict[str, Any]:
    import fairseq

    info: Dict[str, Any] = {
        "device": str(device),
        "cpu": base.cpu_model(),
        "cpu_cores_usable": base.usable_cores(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": base.git_commit(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                    gpu_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    return info


def provenance(script: str, argv: Optional[Sequence[str]]) -> str:
    """The sentence a CPU report opens with: the command, date, commit, CPU and threads."""
    described = describe(torch.device("cpu"))
    return (f"Written by `{base.command_line(script, argv)}` on {described['date']} "
            f"(commit {described['git_commit']}; {described['cpu']}, {torch.get_num_threads()} threads).")


def add_size_and_out(parser: argparse.ArgumentParser, name: str) -> None:
    """``--size tiny|base`` and ``--out`` (default ``docs/benchmarks/NAME-SIZE.md``) of a report script."""
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--out", type=Path, default=None, help=f"markdown file (default: docs/benchmarks/{name}-SIZE.md)")


def out_path(args: argparse.Namespace, name: str) -> Path:
    return args.out or REPORTS_DIR / f"{name}-{args.size}.md"


def publish(out: Path, lines: Sequence[str]) -> None:
    """Write a report's markdown lines to ``out`` and print them."""
    text = "\n".join(lines)
    base.write_text(out, text)
    print(text)


def publish_sized_report(
    args: argparse.Namespace, name: str, script: str, argv: Optional[Sequence[str]],
    title: str, description: str, body: Sequence[str],
) -> None:
    """The report of a script with ``--size``, ``--length`` and ``--out`` (:func:`add_size_and_out`):
    ``# TITLE: SIZE, T = LENGTH``, the provenance sentence followed by ``description``,
    then ``body``; written to :func:`out_path` and printed (:func:`publish`)."""
    lines = [
        f"# {title}: {args.size}, T = {args.length}",
        "",
        provenance(script, argv) + " " + description,
        "",
        *body,
        "",
    ]
    publish(out_path(args, name), lines)
