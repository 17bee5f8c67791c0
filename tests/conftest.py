"""Shared fixtures: a toy parallel corpus, its binarized form, a trained tiny
RoPE checkpoint (all built by the tests themselves), and in-process model
construction through fairseq's own argument parser."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Sequence

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "fairseq_rope"
BIN_DIR = Path(sys.executable).parent


#: Whether this process is a pytest-xdist worker. Not from PYTEST_XDIST_WORKER, which a pytest
#: started by a test (the GPU suite's dry run) would inherit.
XDIST_WORKER = False


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), each worker and every process
    its tests start compute on one thread: with torch's default of one per core, the workers'
    threads wait for each other."""
    global XDIST_WORKER
    XDIST_WORKER = hasattr(config, "workerinput")
    if XDIST_WORKER:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


# A toy translation task: German-like output is the source words, translated
# word by word and in reverse order — learnable, and position-dependent.
TOY_LEXICON = {
    "house": "haus", "dog": "hund", "cat": "katze", "tree": "baum", "car": "auto",
    "book": "buch", "man": "mann", "woman": "frau", "child": "kind", "city": "stadt",
    "red": "rot", "big": "gross", "small": "klein", "old": "alt", "new": "neu",
}


def toy_pairs(n: int, seed: int) -> List[tuple]:
    rng = random.Random(seed)
    words = sorted(TOY_LEXICON)
    pairs = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(2, 7))]
        pairs.append((" ".join(src), " ".join(TOY_LEXICON[w] for w in reversed(src))))
    return pairs


def write_toy_corpus(directory: Path, sizes=(("train", 3000), ("valid", 40), ("test", 40))) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for seed, (split, n) in enumerate(sizes):
        pairs = toy_pairs(n, seed)
        (directory / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs))
        (directory / f"{split}.de").write_text("".join(t + "\n" for _, t in pairs))
    return directory


def console_script(name: str) -> str:
    """A console script of this environment: beside the interpreter, else on PATH (where
    scripts/install_wheelhouse.sh's ``pip install --prefix`` puts them on a GPU node)."""
    beside = BIN_DIR / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name}: neither in {BIN_DIR} nor on PATH"
    return found


def fairseq_cli(name: str, args: Sequence[str], cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    """Run a fairseq console script of this environment; fail loudly with its output."""
    result = subprocess.run(
        [console_script(name), *map(str, args)], cwd=cwd, capture_output=True, text=True, **kwargs
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``name``, built by ``build(path)`` once per test run and shared by the pytest-xdist
    workers: the first to ask builds it under a lock, the others wait for it. For what tests
    only read (corpora, trained checkpoints): training them once per worker doubled their cost."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if XDIST_WORKER:
        root = root.parent  # the run's directory, above every worker's own
    path, built = root / name, root / f"{name}.built"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not built.exists():
            shutil.rmtree(path, ignore_errors=True)  # what a failed build left
            build(path)
            built.touch()
    return path


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "toy/raw", write_toy_corpus)


@pytest.fixture(scope="session")
def toy_data_bin(toy_corpus: Path, tmp_path_factory) -> Path:
    def preprocess(dest: Path) -> None:
        fairseq_cli("fairseq-preprocess", [
            "--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--workers", "1",
            "--trainpref", toy_corpus / "train", "--validpref", toy_corpus / "valid",
            "--testpref", toy_corpus / "test", "--destdir", dest,
        ])

    return built_once(tmp_path_factory, "toy/data-bin", preprocess)


# The paper's optimizer and schedule, sized for the toy task.
TINY_TRAINING = [
    "--user-dir", "fairseq_rope", "--arch", "transformer_rope_tiny", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "3e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--warmup-init-lr", "1e-7",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--dropout", "0.0", "--max-tokens", "2000", "--cpu", "--seed", "1", "--no-progress-bar",
]


@pytest.fixture(scope="session")
def trained_rope_checkpoint(toy_data_bin: Path, tmp_path_factory) -> Path:
    """A transformer_rope_tiny trained for a few hundred updates with the paper's optimizer."""
    def train(save_dir: Path) -> None:
        fairseq_cli("fairseq-train", [
            toy_data_bin, *TINY_TRAINING, "--max-update", "240", "--save-dir", save_dir,
            "--no-epoch-checkpoints", "--validate-interval", "5", "--save-interval", "5",
            "--tensorboard-logdir", save_dir / "tensorboard",
        ])

    return built_once(tmp_path_factory, "toy/checkpoints", train) / "checkpoint_last.pt"


def parse_train_args(data_dir: Path, arch: str, *extra: str):
    from fairseq import options

    parser = options.get_training_parser()
    argv = [str(data_dir), "--user-dir", str(PLUGIN_DIR), "--arch", arch, "--cpu",
            "--source-lang", "en", "--target-lang", "de", *extra]
    return options.parse_args_and_arch(parser, input_args=argv)


def build_model(data_dir: Path, arch: str, *extra: str):
    """Build ``arch`` exactly as fairseq-train would, on ``data_dir``'s dictionaries."""
    from fairseq import tasks

    args = parse_train_args(data_dir, arch, *extra)
    task = tasks.setup_task(args)
    return task.build_model(args), task


def save_like_fairseq_train(data_dir: Path, path: Path, arch: str, *extra: str):
    """The model of ``fairseq-train --arch arch … *extra`` saved (untrained) by fairseq's
    Trainer, as a checkpoint of that run would be; returns the model."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = parse_train_args(data_dir, arch, "--optimizer", "adam", "--lr", "1e-3", *extra)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(str(path), {})
    return model.eval()


def load_checkpoint(path: Path, **overrides):
    """A checkpoint loaded as fairseq-generate loads it (``overrides``: its --model-overrides);
    the model and the config."""
    from fairseq import checkpoint_utils

    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=overrides or None)
    return models[0].eval(), cfg


@pytest.fixture(scope="session")
def dict_dir(tmp_path_factory) -> Path:
    """A data directory holding only joined dictionaries (enough to build models)."""
    directory = tmp_path_factory.mktemp("dicts")
    symbols = "".join(f"w{i} {1000 - i}\n" for i in range(60))
    for lang in ("en", "de"):
        (directory / f"dict.{lang}.txt").write_text(symbols)
    return directory


@pytest.fixture(autouse=True)
def _seeded():
    import torch

    torch.manual_seed(0)


def attend_step_by_step(attn, x):
    """Self-attention over ``x`` (T, B, C) one position at a time through the incremental
    state, as beam search calls it; the steps' outputs concatenated over time."""
    state: dict = {}
    with torch.no_grad():
        return torch.cat([attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)[0]
                          for t in range(x.shape[0])])
