"""The benchmark's ``rope_pytorch`` row: ``rope`` with the fused rotation switched off for its calls
only. Where the fused kernel runs (here: interpreted on CPU tensors, as if on a GPU), ``rope``'s
training steps and beam searches launch it and ``rope_pytorch``'s never do, in the same process."""

from __future__ import annotations

import pytest
import torch

from fairseq_rope import rotary
from fairseq_rope.benchmark import models

pytestmark = pytest.mark.triton

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Trainer and task of the tiny rope and rope_pytorch rows, and a batch of 2 × 5 tokens."""
    data_dir = models.write_dictionary(tmp_path_factory.mktemp("dict"), 50)
    rows = {row.name: row for row in models.rows_for("tiny") if row.name.startswith("rope")}
    assert rows["rope"].arch == rows["rope_pytorch"].arch and rows["rope_pytorch"].rotation == "0"
    trainers = {name: models.build_trainer(models.train_argv(data_dir, row, CPU, "fp32", 0.0, 64, 1), 1)
                for name, row in rows.items()}
    batch = models.synthetic_batch(trainers["rope"][1], 5, 2, seed=3)
    return rows, trainers, batch


@pytest.mark.parametrize("kind", ["train", "decode"])
def test_only_the_rope_row_launches_the_fused_kernel(kind, built, kernels, monkeypatch):
    rows, trainers, batch = built
    launches = {name: 0 for name in trainers}
    running = ""
    rotate = kernels.rotate

    def counted(*args, **kwargs):
        launches[running] += 1
        return rotate(*args, **kwargs)

    monkeypatch.setattr(kernels, "rotate", counted)
    with rotary.fused_rotation("interpret"):  # the process's setting: fused, as on a GPU
        for running, (trainer, task) in trainers.items():
            rotations = {running: rows[running].rotation}
            if kind == "train":
                models.bench_training({running: trainer}, batch, CPU, reps=1, warmup=0, rotations=rotations)
            else:
                models.bench_decoding({running: trainer}, {running: task}, batch, 3, CPU, reps=1, warmup=0,
                                      rotations=rotations)
    assert launches["rope"] > 0 and launches["rope_pytorch"] == 0, launches
