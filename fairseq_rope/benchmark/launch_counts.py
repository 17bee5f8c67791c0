"""Kernel launches of RoPE against the stock Transformer, per training step and per beam search
(``scripts/count_launches.py``; counted by :mod:`fairseq_rope.benchmark.launches`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_rope import rotary
from fairseq_rope.benchmark import machine, models
from fairseq_rope.benchmark.launches import kernel_launches
from fairseq_rope.evaluation.report import markdown_table

#: The rows counted: (label, benchmark row, FAIRSEQ_ROPE_TRITON setting).
ROWS = (("sinusoidal (stock)", "sinusoidal", "0"), ("rope, PyTorch path", "rope", "0"),
        ("rope, fused kernel", "rope", "auto"))


def count_model(size: str, device: torch.device, dtype: str, length: int = 16, sentences: int = 4,
                seed: int = 1, rows: Sequence[Tuple[str, str, str]] = ROWS) -> Dict[str, Dict[str, float]]:
    """Per row of :data:`ROWS`: launches of one ``Trainer.train_step`` (forward, backward, Adam) and
    of one beam search (beam 4, output forced to ``length`` tokens), and the model's self-attention
    layers. On the CPU the fused row runs under Triton's interpreter (if Triton is installed)."""
    results: Dict[str, Dict[str, float]] = {}
    for label, row, setting in rows:
        if setting == "auto" and device.type == "cpu":
            setting = "interpret"
            os.environ.setdefault("TRITON_INTERPRET", "1")
        with rotary.fused_rotation(setting):
            if setting != "0" and rotary.fused_kernels(torch.empty(0, device=device)) is None:
                continue  # no Triton here: no fused row
            trainer, task = models.diagnostic_trainer(size, row, seed, "launches-", device, dtype)
            batch = models.synthetic_batch(task, length, sentences, seed)
            generator = models.forced_length_generator(task, trainer.model, length)
            sample = models.decode_sample(batch, device)

            decode = models.beam_search_call(trainer, task, generator, sample)
            with models.quiet():
                train_step = lambda: trainer.train_step([batch])  # noqa: E731
                train_step(), decode()  # caches and tables built outside the count
                train = kernel_launches(train_step, device)[0]
                beam = kernel_launches(decode, device)[0]
            model = trainer.model
            results[label] = {"train_step": train, "beam_search": beam, "steps": length + 1,
                              "self_attention_layers": len(model.encoder.layers) + len(model.decoder.layers),
                              "decoder_layers": len(model.decoder.layers)}
    return results


def report(results: Dict[str, Dict[str, float]], size: str, device: str, dtype: str, length: int,
           sentences: int) -> List[str]:
    """The markdown of :func:`count_model`'s counts, each row against stock."""
    stock = results[ROWS[0][0]]
    lines = []
    for label, counts in results.items():
        extra_train = counts["train_step"] - stock["train_step"]
        extra_beam = counts["beam_search"] - stock["beam_search"]
        per_step_layer = extra_beam / (counts["steps"] * counts["decoder_layers"])
        lines.append([label, f"{counts['train_step']:.0f}", f"{extra_train:+.0f}",
                      f"{extra_train / counts['self_attention_layers']:+.2f}", f"{counts['beam_search']:.0f}",
                      f"{extra_beam:+.0f}", f"{per_step_layer:+.2f}"])
    layers = stock["self_attention_layers"]
    return [
        f"Kernel launches, {size} size ({layers:.0f} self-attention layers), {device}, {dtype}: "
        f"one training step (fairseq's `Trainer.train_step`: forward, backward, Adam) on "
        f"{sentences} sentences × {length} tokens, and one beam search (beam 4, {sentences} "
        f"sentences, output forced to {length} tokens: {length + 1} decoder steps). "
        "Counted by fairseq_rope/benchmark/launches.py (its docstring says how).",
        "",
        *markdown_table(
            ["row", "training step", "− stock", "per self-attention layer", "beam search", "− stock",
             "per decoder layer and step"], lines),
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="scripts/count_launches.py", description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--skip-fused", action="store_true",
                        help="no fused row (on the CPU Triton's interpreter takes minutes at base size)")
    parser.add_argument("--out", type=Path, help="markdown report (default: print it)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = ROWS[:2] if args.skip_fused else ROWS
    results = count_model(args.size, device, args.dtype, args.length, args.sentences, rows=rows)
    where = machine.describe(device).get("gpu", "CPU") if device.type == "cuda" else "CPU"
    text = "\n".join(report(results, args.size, where, args.dtype, args.length, args.sentences)) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0
