"""The package as users install it: a wheel (not editable) in a fresh virtual
environment, used from outside the repository. The environment reuses this
one's torch and fairseq (through a .pth file) instead of installing them again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import sacrebleu

from tests.conftest import REPO


def run(*command: object, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> Path:
    """bin/ of a virtual environment with fairseq-rope installed from its wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy of what the wheel is made of, so the checkout gets no build/ or egg-info.
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "fairseq_rope", source / "fairseq_rope", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    # fairseq-rope depends on its runtime (runtime/, fairseq-rope-serve): both wheels, as a user installs them.
    shutil.copytree(REPO / "runtime", tmp / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    for project in (source, tmp / "runtime"):
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", tmp / "dist",
            project, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("fairseq_rope-*.whl")
    (runtime,) = (tmp / "dist").glob("fairseq_rope_serve-*.whl")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    site = run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
               cwd=tmp).stdout.strip()
    Path(site, "reuse_torch_and_fairseq.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index",
        wheel, runtime, cwd=tmp, env=clean_env())
    return venv / "bin"


def clean_env() -> dict:
    """No PYTHONPATH pointing into the checkout; one thread for the tiny runs."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}


def test_the_wheel_holds_the_package_and_its_configs_not_the_checkout(wheel_env, tmp_path):
    code = ("import fairseq_rope, fairseq_rope.experiments.config as c; "
            "print(fairseq_rope.__file__); print(len(c.available_configs()))")
    where, configs = run(wheel_env / "python", "-c", code, cwd=tmp_path, env=clean_env()).stdout.split()
    assert Path(where).is_relative_to(wheel_env.parent) and not Path(where).is_relative_to(REPO)
    assert int(configs) == len(list((REPO / "configs").glob("*.yaml"))) >= 12
    for script in ("prepare", "train", "evaluate", "average", "table", "demo", "benchmark"):
        assert (wheel_env / f"fairseq-rope-{script}").is_file(), script


def test_the_installed_plugin_trains_with_fairseq_train_and_evaluates(wheel_env, toy_data_bin, tmp_path):
    env = clean_env()
    plugin = run(wheel_env / "python", "-c", "import fairseq_rope; print(fairseq_rope.__path__[0])",
                 cwd=tmp_path, env=env).stdout.strip()
    # fairseq-train itself, with --user-dir at the installed package.
    run(wheel_env / "python", "-m", "fairseq_cli.train", toy_data_bin, "--user-dir", plugin,
        "--arch", "transformer_rope_tiny", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000",
        "--max-update", "2", "--save-dir", tmp_path / "direct", "--cpu", "--no-progress-bar", cwd=tmp_path, env=env)
    assert (tmp_path / "direct" / "checkpoint_last.pt").is_file()

    # The entry points, with a config shipped in the wheel: train, then evaluate.
    run(wheel_env / "fairseq-rope-train", "rope_demo", toy_data_bin, "run", "--max-update", "3",
        "--save-interval-updates", "1", "--max-tokens", "2000", cwd=tmp_path, env=env)
    run(wheel_env / "fairseq-rope-evaluate", "run", toy_data_bin, "--num-checkpoints", "2",
        cwd=tmp_path, env=env)
    eval_dir = tmp_path / "run" / "eval"
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["num_sentences"] == 40
    # The scores, recomputed with sacrebleu from the hypotheses the evaluation wrote and the toy
    # corpus's own test targets (which have no hyphens: compound splitting changes nothing). After
    # 3 updates BLEU itself may be 0; the details (n-gram precisions, lengths) still tell.
    references = (toy_data_bin.parent / "raw" / "test.de").read_text().splitlines()
    hypotheses = (eval_dir / "hyps.tok.de").read_text().splitlines()
    assert (eval_dir / "refs.tok.de").read_text().splitlines() == references
    assert len(hypotheses) == 40 and not any("-" in line for line in hypotheses + references)
    tokenized = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", smooth_method="none", force=True)
    assert (results["bleu_tokenized"], results["bleu_tokenized_details"]) == (tokenized.score, str(tokenized))
    detokenized = sacrebleu.corpus_bleu((eval_dir / "hyps.detok.de").read_text().splitlines(), [references])
    assert (results["sacrebleu"], results["sacrebleu_details"]) == (detokenized.score, str(detokenized))
    recorded = (tmp_path / "run" / "command.txt").read_text()
    assert f"--user-dir {plugin} " in recorded and "--arch transformer_rope_tiny" in recorded
