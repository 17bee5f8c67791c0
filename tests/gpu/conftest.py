"""The GPU exactness suite (``pytest -m gpu``): the device it runs on and the dtypes.

Every test here runs on the device that ``FAIRSEQ_ROPE_GPU_TESTS_DEVICE`` names
(default ``cuda``), in fp32, fp16 and bf16. With ``cpu`` the whole suite runs on
the CPU (``scripts/gpu_suite.sh --dry-run``), which exercises everything but
CUDA itself. A CUDA device that torch does not see fails the suite rather than
skipping it: a GPU run that silently tested nothing would read as a pass.

References are computed independently, in fp64 on the CPU.
"""

from __future__ import annotations

import os
from typing import List

import pytest
import torch

DEVICE_VARIABLE = "FAIRSEQ_ROPE_GPU_TESTS_DEVICE"
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]


def requested_device() -> str:
    """The device the suite is asked to run on, as written in the environment."""
    return os.environ.get(DEVICE_VARIABLE, "cuda").strip() or "cuda"


def training_precisions() -> List[str]:
    """fairseq-train's half-precision flags the requested device can train with.

    ``--fp16`` cannot train on the CPU in fairseq: its FP16Optimizer keeps the fp32
    master copy of the parameters on ``torch.cuda.current_device()`` ("Torch not
    compiled with CUDA enabled"), and its gradient-overflow handler makes a CUDA
    tensor (so ``--fp16-no-flatten-grads``, which avoids the first, would still crash
    at the first overflow). A dry run on the CPU therefore trains in bf16 only."""
    return ["bf16"] if requested_device() == "cpu" else ["fp16", "bf16"]


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device under test; fails (does not skip) when CUDA is asked for and absent."""
    spec = requested_device()
    try:
        device = torch.device(spec)
    except RuntimeError as error:
        pytest.fail(f"{DEVICE_VARIABLE}={spec!r} is not a torch device ({error}): use cuda, cuda:N or cpu")
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        pytest.fail(f"{DEVICE_VARIABLE}={spec!r}: the suite runs on cuda, cuda:N or cpu")
    if not torch.cuda.is_available():
        pytest.fail(
            f"{DEVICE_VARIABLE}={spec}: torch sees no CUDA device (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}). "
            f"Set {DEVICE_VARIABLE}=cpu to run the suite on the CPU."
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        pytest.fail(f"{DEVICE_VARIABLE}={spec}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)  # as tensors on it report it: cuda:N, never bare cuda
