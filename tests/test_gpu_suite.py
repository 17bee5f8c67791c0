"""scripts/gpu_suite.sh and the wheelhouse behind its install step: checked on CPU,
everything but CUDA itself (``--dry-run`` runs every step at tiny size)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from fairseq_rope.gpu import wheelhouse
from tests.conftest import REPO

SUITE = REPO / "scripts" / "gpu_suite.sh"


def suite(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "OUT"}
    return subprocess.run(["bash", str(SUITE), *args], cwd=REPO, capture_output=True, text=True,
                          env={**clean, "PYTHON": sys.executable, **env})


def test_bad_command_lines_are_refused_before_anything_runs(tmp_path):
    for args, message in (
        (["--step", "train"], "unknown step train (steps: install test benchmark profile kernels table)"),
        (["--step", "table"], "the table step needs --raw-dir DIR"),
        (["--frobnicate"], "unknown argument --frobnicate"),
        (["--dtypes", "fp16,fp8"], "unknown dtype fp8"),
        (["--limit", "train=10"], "--limit takes STEP=SECONDS, got train=10"),
        (["--limit", "test"], "--limit takes STEP=SECONDS, got test"),
    ):
        run = suite(*args, "--out", str(tmp_path / "out"), "--state", str(tmp_path / "state"))
        assert run.returncode == 2 and message in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


def test_out_defaults_to_the_device_tools_out(tmp_path):
    state = tmp_path / "state"
    (state / "done").mkdir(parents=True)
    (state / "done" / "benchmark").touch()
    run = suite("--step", "benchmark", "--state", str(state), OUT=str(tmp_path / "device-out"))
    assert run.returncode == 0, run.stderr
    assert "benchmark: finished by an earlier run" in (tmp_path / "device-out" / "suite.log").read_text()


def test_finished_steps_are_skipped(tmp_path):
    """A rerun on the same machine skips what finished; with nothing left, the exit status is 0."""
    state, out = tmp_path / "state", tmp_path / "out"
    (state / "done").mkdir(parents=True)
    for step in ("install", "test", "benchmark"):
        (state / "done" / step).touch()
    run = suite("--out", str(out), "--state", str(state))  # the one command: these three steps
    assert run.returncode == 0, run.stderr
    log = (out / "suite.log").read_text()
    assert all(f"{step}: finished by an earlier run" in log for step in ("install", "test", "benchmark"))
    assert "all steps finished" in log


def stand_in_python(tmp_path, behaviour: str):
    """A Python stand-in that records the command lines the steps run (calls.txt) and then runs
    ``behaviour`` (bash, with the arguments in $*): CUDA is not needed to check the suite."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {calls}
{behaviour}
""")
    fake.chmod(0o755)
    return fake, calls


def test_a_step_that_fails_or_times_out_is_reported_and_the_next_steps_still_run(tmp_path):
    """The tests hang past their box, the benchmark fails: both are reported, the profile after
    them still runs, and the exit status and the log's last line name what did not finish."""
    fake, calls = stand_in_python(tmp_path, """case "$*" in
    *"-m pytest"*) sleep 60 ;;
    *benchmark.py*) exit 3 ;;
    *profile_step.py*) mkdir -p "$OUT_DIR/benchmarks" && touch "$OUT_DIR/benchmarks/profile-base-x-$RANDOM.md" ;;
esac""")
    out, state = tmp_path / "out", tmp_path / "state"
    install_box, test_box = 4, 2
    docs = set((REPO / "docs" / "benchmarks").iterdir())
    try:
        run = suite("--step", "install", "--step", "test", "--step", "benchmark", "--step", "profile",
                    "--dtypes", "fp32", "--limit", f"install={install_box}", "--limit", f"test={test_box}",
                    "--out", str(out), "--state", str(state), PYTHON=str(fake))
    finally:  # the profile step copies its report into docs/benchmarks: leave the checkout as it was
        for path in set((REPO / "docs" / "benchmarks").iterdir()) - docs:
            path.unlink()
    log = (out / "suite.log").read_text()
    assert run.returncode == 1, log
    # The test step's box is its own plus what install left of its own (whole seconds: a step
    # that crosses a second boundary took 1 s, however short it was).
    installed = re.search(r"install: done in (\d+) s", log)
    assert installed and int(installed[1]) < install_box, log
    limit = test_box + install_box - int(installed[1])
    assert re.search(rf"test: timed out after ({limit}|{limit + 1}) s \(limit {limit} s\); the next steps run all the "
                     "same", log), log
    assert re.search(r"benchmark: failed \(exit 3, after \d+ s\); the next steps run all the same", log), log
    assert "profile: done" in log and "scripts/profile_step.py" in calls.read_text()
    assert log.rstrip().endswith("unfinished: test benchmark (rerun to resume)")
    assert sorted(p.name for p in (state / "done").iterdir()) == ["install", "profile"]


# A node that sets CUDA_HOME, as a stand-in for its Python: fairseq is not installed yet, and
# fairseq-fixed's build fails there as it did on an H200 node (its setup.py adds CUDA extensions
# whose sources its sdist lacks) unless the build runs without CUDA_HOME.
NODE_WITH_CUDA_HOME = """case "$*" in
    *sacremoses*) exit 1 ;;
    "- "*) echo "$2/lib $2/lib" ;;
    *fairseq_fixed*)
        { echo "fairseq build: CUDA_HOME=${CUDA_HOME-unset}"
          if ninja --version >/dev/null 2>&1; then echo "ninja: works"; else echo "ninja: fails"; fi
          cat "${DIST_EXTRA_CONFIG:-/dev/null}"; } >> "$(dirname "$0")/builds.txt"
        if [[ -n ${CUDA_HOME+set} ]]; then echo "ninja: error: libnat_cuda/binding.cpp missing" >&2; exit 1; fi ;;
esac"""


def stand_in_wheelhouse(tmp_path):
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    (folder / "requirements.txt").write_text("sacremoses\n")
    for name in ("fairseq_fixed-0.12.3.1.tar.gz", "fairseq_rope_serve-0.1.0-py3-none-any.whl",
                 "fairseq_rope-0.1.0-py3-none-any.whl"):
        (folder / name).touch()
    return folder


def test_fairseq_is_built_without_cuda_home_its_extensions_side_by_side(tmp_path):
    """On a node that sets CUDA_HOME and has ninja: the build sees no CUDA_HOME, build_ext's
    parallel option, and a ninja that fails (torch's ninja backend cannot build extensions at once)."""
    fake, calls = stand_in_python(tmp_path, NODE_WITH_CUDA_HOME)
    tools = tmp_path / "node-bin"
    tools.mkdir()
    (tools / "ninja").write_text("#!/bin/sh\necho 1.11.1\n")
    (tools / "ninja").chmod(0o755)
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_wheelhouse.sh"), "--wheelhouse", str(stand_in_wheelhouse(tmp_path)),
         "--prefix", str(tmp_path / "prefix")],
        cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHON": str(fake), "CUDA_HOME": "/usr/local/cuda",
             "PATH": f"{tools}:{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr
    build = (tmp_path / "builds.txt").read_text().splitlines()
    assert build[:3] == ["fairseq build: CUDA_HOME=unset", "ninja: fails", "[build_ext]"], build
    assert re.fullmatch(r"parallel = [1-9]\d*", build[3]), build
    assert "fairseq_rope-0.1.0" in calls.read_text()  # the plugin is installed after it
    assert run.stdout.strip().splitlines()[-1].startswith("export PYTHONPATH=")


def test_a_failed_install_is_logged_and_skips_the_steps_that_need_it(tmp_path):
    """The install's own error comes back in OUT/install.log and the command's output; the test and
    benchmark steps, which could only fail to import fairseq, are skipped."""
    fake, calls = stand_in_python(tmp_path, NODE_WITH_CUDA_HOME.replace("-n ${CUDA_HOME+set}", "1 == 1"))
    out = tmp_path / "out"
    run = suite("--out", str(out), "--state", str(tmp_path / "state"), "--wheelhouse", str(stand_in_wheelhouse(tmp_path)),
                PYTHON=str(fake))
    log = (out / "suite.log").read_text()
    assert run.returncode == 1, log
    assert re.search(r"install: failed \(exit 1, after \d+ s\); the next steps are skipped", log), log
    assert "ninja: error: libnat_cuda/binding.cpp missing" in (out / "install.log").read_text()
    assert "ninja: error" in run.stderr
    for step in ("test", "benchmark"):
        assert f"{step}: skipped: the install did not finish" in log, log
    assert "-m pytest" not in calls.read_text() and "benchmark.py" not in calls.read_text()
    assert log.rstrip().endswith("unfinished: install test benchmark (rerun to resume)")


def test_a_step_gets_what_the_steps_before_it_left_of_their_boxes(tmp_path):
    fake, _ = stand_in_python(tmp_path, "")
    out = tmp_path / "out"
    run = suite("--step", "install", "--step", "test", "--limit", "install=50", "--limit", "test=7",
                "--out", str(out), "--state", str(tmp_path / "state"), PYTHON=str(fake))
    log = (out / "suite.log").read_text()
    assert run.returncode == 0, log
    limits = [int(x) for x in re.findall(r"test: started \(limit (\d+) s\)", log)]
    assert limits and 50 <= limits[0] <= 57, log  # its 7 s and most of the install's 50


def test_dtypes_choose_what_the_benchmark_and_profile_steps_measure(tmp_path):
    """On a GPU (no --dry-run) each listed dtype is profiled once and benchmarked, the benchmark
    within its step's box (--max-seconds: the box less 30 s to write its report)."""
    fake, calls = stand_in_python(tmp_path, """while [[ $# -gt 0 ]]; do
    [[ $1 == --out-dir ]] && mkdir -p "$2" && touch "$2/profile-base-x-$RANDOM.md"; shift
done""")
    docs = set((REPO / "docs" / "benchmarks").iterdir())
    run = suite("--step", "profile", "--step", "benchmark", "--dtypes", "bf16", "--limit", "profile=100",
                "--out", str(tmp_path / "out"), "--state", str(tmp_path / "state"), PYTHON=str(fake))
    try:
        assert run.returncode == 0, run.stderr
        profile, benchmark = calls.read_text().splitlines()
        assert profile.split(" --out-dir")[0] == "scripts/profile_step.py --size base --device cuda --dtype bf16"
        assert benchmark.startswith("scripts/benchmark.py --size base --device cuda --dtypes bf16 "
                                    "--rows sinusoidal,learned,rope,rope_pytorch ")
        seconds = int(re.search(r"--max-seconds (\d+)", benchmark).group(1))
        assert 240 - 30 <= seconds <= 240 + 100 - 30  # its box, and what the profile left of its own
    finally:  # the steps copy their reports into docs/benchmarks: leave the checkout as it was
        for path in set((REPO / "docs" / "benchmarks").iterdir()) - docs:
            path.unlink()


def test_steps_run_the_checkouts_code_not_a_stale_wheelhouse_copy(tmp_path):
    """The install step puts the wheelhouse's fairseq_rope on PYTHONPATH (state/env.sh);
    a wheelhouse made before the last edit must not be what the benchmark measures."""
    stale = tmp_path / "prefix" / "fairseq_rope"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text('raise ImportError("the wheelhouse copy of fairseq_rope ran")\n')
    state = tmp_path / "state"
    (state / "dry-run" / "done").mkdir(parents=True)  # --dry-run keeps its state apart
    (state / "dry-run" / "env.sh").write_text(f'export PYTHONPATH="{stale.parent}"\n')
    run = suite("--dry-run", "--step", "benchmark", "--out", str(tmp_path / "out"), "--state", str(state))
    log = (tmp_path / "out" / "suite.log").read_text()
    assert run.returncode == 0 and "benchmark: done" in log, run.stderr[-2000:]
    (report,) = (tmp_path / "out" / "benchmarks").glob("*.md")
    # RoPE both ways, the fused rotation switched off for the second row's calls.
    assert "| rope_pytorch | `transformer_rope_tiny` with `FAIRSEQ_ROPE_TRITON=0` |" in report.read_text()


def test_the_wheelhouse_ships_fairseq_and_its_nmt_stack_but_not_the_nodes_torch():
    shipped = wheelhouse.closure()
    assert {"fairseq-rope", "fairseq-fixed", "hydra-core", "omegaconf", "antlr4-python3-runtime",
            "sacremoses", "subword-nmt", "sacrebleu", "sentencepiece", "bitarray", "cython",
            "pytest"} <= set(shipped)
    # The node's PyTorch stack, and what only it needs.
    assert not {"torch", "torchaudio", "numpy", "scikit-learn", "scipy", "sympy", "networkx",
                "triton", "ctranslate2"} & set(shipped)
    assert all(version for version in shipped.values())


@pytest.mark.slow
def test_dry_run_runs_the_one_command_at_tiny_size_and_a_rerun_skips_it(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    run = suite("--dry-run", "--out", str(out), "--state", str(state))
    assert run.returncode == 0, (out / "suite.log").read_text() if (out / "suite.log").exists() else run.stderr
    tests = ElementTree.parse(out / "test.xml").getroot().find("testsuite")
    assert int(tests.get("tests")) > 0 and tests.get("failures") == tests.get("errors") == "0"
    assert list((out / "benchmarks").glob("*.md"))
    again = suite("--dry-run", "--out", str(out), "--state", str(state))
    assert again.returncode == 0
    assert (out / "suite.log").read_text().count("finished by an earlier run") == 3


def test_the_kernels_step_runs_both_diagnostics_into_out(tmp_path):
    """On a GPU (no --dry-run): the launch-cost script writes its report, the sweep's output is kept."""
    fake, calls = stand_in_python(tmp_path, """case "$*" in
    *triton_launch_cost.py*) touch "${@: -1}" ;;
    *triton_kernel_sweep.py*) echo "| rotary interleaved | 6.0 |" ;;
esac""")
    out = tmp_path / "out"
    run = suite("--step", "kernels", "--out", str(out), "--state", str(tmp_path / "s"), PYTHON=str(fake))
    assert run.returncode == 0, (out / "suite.log").read_text()
    assert calls.read_text().splitlines()[-2:] == [
        f"scripts/triton_launch_cost.py --out {out}/benchmarks/triton-launch.md", "scripts/triton_kernel_sweep.py"]
    assert (out / "benchmarks" / "triton-launch.md").is_file()
    assert (out / "benchmarks" / "triton-sweep.md").read_text() == "| rotary interleaved | 6.0 |\n"


@pytest.mark.slow
def test_dry_run_of_the_profile_and_table_steps(tmp_path):
    out = tmp_path / "out"
    run = suite("--dry-run", "--step", "profile", "--step", "table", "--out", str(out), "--state", str(tmp_path / "s"))
    assert run.returncode == 0, (out / "suite.log").read_text() if (out / "suite.log").exists() else run.stderr
    assert "## Training step" in (out / "benchmarks" / "profile-dry-run.md").read_text()
    assert (out / "results" / "demo.md").is_file()
    runs = {json.loads(p.read_text())["row"] for p in (out / "results" / "runs" / "demo").glob("*/seed1/run.json")}
    assert runs == {"sinusoidal", "rope", "rpe", "learned"}


@pytest.mark.slow
def test_the_wheelhouse_installs_into_a_prefix_beside_the_nodes_torch(tmp_path):
    """Downloads (the package registry): a fresh "node" environment with only its PyTorch stack
    (torch, numpy, scikit-learn), a wheelhouse for this Python, then the install step into a
    prefix; the node's torch stays where it was, fairseq is compiled against it."""
    node = tmp_path / "node"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(node)], check=True)
    python = str(node / "bin" / "python")
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}"], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "numpy", "scikit-learn", "setuptools", "wheel"], check=True)
    # This Python's whole version: as "3.11", pip would take 3.11.0 and refuse the wheels of this
    # environment that need a later patch release (soupsieve 4.1 needs 3.11.5).
    files = wheelhouse.make(tmp_path / "wheelhouse", platform.python_version())
    assert wheelhouse.size_mib(files) <= wheelhouse.LIMIT_MIB
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_wheelhouse.sh"), "--wheelhouse", str(tmp_path / "wheelhouse"),
         "--prefix", str(tmp_path / "prefix")],
        cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHON": python, "CUDA_HOME": "/usr/local/cuda"})  # as CUDA nodes set it
    assert run.returncode == 0, run.stderr[-3000:]
    exports = run.stdout.strip().splitlines()[-1]
    assert exports.startswith("export PYTHONPATH=")
    check = subprocess.run(
        ["bash", "-c", exports + "; cd / && " + python + " -c 'import fairseq_rope, fairseq, torch; "
         "print(fairseq_rope.__file__, torch.__file__)' && fairseq-train --help >/dev/null"],
        capture_output=True, text=True)
    assert check.returncode == 0, check.stderr[-3000:]
    plugin, torch_file = check.stdout.split()
    assert plugin.startswith(str(tmp_path / "prefix")) and torch_file.startswith(str(node))
