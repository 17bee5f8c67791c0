"""A child's peak RSS as the benchmark measures it: its own, not the forking parent's."""

from __future__ import annotations

import os
import subprocess
import sys

from fairseq_rope.benchmark.peak_rss import measured_command

MIB = 2 ** 20


def test_peak_rss_is_the_childs_own_whatever_the_parent_holds(tmp_path):
    script = tmp_path / "allocate.py"
    script.write_text("import sys\nblock = bytearray(int(sys.argv[1]) * 2 ** 20)\n"
                      "block[::4096] = b'x' * len(block[::4096])\nsys.exit(3)\n")
    held = bytearray(600 * MIB)  # the parent: a benchmark holding torch, fairseq, CTranslate2
    held[::4096] = b"x" * len(held[::4096])
    report = tmp_path / "report"
    process = subprocess.Popen(measured_command([str(script), "150"], report))
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3  # the script's own exit status
    assert 150 * MIB < int(report.read_text()) < 250 * MIB  # its 150 MiB and an interpreter
    assert usage.ru_maxrss * 1024 >= 600 * MIB  # why: the parent's high-water mark, carried over
    del held


def test_a_module_runs_as_python_minus_m_would(tmp_path):
    report = tmp_path / "report"
    argv = [sys.executable, "-m", "json.tool", "--compact"]
    assert measured_command(argv, report)[-3:] == ["-m", "json.tool", "--compact"]
    run = subprocess.run(measured_command(argv, report), input='{"a": [1, 2]}', capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (0, '{"a":[1,2]}\n')
    assert 5 * MIB < int(report.read_text()) < 200 * MIB


def test_the_wrappers_directory_shadows_nothing(tmp_path):
    """Beside peak_rss.py lies fairseq_rope/benchmark/profile.py: the child's ``import profile``
    must still find the standard library's."""
    run = subprocess.run(measured_command([sys.executable, "-m", "cProfile", "-m", "this"], tmp_path / "report"),
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "The Zen of Python" in run.stdout
