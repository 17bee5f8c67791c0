"""The GPU diagnostics' dry runs (every path once, on the CPU under Triton's interpreter): what a
GPU lease runs must not fail there for a reason the CPU could have shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("script", ["triton_launch_cost.py", "triton_kernel_sweep.py"])
def test_dry_run_measures_every_candidate(script):
    completed = subprocess.run([sys.executable, str(SCRIPTS / script), "--dry-run"], capture_output=True,
                               text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line for line in completed.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 10, completed.stdout
    assert not [row for row in rows if "failed" in row], completed.stdout


def test_host_only_times_the_fused_calls_with_the_launch_stubbed():
    completed = subprocess.run([sys.executable, str(SCRIPTS / "triton_launch_cost.py"), "--host-only",
                                "--calls", "20"], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("median") == 3, completed.stdout
