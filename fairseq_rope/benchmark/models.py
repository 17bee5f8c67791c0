"""Model level: training steps, beam search and peak memory of whole Transformers.

Every row is built exactly as ``fairseq-train`` builds it — fairseq's options
parser, task, model, criterion and ``Trainer`` — on a synthetic joined
dictionary, and trained on the same synthetic batches:

* training: ``Trainer.train_step`` (forward, backward, Adam step, fairseq's
  bookkeeping) with label-smoothed cross-entropy (0.1), Adam (0.9, 0.98),
  lr 5e-4; fp16/bf16 through fairseq's own ``--fp16``/``--bf16`` (half model,
  fp32 master weights in FP16Optimizer; dynamic loss scaling for fp16), exactly as
  ``fairseq-train --fp16`` trains — bf16 with fairseq's TPU flag cleared;
  tokens/s counts target tokens (fairseq's ``wps``);
* decoding: fairseq's ``SequenceGenerator`` via ``task.build_generator`` with
  beam 4 and lenpen 0.6. Weights are random, so every output length is forced
  (``min_len = max_len_b = L``, ``max_len_a = 0``): every row then decodes
  exactly L tokens + EOS for every sentence and does the same work.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_rope import rotary
from fairseq_rope.base import PLUGIN_DIR
from fairseq_rope.benchmark.launches import kernel_launches
from fairseq_rope.benchmark.memory import peak_during, tensor_bytes
from fairseq_rope.benchmark.timing import Stats, interleaved

DTYPE_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}


@dataclass(frozen=True)
class Row:
    """One model of the comparison: a fairseq architecture, extra flags, and the setting of
    ``FAIRSEQ_ROPE_TRITON`` its calls run under (None: the process's own)."""

    name: str
    arch: str
    flags: Tuple[str, ...] = ()
    rotation: Optional[str] = None


#: Joint vocabulary per size: the WMT14 recipe's 37k at base, 1k for the tiny archs.
VOCAB = {"base": 37000, "tiny": 1000}


def rows_for(size: str) -> Tuple[Row, ...]:
    """The rows of the table at ``size`` ("base" or "tiny"), stock first. ``rope_pytorch`` is
    ``rope`` rotating with PyTorch where ``rope`` would launch the fused kernel (on a GPU): the
    two side by side say which path is faster in a step (on a CPU both take the PyTorch path)."""
    learned = ("--encoder-learned-pos", "--decoder-learned-pos")
    if size not in ("base", "tiny"):
        raise ValueError(f"unknown size {size!r}; expected base or tiny")
    # fairseq's stock tiny arch is transformer_tiny; ours call its defaults
    stock, suffix = ("transformer_wmt_en_de", "wmt_en_de") if size == "base" else ("transformer_tiny", "tiny")
    return (Row("sinusoidal", stock),
            Row("learned", stock, learned),
            Row("rpe", f"transformer_rpe_{suffix}"),
            Row("rope", f"transformer_rope_{suffix}"),
            Row("rope_pytorch", f"transformer_rope_{suffix}", rotation="0"))


def under_rotation(call: Callable[[], Any], setting: Optional[str]) -> Callable[[], Any]:
    """``call`` run under ``FAIRSEQ_ROPE_TRITON=setting`` (as it is when ``setting`` is None)."""
    if setting is None:
        return call

    def switched() -> Any:
        with rotary.fused_rotation(setting):
            return call()

    return switched


def write_dictionary(directory: Path, symbols: int) -> Path:
    """Joined en/de dictionaries of ``symbols`` words (fairseq adds its 4 specials)."""
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(f"w{i} {symbols - i}\n" for i in range(symbols))
    for lang in ("en", "de"):
        (directory / f"dict.{lang}.txt").write_text(text)
    return directory


def train_argv(data_dir: Path, row: Row, device: torch.device, dtype: str,
               dropout: float, max_tokens: int, seed: int) -> List[str]:
    """The fairseq-train command line of one row (the benchmark records it)."""
    return [
        str(data_dir), "--user-dir", str(PLUGIN_DIR), "--arch", row.arch, *row.flags,
        "--source-lang", "en", "--target-lang", "de", "--share-all-embeddings",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--dropout", str(dropout), "--max-tokens", str(max_tokens), "--seed", str(seed),
        *DTYPE_FLAGS[dtype], *(["--cpu"] if device.type == "cpu" else []),
    ]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """fairseq logs every model build at INFO (and hydra warns about its own API);
    the benchmark prints its own table."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def build_trainer(argv: Sequence[str], seed: int):
    """fairseq's task, model, criterion and Trainer, as fairseq_cli/train.py builds them."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    with quiet():
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=list(argv))
        # fairseq's parser ties --bf16 to TPUs (options.py sets args.tpu); its bf16 path in
        # Trainer and FP16Optimizer (bf16 model, fp32 master weights, no loss scaling) is
        # device-agnostic, so bf16 runs on the device at hand.
        args.tpu = False
        cfg = convert_namespace_to_omegaconf(args)
        torch.manual_seed(seed)  # identical initial weights wherever the rows share shapes
        task = tasks.setup_task(cfg.task)
        model = task.build_model(cfg.model)
        criterion = task.build_criterion(cfg.criterion)
        trainer = Trainer(cfg, task, model, criterion)
    return trainer, task


def synthetic_batch(task, length: int, sentences: int, seed: int) -> Dict[str, Any]:
    """``sentences`` random sentence pairs of ``length`` tokens (EOS included) each,
    collated by fairseq's LanguagePairDataset."""
    from fairseq.data import LanguagePairDataset

    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    gen = torch.Generator().manual_seed(seed)

    def sentence(dictionary) -> Tensor:
        words = torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=gen)
        return torch.cat((words, torch.tensor([dictionary.eos()])))

    pairs = [(sentence(src_dict), sentence(tgt_dict)) for _ in range(sentences)]
    sizes = [length] * sentences
    dataset = LanguagePairDataset(
        [s for s, _ in pairs], sizes, src_dict, [t for _, t in pairs], sizes, tgt_dict
    )
    return dataset.collater([dataset[i] for i in range(sentences)])


def persistent_bytes(trainer) -> int:
    """Parameters, buffers, optimizer state and fp32 master weights of one trainer."""
    tensors: List[Tensor] = list(trainer.model.parameters()) + list(trainer.model.buffers())
    tensors += list(trainer.criterion.parameters())
    optimizer = trainer.optimizer
    tensors += list(_tensors_in(optimizer.optimizer.state))
    tensors += list(_tensors_in(getattr(optimizer, "fp32_params", None)))
    return tensor_bytes(tensors)


def _tensors_in(obj: Any) -> Iterator[Tensor]:
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value)


def parameter_count(trainer) -> int:
    return sum(p.numel() for p in trainer.model.parameters())


def bench_training(
    trainers: Mapping[str, Any], batch: Dict[str, Any], device: torch.device,
    reps: int, warmup: int, min_sample_s: float = 0.0,
    rotations: Optional[Mapping[str, Optional[str]]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Interleaved train steps of every row on the same batch (each sample as many steps as last
    ``min_sample_s``, each row's under its ``rotations`` setting); tokens/s, peak memory and
    kernel launches per step."""
    steps = {name: under_rotation(lambda t=trainer: t.train_step([batch]), (rotations or {}).get(name))
             for name, trainer in trainers.items()}
    with quiet():
        stats: Dict[str, Stats] = interleaved(steps, reps, device, warmup=warmup, min_sample_s=min_sample_s)
        peaks = {name: peak_during(step, device) for name, step in steps.items()}
        launches = {name: kernel_launches(step, device)[0] for name, step in steps.items()}
    tokens = int(batch["ntokens"])
    out: Dict[str, Dict[str, Any]] = {}
    for name, trainer in trainers.items():
        persistent = persistent_bytes(trainer)
        out[name] = {
            **stats[name].as_dict(), "tokens_per_s": tokens / stats[name].median,
            "peak_bytes": persistent + peaks[name], "persistent_bytes": persistent,
            "step_peak_bytes": peaks[name], "launches_per_step": launches[name],
        }
    return out


def decode_sample(batch: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    from fairseq import utils

    sample = {"id": batch["id"], "nsentences": batch["nsentences"],
              "net_input": {k: v for k, v in batch["net_input"].items()
                            if k in ("src_tokens", "src_lengths")}}
    return utils.move_to_cuda(sample, device) if device.type == "cuda" else sample


def diagnostic_trainer(size: str, name: str, seed: int, prefix: str,
                       device: torch.device = torch.device("cpu"), dtype: str = "fp32"):
    """(trainer, task) of one row at ``size`` as the diagnostics build it (fp32 on CPU unless
    told otherwise), dropout 0.1, 2048 tokens per batch, on a fresh synthetic dictionary of
    the size's vocabulary."""
    row = {row.name: row for row in rows_for(size)}[name]
    data_dir = write_dictionary(Path(tempfile.mkdtemp(prefix=prefix)), VOCAB[size])
    return build_trainer(train_argv(data_dir, row, device, dtype, 0.1, 2048, seed), seed)


def forced_length_generator(task, model, length: int, beam: int = 4, lenpen: float = 0.6):
    """fairseq's beam search whose every output is exactly ``length`` tokens + EOS."""
    from fairseq.dataclass.configs import GenerationConfig

    return task.build_generator([model], GenerationConfig(beam=beam, lenpen=lenpen, min_len=length,
                                                          max_len_a=0, max_len_b=length))


def beam_search_call(trainer, task, generator, sample: Dict[str, Any]) -> Callable[[], List]:
    """One beam search of ``sample`` by the trainer's model in eval mode (train mode again after)."""
    def decode() -> List:
        trainer.model.eval()
        try:
            return task.inference_step(generator, [trainer.model], sample)
        finally:
            trainer.model.train()

    return decode


def bench_decoding(
    trainers: Mapping[str, Any], tasks: Mapping[str, Any], batch: Dict[str, Any],
    length: int, device: torch.device, reps: int, warmup: int, beam: int = 4,
    lenpen: float = 0.6, min_sample_s: float = 0.0,
    rotations: Optional[Mapping[str, Optional[str]]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Interleaved beam search of every row on the same sources, output length forced to ``length``
    (each row's under its ``rotations`` setting); sentences/s, peak memory and kernel launches per
    beam search."""
    sample = decode_sample(batch, device)
    calls = {}
    for name, trainer in trainers.items():
        model = trainer.model
        generator = forced_length_generator(tasks[name], model, length, beam, lenpen)

        def decode(task=tasks[name], generator=generator, model=model) -> List:
            model.eval()
            return task.inference_step(generator, [model], sample)

        calls[name] = under_rotation(decode, (rotations or {}).get(name))
    with quiet():
        lengths = {name: sorted({len(h[0]["tokens"]) for h in call()}) for name, call in calls.items()}
        stats = interleaved(calls, reps, device, warmup=warmup, min_sample_s=min_sample_s)
        peaks = {name: peak_during(call, device) for name, call in calls.items()}
        launches = {name: kernel_launches(call, device)[0] for name, call in calls.items()}
    sentences = int(batch["nsentences"])
    out: Dict[str, Dict[str, Any]] = {}
    for name, trainer in trainers.items():
        weights = tensor_bytes(list(trainer.model.parameters()) + list(trainer.model.buffers()))
        out[name] = {
            **stats[name].as_dict(), "sentences_per_s": sentences / stats[name].median,
            "output_lengths": lengths[name], "peak_bytes": weights + peaks[name],
            "weight_bytes": weights, "call_peak_bytes": peaks[name], "launches": launches[name],
        }
    return out
