"""The package as users install it: a wheel (not editable) in a fresh virtual
environment, used from outside the repository. The environment reuses this
one's torch and fairseq (through a .pth file) instead of installing them again."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict, Set

import pytest
import sacrebleu

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: pytest's own TOML reader there
    import tomli as tomllib

from tests.conftest import REPO


def run(*command: object, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The fairseq-rope wheel, built as pip builds it."""
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
    (built,) = (tmp / "dist").glob("fairseq_rope-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_env(wheel, tmp_path_factory) -> Path:
    """bin/ of a virtual environment with fairseq-rope and its runtime installed from their wheels."""
    tmp = tmp_path_factory.mktemp("wheel-env")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    site = run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
               cwd=tmp).stdout.strip()
    Path(site, "reuse_torch_and_fairseq.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (runtime,) = wheel.parent.glob("fairseq_rope_serve-*.whl")
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


def console_scripts(pyproject: Path) -> Dict[str, str]:
    """A distribution's [project.scripts]: command → module:function."""
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("scripts", {})


def documented_commands() -> Set[str]:
    """Every fairseq-rope-* command the README and docs/ name (results pages aside): in full, or
    as `-name` after a full name on the same line (`fairseq-rope-bleu-by-length`, `-bleu-curve`)."""
    names = set()
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in page.read_text(encoding="utf-8").splitlines():
            full = re.findall(r"\bfairseq-rope-([a-z0-9]+(?:-[a-z0-9]+)*)", line)
            names.update(full)
            if full:
                names.update(re.findall(r"`-([a-z0-9]+(?:-[a-z0-9]+)*)`", line))
    return {f"fairseq-rope-{name}" for name in names}


def test_the_wheel_installs_every_console_script_of_pyproject(wheel, wheel_env, tmp_path):
    """The wheel's entry points are pyproject.toml's [project.scripts], each installed as a
    command whose function loads; the docs name the commands of this repository's
    distributions, no other."""
    declared = console_scripts(REPO / "pyproject.toml")
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parsed = configparser.ConfigParser(delimiters=("=",))
        parsed.optionxform = str  # command names as written
        parsed.read_string(archive.read(entry_points).decode("utf-8"))
    assert dict(parsed["console_scripts"]) == declared
    for command in declared:
        assert os.access(wheel_env / command, os.X_OK), command
    code = ("import json; from importlib.metadata import distribution; "
            "print(json.dumps({ep.name: callable(ep.load()) for ep in distribution('fairseq-rope').entry_points "
            "if ep.group == 'console_scripts'}))")
    loaded = json.loads(run(wheel_env / "python", "-c", code, cwd=tmp_path, env=clean_env()).stdout)
    assert loaded == {command: True for command in declared}

    distributions = [REPO / "pyproject.toml", *sorted(REPO.glob("*/pyproject.toml"))]
    assert documented_commands() == {c for pyproject in distributions for c in console_scripts(pyproject)}


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
