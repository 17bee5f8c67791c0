"""Fixtures of the deploy tests: a toy corpus of real-looking text (capitals, punctuation) put
through the project's own data preparation (Moses, subword-nmt BPE, fairseq-preprocess), and
tiny models of every exportable row briefly trained on it in-process (so that beams are
decisive and end with EOS), saved by fairseq's Trainer as fairseq-train saves them."""

from __future__ import annotations

import io
import random
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

from tests.conftest import TOY_LEXICON, built_once, parse_train_args

PUNCTUATION = (".", "!", "?")

#: row → (architecture, options): every kind of model the exporter handles. ``rope-variant``
#: holds every non-default RoPE option at once: half layout, partial rope-dim, theta, pre-norm;
#: ``rope-linear`` and ``rope-ntk`` the RoPE scalings CTranslate2 can compute.
ROWS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "rope": ("transformer_rope_tiny", ()),
    "rope-variant": ("transformer_rope_tiny", ("--rope-layout", "half", "--rope-dim", "16", "--rope-theta", "500",
                                               "--encoder-normalize-before", "--decoder-normalize-before")),
    "rope-linear": ("transformer_rope_tiny", ("--rope-scaling", "linear", "--rope-scaling-factor", "2.5")),
    "rope-ntk": ("transformer_rope_tiny", ("--rope-scaling", "ntk", "--rope-scaling-factor", "3", "--rope-dim", "16")),
    "sinusoidal": ("transformer_tiny", ()),
    "learned": ("transformer_tiny", ("--encoder-learned-pos", "--decoder-learned-pos")),
    "rpe-shared": ("transformer_rpe_tiny", ("--rpe-shared-heads",)),
}
#: Updates of the brief training: beams end with EOS and their scores are far apart.
UPDATES = 150


def sentence(words: List[str], end: str) -> str:
    return " ".join([words[0].capitalize(), *words[1:]]) + end


def deploy_pairs(n: int, seed: int) -> List[Tuple[str, str]]:
    """The toy task (words translated, order reversed), written as text: a capital, an end mark."""
    rng = random.Random(seed)
    words = sorted(TOY_LEXICON)
    pairs = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(2, 7))]
        end = rng.choice(PUNCTUATION)
        pairs.append((sentence(src, end), sentence([TOY_LEXICON[w] for w in reversed(src)], end)))
    return pairs


@pytest.fixture(scope="session")
def deploy_data(tmp_path_factory) -> Path:
    """DATA with raw/, tok/, bpe/codes and data-bin/, by ``fairseq-rope-prepare parallel``."""
    from fairseq_rope.data.prepare import cli

    def prepare(root: Path) -> None:
        root.mkdir()
        for seed, (split, n) in enumerate((("train", 1200), ("valid", 30), ("test", 48))):
            pairs = deploy_pairs(n, seed + 10)
            for side, lang in enumerate(("en", "de")):
                (root / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            rc = cli.main(["parallel", "--src", "en", "--tgt", "de", "--trainpref", str(root / "train"),
                           "--validpref", str(root / "valid"), "--testpref", str(root / "test"),
                           "--vocab-size", "150", "--workers", "1", "--no-clean", str(root / "data")])
        assert rc == 0

    data = built_once(tmp_path_factory, "deploy", prepare) / "data"
    assert any("@@" in line for line in (data / "bpe" / "test.de").read_text().splitlines())  # real splits
    return data


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: a tiny model gains nothing from more, and on a busy machine
    several threads wait for each other (minutes instead of seconds, measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(data_bin: Path, save_dir: Path, arch: str, *options: str, updates: int = UPDATES,
          max_tokens: int = 500) -> Path:
    """``arch`` trained for ``updates`` updates in-process; checkpoint_last.pt as fairseq-train saves it."""
    import numpy as np
    from fairseq import tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = parse_train_args(
        data_bin, arch, *options, "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
        "--lr", "5e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "30", "--warmup-init-lr", "1e-7",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.0",
        "--max-tokens", str(max_tokens), "--seed", "1", "--save-dir", str(save_dir))
    cfg = convert_namespace_to_omegaconf(args)
    # Seeded as fairseq-train seeds before building the model: the weights must not depend on what
    # the tests run before in this process drew from torch's global generator.
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    epoch, done = 1, 0
    with one_thread():
        while done < updates:
            for sample in trainer.get_train_iterator(epoch=epoch).next_epoch_itr(shuffle=True):
                trainer.train_step([sample])
                done += 1
                if done == updates:
                    break
            epoch += 1
    save_dir.mkdir(parents=True, exist_ok=True)
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(str(save_dir / "checkpoint_last.pt"), {})
    return save_dir / "checkpoint_last.pt"


#: Rows trained for the default suite (their beams are tested there); the others' beams are
#: slow tests. Exactness of encoder output and forced decoding needs no training: those tests
#: take the other rows untrained (random weights), as fairseq-train would start them.
TRAINED_BY_DEFAULT = ("rope", "rope-variant")


@pytest.fixture(scope="session")
def checkpoint(deploy_data, tmp_path_factory) -> Callable[..., Path]:
    """``checkpoint(row, trained=True)``: the checkpoint of ``row`` (:data:`ROWS`), trained for
    :data:`UPDATES` updates or not at all, made once per test run."""
    def get(row: str, trained: bool = True) -> Path:
        arch, options = ROWS[row]
        return built_once(tmp_path_factory, f"deploy-checkpoints/{row}-{trained}",
                          lambda save_dir: train(deploy_data / "data-bin", save_dir, arch, *options,
                                                 updates=UPDATES if trained else 0)) / "checkpoint_last.pt"

    return get


@pytest.fixture(scope="session")
def trained(checkpoint) -> Callable[[str], Path]:
    """``trained(row)``: the trained checkpoint of ``row``."""
    return checkpoint


@pytest.fixture(scope="session")
def exported(checkpoint, deploy_data, tmp_path_factory) -> Callable[..., Path]:
    """``exported(row, quantization=None, trained=True)``: the model directory of ``row``,
    exported once per session."""
    from fairseq_rope.deploy.export import export_checkpoint

    cache: Dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("exported")

    def get(row: str, quantization=None, trained: bool = True) -> Path:
        key = (row, quantization, trained)
        if key not in cache:
            out = root / f"{row}-{quantization or 'float32'}-{trained}"
            export_checkpoint(checkpoint(row, trained), out, data_bin=deploy_data / "data-bin",
                              quantization=quantization)
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session")
def fairseq_model(checkpoint, deploy_data) -> Callable[..., tuple]:
    """``fairseq_model(row, trained=True)``: (model, task, model args) as fairseq-generate loads
    the checkpoint, test set loaded: the reference."""
    from fairseq import checkpoint_utils

    cache: Dict[Tuple[str, bool], tuple] = {}

    def get(row: str, trained: bool = True):
        if (row, trained) not in cache:
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
                [str(checkpoint(row, trained))], arg_overrides={"data": str(deploy_data / "data-bin")})
            task.load_dataset("test")
            cache[row, trained] = (models[0].eval(), task, cfg.model)
        return cache[row, trained]

    return get


#: The tables' decoding: beam 4, length penalty 0.6, 200 tokens at most.
TABLE = {"beam": 4, "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200}


@pytest.fixture(scope="session")
def fairseq_beams(fairseq_model) -> Callable[..., Dict[int, Tuple[List[str], float]]]:
    """``fairseq_beams(row, **settings)``: id → (subword tokens, score) of fairseq's own
    SequenceGenerator on the test set, batched as fairseq-generate batches (padded batches of
    mixed lengths: a small --max-tokens makes several)."""
    from argparse import Namespace

    cache: Dict[tuple, Dict[int, Tuple[List[str], float]]] = {}

    def get(row: str, **settings) -> Dict[int, Tuple[List[str], float]]:
        settings = {**TABLE, **settings}
        key = (row, tuple(sorted(settings.items())))
        if key not in cache:
            model, task, _ = fairseq_model(row)
            generator = task.build_generator([model], Namespace(**settings))
            batches = task.get_batch_iterator(task.dataset("test"), max_tokens=120, required_batch_size_multiple=1)
            beams = {}
            with one_thread():
                for sample in batches.next_epoch_itr(shuffle=False):
                    for sid, hypotheses in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                        best = hypotheses[0]
                        beams[sid] = (task.target_dictionary.string(best["tokens"][:-1]).split(), float(best["score"]))
            cache[key] = beams
        return cache[key]

    return get


def source_subwords(task) -> List[List[str]]:
    """The binarized test set's sources as subword strings (no EOS), by id."""
    dataset = task.dataset("test")
    return [task.source_dictionary.string(dataset.src[i][:-1]).split() for i in range(len(dataset))]


@pytest.fixture(scope="session")
def fairseq_translations(fairseq_model, fairseq_beams) -> Callable[..., List[str]]:
    """``fairseq_translations(row, **settings)``: what translating the raw test set must give,
    by id: fairseq's best hypotheses (:func:`fairseq_beams`), BPE removed by fairseq's
    dictionary (``--remove-bpe``) and detokenized by sacremoses' Moses detokenizer."""
    import torch
    from sacremoses import MosesDetokenizer

    def get(row: str, **settings) -> List[str]:
        _, task, _ = fairseq_model(row)
        dictionary, beams = task.target_dictionary, fairseq_beams(row, **settings)
        detokenizer = MosesDetokenizer(lang="de")
        return [detokenizer.detokenize(dictionary.string(torch.tensor([dictionary.index(t) for t in beams[i][0]]),
                                                         "@@ ").split())
                for i in range(len(beams))]

    return get
