"""The table harness: row configs, run summaries, and `collect` on fake finished runs."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest
import torch

from fairseq_rope.data.prepare.pipeline import sha256_file
from fairseq_rope.experiments import cells, collect, reproduce, train_log, training
from fairseq_rope.experiments import summary as run_summary
from fairseq_rope.evaluation.averaging import average_checkpoints
from fairseq_rope.experiments.config import load_experiment
from fairseq_rope.experiments.device import CPU
from fairseq_rope.experiments.table import (
    ROWS,
    SCALES,
    UNDER_WAY,
    TableError,
    budget_summary_path,
    config_name,
    get_row,
    get_scale,
    rows_at,
    run_dir,
    summary_path,
    under_way,
)
from tests.conftest import build_model

SIZES = sorted({scale.size for scale in SCALES.values()})
POSITION_OPTIONS = {"arch", "encoder-learned-pos", "decoder-learned-pos"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def config(row: str, size: str):
    return load_experiment(f"{row}_{size}")


# --- Configs


@pytest.mark.parametrize("size", SIZES)
def test_rows_of_a_size_differ_only_in_the_position_encoding(size):
    shared = [{k: v for k, v in config(row, size).train.items() if k not in POSITION_OPTIONS}
              for row in ROWS]
    assert all(options == shared[0] for options in shared)
    assert config("learned", size).train["encoder-learned-pos"] is True
    assert config("learned", size).train["decoder-learned-pos"] is True


def test_every_scale_has_a_config_per_row():
    for scale in SCALES.values():
        for row in ROWS.values():
            assert load_experiment(config_name(row, scale)).name == f"{row.name}_{scale.size}"


@pytest.mark.parametrize("size, row, arch", [
    ("base", "sinusoidal", "transformer_wmt_en_de"), ("base", "learned", "transformer_wmt_en_de"),
    ("base", "rpe", "transformer_rpe_wmt_en_de"), ("base", "rope", "transformer_rope_wmt_en_de"),
    ("demo", "sinusoidal", "transformer_tiny"), ("demo", "learned", "transformer_tiny"),
    ("demo", "rpe", "transformer_rpe_tiny"), ("demo", "rope", "transformer_rope_tiny"),
    ("multi30k", "sinusoidal", "transformer_wmt_en_de"), ("multi30k", "learned", "transformer_wmt_en_de"),
    ("multi30k", "rpe", "transformer_rpe_wmt_en_de"), ("multi30k", "rope", "transformer_rope_wmt_en_de"),
    ("base", "alibi", "transformer_alibi_wmt_en_de"), ("demo", "alibi", "transformer_alibi_tiny"),
    ("multi30k", "alibi", "transformer_alibi_wmt_en_de"),
    ("multi30k-converged", "sinusoidal", "transformer_wmt_en_de"),
    ("multi30k-converged", "rope", "transformer_rope_wmt_en_de"),
])
def test_row_config_builds_through_fairseq(dict_dir, size, row, arch):
    argv = config(row, size).argv()
    assert argv[argv.index("--arch") + 1] == arch
    model, _ = build_model(dict_dir, arch, *argv)
    layer = model.encoder.layers[0]
    dims = (len(model.encoder.layers), len(model.decoder.layers), layer.embed_dim,
            layer.fc1.out_features, layer.self_attn.num_heads, layer.dropout_module.p)
    assert dims == {"base": (6, 6, 512, 2048, 8, 0.1), "demo": (2, 2, 64, 64, 2, 0.1),
                    "multi30k": (3, 3, 256, 1024, 4, 0.3), "multi30k-converged": (3, 3, 256, 1024, 4, 0.3)}[size]
    assert len(model.decoder.layers) == len(model.encoder.layers)
    assert model.decoder.layers[0].fc1.out_features == layer.fc1.out_features
    learned = row == "learned"
    assert (type(model.encoder.embed_positions).__name__ == "LearnedPositionalEmbedding") == learned


def test_multi30k_rows_differ_in_parameters_by_their_position_tables_only(dict_dir):
    built = {row: build_model(dict_dir, *_arch_and_argv(row, "multi30k"))[0] for row in ROWS}
    counts = {row: params(model) for row, model in built.items()}
    assert counts["rope"] == counts["sinusoidal"]  # neither has position parameters
    assert counts["learned"] - counts["sinusoidal"] == 2 * (256 + 2) * 256  # two tables of 258 x d
    # Shaw et al.'s experiments: key and value tables per layer and head, 33 distances x head dim 64.
    assert counts["rpe"] - counts["sinusoidal"] == 6 * 2 * 4 * 33 * 64
    assert counts["alibi"] == counts["sinusoidal"]  # fixed slopes, no parameters


def test_the_ablations_are_rope_on_one_side_with_stock_parameters(dict_dir):
    """rope_enc and rope_dec (issue 66): the rope config but for --rope-sides, RoPE's side without
    position embeddings, the other side fairseq's own sinusoidal ones, and stock's parameters."""
    rope = config("rope", "multi30k").train
    built = {"sinusoidal": build_model(dict_dir, *_arch_and_argv("sinusoidal", "multi30k"))[0]}
    for name, side in (("rope_enc", "encoder"), ("rope_dec", "decoder")):
        train = config(name, "multi30k").train
        assert {k: v for k, v in train.items() if k != "rope-sides"} == rope and train["rope-sides"] == side
        built[name] = model = build_model(dict_dir, *_arch_and_argv(name, "multi30k"))[0]
        rotating, stock = (model.encoder, model.decoder) if side == "encoder" else (model.decoder, model.encoder)
        assert rotating.embed_positions is None
        assert type(stock.embed_positions).__name__ == "SinusoidalPositionalEmbedding"
        assert params(model) == params(built["sinusoidal"])


def test_an_ablation_is_a_row_of_its_scales_only(tmp_path, capsys):
    assert list(rows_at(SCALES["multi30k"])) == [*ROWS, "rope_enc", "rope_dec"]
    for scale in SCALES.values():
        if scale.name != "multi30k":
            assert list(rows_at(scale)) == list(ROWS), scale.name
    assert get_row("rope_enc").takes_apart == ("rope",)
    assert reproduce.main(["rope_enc", "--scale", "multi30k-fr", "--work-dir", str(tmp_path)]) == 2
    assert ("unknown row 'rope_enc' at scale multi30k-fr; valid rows: sinusoidal, learned, rpe, rope, "
            "alibi") in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_demo_rows_have_the_same_dims_and_the_expected_position_parameters(dict_dir):
    built = {row: build_model(dict_dir, *_arch_and_argv(row, "demo"))[0]
             for row in ("sinusoidal", "learned", "rope")}
    # No position parameters: sinusoidal (fixed) and RoPE (a rotation) count the same.
    assert params(built["sinusoidal"]) == params(built["rope"])
    assert built["rope"].encoder.embed_positions is None
    # Learned: one table per side of max positions (256, from the shared recipe) + 2 (padding).
    for side in (built["learned"].encoder, built["learned"].decoder):
        assert side.embed_positions.weight.shape == (256 + 2, 64)
    assert params(built["learned"]) == params(built["sinusoidal"]) + 2 * 258 * 64


def _arch_and_argv(row: str, size: str):
    argv = config(row, size).argv()
    return (argv[argv.index("--arch") + 1], *argv)


# --- Names


def test_unknown_row_or_scale_is_a_clear_error(capsys):
    with pytest.raises(TableError, match="unknown row 'absolute'; valid rows: sinusoidal, learned, rpe, rope, alibi"):
        get_row("absolute")
    with pytest.raises(TableError, match="unknown scale 'wmt16'; valid scales: wmt14, multi30k, multi30k-length, multi30k-converged, multi30k-fr, multi30k-fr-converged, demo, demo-length"):
        get_scale("wmt16")
    assert reproduce.main(["absolute", "--scale", "demo"]) == 2
    assert "unknown row 'absolute' at scale demo; valid rows: sinusoidal, learned, rpe, rope, alibi" in capsys.readouterr().err
    assert reproduce.main(["rope", "--scale", "wmt16"]) == 2
    assert "valid scales: wmt14, multi30k, multi30k-length, multi30k-converged, multi30k-fr, multi30k-fr-converged, demo, demo-length" in capsys.readouterr().err


def test_unknown_row_or_scale_creates_nothing(tmp_path, capsys):
    assert reproduce.main(["absolute", "--work-dir", str(tmp_path)]) == 2
    assert ("error: unknown row 'absolute' at scale demo; valid rows: sinusoidal, learned, rpe, rope, alibi "
            "(or `collect` to make the table)") in capsys.readouterr().err
    assert reproduce.main(["rope", "--scale", "wmt16", "--work-dir", str(tmp_path)]) == 2
    assert "error: unknown scale 'wmt16'; valid scales: wmt14, multi30k, multi30k-length, multi30k-converged, multi30k-fr, multi30k-fr-converged, demo, demo-length" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_evaluation_is_forced_because_reproduce_decides_when_to_evaluate(tmp_path, monkeypatch):
    """evaluate.sh refuses existing results; reproduce reruns evaluate only after training changed them."""
    ran = []
    monkeypatch.setattr(reproduce, "run_step", lambda command, device=CPU: ran.append(command))
    reproduce.evaluate(tmp_path / "run", tmp_path / "bin")
    assert ran == [[*reproduce.entry_point("evaluation.evaluate"), tmp_path / "run", tmp_path / "bin",
                    "--eval-dir", "eval", "--force"]]


def test_extra_args_cannot_redirect_seed_or_save_dir(tmp_path):
    for extra in (["--seed", "3"], ["--save-dir=/tmp/x"]):
        with pytest.raises(TableError, match="cannot be an extra fairseq-train argument"):
            reproduce.reproduce_row(ROWS["rope"], SCALES["demo"], 1, tmp_path, extra)
    with pytest.raises(TableError, match="--raw-dir is for the wmt14 and multi30k scales"):
        reproduce.reproduce_row(ROWS["rope"], SCALES["demo"], 1, tmp_path, raw_dir="/archives")
    assert not list(tmp_path.iterdir())  # nothing prepared or trained


def test_reproduce_command_records_a_non_default_work_dir(tmp_path):
    rope, demo = ROWS["rope"], SCALES["demo"]
    assert reproduce.reproduce_command(rope, demo, 2) == "scripts/reproduce_table.sh rope --scale demo --seed 2"
    assert reproduce.reproduce_command(rope, demo, 2, ["--lr", "1e-3"], tmp_path) == (
        f"scripts/reproduce_table.sh rope --scale demo --seed 2 --work-dir {tmp_path} -- --lr 1e-3")


def test_reproduce_row_runs_the_steps_in_order(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(reproduce, "prepare_data", lambda scale, work, raw: calls.append("prepare") or work / "bin")
    monkeypatch.setattr(reproduce, "check_language_pair", lambda scale, data_bin: None)
    monkeypatch.setattr(reproduce, "train", lambda *a: calls.append(("train", a)) or 1.0)
    monkeypatch.setattr(reproduce, "evaluate", lambda *a, **k: calls.append("evaluate"))
    monkeypatch.setattr(reproduce, "summarize_run", lambda *a, **k: calls.append("summarize") or {})
    reproduce.reproduce_row(ROWS["learned"], SCALES["wmt14"], 7, tmp_path, ["--fp16"], device=CPU)
    config_path, data_bin, save_dir, seed, extra, device = calls[1][1]
    assert device == CPU
    assert calls[0] == "prepare" and calls[2:] == ["evaluate", "summarize"]
    assert (config_path.name, seed, list(extra)) == ("learned_base.yaml", 7, ["--fp16"])
    assert save_dir == tmp_path / "wmt14" / "learned" / "seed7"


RESUMED_LOG = """\
# 2026-01-01T00:00:00 host in /repo: fairseq-train data-bin --arch a --cpu --max-update 1791
2026-01-01 00:10:00 | INFO | train | epoch 001 | loss 9.1 | wps 20000 | num_updates 75
# 2026-01-02T00:00:00 host in /repo: fairseq-train data-bin --arch a --cpu
# provenance {"code_commit": "a" , "train_cpu": "Xeon", "train_device": "cpu", "train_threads": 2}
2026-01-02 00:10:00 | INFO | train | epoch 002 | loss 8.1 | wps 20000 | num_updates 150
# 2026-01-03T00:00:00 host in /repo: fairseq-train data-bin --arch a --cpu
# provenance {"code_commit": "b", "train_cpu": "Xeon", "train_device": "cpu", "train_threads": 2}
"""


def test_what_a_run_trained_with_is_read_from_its_log_per_invocation():
    """Threads, CPU, commit and device of every train.sh invocation of a run resumed across
    sessions: one value where they agree, all where they differ; the device alone (--cpu) for an
    invocation logged before provenance lines."""
    log = train_log.parse_train_log(RESUMED_LOG.splitlines())
    assert len(log.invocations) == 3 and log.invocations[0] == {"train_device": "cpu"}
    assert train_log.logged_provenance(log) == {
        "train_threads": 2, "train_cpu": "Xeon", "code_commit": "a + b", "train_device": "cpu",
        "train_invocations": 3, "train_invocations_recorded": 2}
    gpu = train_log.parse_train_log(["# 2026-01-01T00:00:00 host in /repo: fairseq-train data-bin --arch a"])
    assert train_log.logged_provenance(gpu)["train_device"] is None  # not --cpu: which GPU is unknown
    assert cells._trained_with(train_log.logged_provenance(log)) == (
        "on cpu, 2 threads, Xeon, `a` + `b` (recorded by 2 of its 3 invocations)")
    assert cells._trained_with({"train_device": "cpu"}) == "on cpu; threads, CPU and commit not recorded"


def test_train_sh_logs_what_each_invocation_trains_with(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for _ in range(2):
        training.record_run(tmp_path, ["data-bin", "--arch", "a", "--cpu"], "/repo")
    invocations = train_log.read_train_log(tmp_path).invocations
    assert len(invocations) == 2 and invocations[0] == invocations[1]
    assert invocations[0]["train_threads"] == 3 and invocations[0]["train_device"] == "cpu"
    assert invocations[0]["code_commit"] and invocations[0]["train_cpu"]  # a git checkout, a CPU


STEP_SECONDS = 42.5


def timed_steps(monkeypatch) -> list:
    """The commands reproduce runs, each taking STEP_SECONDS on a clock of the test's own."""
    ran, clock = [], [1000.0]

    def run_step(command, device=CPU):
        ran.append(command)
        clock[0] += STEP_SECONDS

    monkeypatch.setattr(reproduce, "run_step", run_step)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    return ran


def test_a_finished_run_is_not_trained_again(tmp_path, monkeypatch):
    """fairseq-train resuming a finished run would take one more update: skip it."""
    ran = timed_steps(monkeypatch)
    config = Path(load_experiment("rope_demo").path)
    (tmp_path / "train.log").write_text(TRAIN_LOG)  # 150 updates
    assert reproduce.train(config, tmp_path / "bin", tmp_path, 1, ["--max-update", "150"]) is None
    assert not ran
    assert reproduce.train(config, tmp_path / "bin", tmp_path, 1, ["--max-update", "200"]) == STEP_SECONDS
    assert len(ran) == 1 and ran[0][-4:] == ["--seed", "1", "--max-update", "200"]


def test_prepared_wmt14_data_is_not_prepared_again_without_raw_dir(tmp_path, monkeypatch):
    """Rerunning the preparation without --raw-dir would look for (and download) the archives."""
    ran = []
    monkeypatch.setattr(reproduce, "run_step", lambda command, device=CPU: ran.append(command))
    wmt14 = SCALES["wmt14"]
    assert reproduce.prepare_data(wmt14, tmp_path, "/archives") == tmp_path / "wmt14" / "data" / "data-bin"
    assert ran[0][3:] == ["wmt14", "--raw-dir", "/archives", tmp_path / "wmt14" / "data"]
    (tmp_path / "wmt14" / "data" / "data-bin").mkdir(parents=True)
    reproduce.prepare_data(wmt14, tmp_path)
    assert len(ran) == 1


# --- Run summaries


TRAIN_LOG = """\
# 2026-01-01T00:00:00 host in /repo: fairseq-train ...
2026-01-01 00:00:05 | INFO | train_inner | epoch 001:     50 / 75 loss=9.0, wps=25000, num_updates=50, wall=9
2026-01-01 00:00:06 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.5 | nll_loss 8.4 | wps 1000 | num_updates 60 | best_loss 8.5
2026-01-01 00:00:07 | INFO | train | epoch 001 | loss 9.1 | wps 20000 | ups 6 | num_updates 75 | lr 0.0002 | train_wall 10 | wall 12
2026-01-01 00:00:08 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.25 | num_updates 120 | best_loss 7.25
# 2026-01-01T01:00:00 host in /repo: resumed
2026-01-01 01:00:08 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.0 | num_updates 120 | best_loss 7.0
2026-01-01 01:00:09 | INFO | train | epoch 002 | loss 7.5 | wps 30000 | ups 7 | num_updates 150 | train_wall 20 | wall 25
2026-01-01 01:00:09 | INFO | fairseq_cli.train | done training in 24.1 seconds
"""


def test_parse_train_log():
    log = train_log.parse_train_log(TRAIN_LOG.splitlines())
    assert log.epoch_wps == {75: 20000.0, 150: 30000.0}  # epoch summaries only, not train_inner
    assert log.training_seconds == [24.1] and log.num_updates == 150  # the interrupted first run: none
    assert log.valid_loss == {60: 8.5, 120: 7.0}  # the resumed run's value wins


def test_tokens_per_second_leave_out_an_epoch_cut_short_by_the_end_of_training():
    # Epochs of 72 updates, the last cut to 3 by --max-update: its summary is timed mostly on
    # the validation and checkpoint every epoch pays once (the demo's: 13,725 wps, against ~28k).
    lines = [f"2026-01-01 00:00:0{k} | INFO | train | epoch 00{k} | loss 2.0 | wps {wps} | "
             f"num_updates {end} | train_wall 9 | wall 10"
             for k, (end, wps) in enumerate([(72, 28000), (144, 29000), (216, 27000), (219, 13725)], 1)]
    log = train_log.parse_train_log(lines)
    assert log.full_epoch_wps() == [28000.0, 29000.0, 27000.0]
    assert log.full_epoch_wps(upto=144) == [28000.0, 29000.0]
    speed = run_summary._speed(log)
    assert speed["train_tokens_per_second"] == 28000.0
    assert speed["train_tokens_per_second_range"] == [27000.0, 29000.0]
    # An epoch of half the longest's updates still counts.
    log.epoch_wps[255] = 14000.0
    assert log.full_epoch_wps()[-1] == 14000.0


@pytest.fixture(scope="module")
def tiny_state(dict_dir):
    """A transformer_tiny state dict with shared embeddings, and its parameter count."""
    model, _ = build_model(dict_dir, *_arch_and_argv("sinusoidal", "demo"))
    return model.state_dict(), params(model)


def test_parameter_count_counts_tied_embeddings_once_also_after_averaging(tiny_state, tmp_path):
    state, expected = tiny_state
    assert run_summary.count_parameters(state) == expected
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"c{i}.pt")
        torch.save({"model": state}, paths[-1])
    averaged = tmp_path / "avg.pt"
    torch.save(average_checkpoints(paths), averaged)
    model = torch.load(averaged, weights_only=True)["model"]
    assert run_summary.count_parameters(model) == expected
    assert model["decoder.output_projection.weight"] is model["encoder.embed_tokens.weight"]


def write_run(work: Path, scale: str, row: str, seed: int, bleu: float, sacre: Optional[float] = None,
              params: int = 1000, wps: float = 5000.0, wall: float = 300.0,
              length: Optional[Dict[str, float]] = None, extra=(),
              ratios: Optional[Dict[str, float]] = None) -> Path:
    """A fake finished run: command.txt, train.log, eval/results.json and eval/run.json."""
    scale_, row_ = SCALES[scale], get_row(row, SCALES[scale])
    save = run_dir(work, scale_, row_, seed)
    (save / "eval").mkdir(parents=True)
    train = f"fairseq-train /repo/DATA --arch arch_{row} --seed {seed} {' '.join(extra)}".strip()
    (save / "command.txt").write_text(f"cd /repo\n{train}\n")
    (save / "train.log").write_text(TRAIN_LOG)
    (save / "eval" / "results.json").write_text(json.dumps({"bleu_tokenized": bleu, "sacrebleu": sacre}))
    summary: Dict[str, Any] = {
        "row": row, "scale": scale, "seed": seed, "config": config_name(row_, scale_), "arch": f"arch_{row}",
        "extra_train_args": list(extra), "parameters": params, "train_tokens_per_second": wps,
        "train_wall_seconds": wall, "num_updates": 1515, "bleu_tokenized": bleu, "sacrebleu": sacre,
        "valid_loss": [[101 * k, 8.0 - k * (0.3 + seed / 10)] for k in range(1, 16)],
        "reproduce_command": reproduce.reproduce_command(row_, scale_, seed, extra),
    }
    if length is not None:
        summary["bleu_by_length"] = {
            "buckets": [{"bucket": label, "low": 7 * i, "high": 7 * (i + 1), "sentences": 150, "bleu": b,
                         **({} if ratios is None else {"length_ratio": ratios[label]})}
                        for i, (label, b) in enumerate(length.items())],
            "longest_training_pair_tokens": {"source": 21, "target": 23},
        }
    (save / "eval" / "run.json").write_text(json.dumps(summary))
    return save


def test_summarize_run_writes_run_json(tiny_state, tmp_path):
    state, expected = tiny_state
    save = write_run(tmp_path, "demo", "sinusoidal", 3, bleu=12.5, sacre=11.0, extra=("--max-update", "150"))
    checkpoint = save / "checkpoint_avg_last5.pt"
    torch.save({"model": state}, checkpoint)
    (save / "eval" / "results.json").write_text(json.dumps(
        {"bleu_tokenized": 12.5, "sacrebleu": 11.0, "checkpoint": str(checkpoint), "num_sentences": 500,
         "date": "2026-01-02T03:04:05+00:00"}))
    (save / "eval" / "run.json").unlink()
    command = reproduce.reproduce_command(ROWS["sinusoidal"], SCALES["demo"], 3, ["--max-update", "150"])
    summary = run_summary.summarize_run(ROWS["sinusoidal"], SCALES["demo"], 3, save,
                                      Path("configs/sinusoidal_demo.yaml"), command,
                                      ["--max-update", "150"], 99.0)
    assert json.loads(summary_path(save).read_text()) == summary
    assert summary["parameters"] == expected
    assert summary["arch"] == "arch_sinusoidal" and summary["config"] == "sinusoidal_demo"
    assert summary["language_pair"] == "en-de"
    assert summary["train_tokens_per_second"] == 25000.0  # mean of the two epoch summaries
    assert summary["train_tokens_per_second_range"] == [20000.0, 30000.0]
    assert summary["train_tokens_per_second_epochs"] == run_summary.FULL_EPOCHS
    # No training time in the checkpoint: the sum of fairseq-train's "done training in".
    assert summary["train_wall_seconds"] == 24.1 and summary["num_updates"] == 150
    assert summary["valid_loss"] == [[60, 8.5], [120, 7.0]]
    assert summary["bleu_tokenized"] == 12.5 and summary["sacrebleu"] == 11.0
    assert summary["date"] == "2026-01-02T03:04:05+00:00"  # when the test set was scored, not now
    assert summary["train_threads"] is None and summary["code_commit"] is None  # not logged: not guessed
    assert summary["train_invocations"] == 2 and summary["train_invocations_recorded"] == 0
    assert shlex.split(summary["reproduce_command"]) == [
        "scripts/reproduce_table.sh", "sinusoidal", "--scale", "demo", "--seed", "3",
        "--", "--max-update", "150"]


def test_a_resumed_runs_wall_time_is_fairseqs_own_and_an_older_record_keeps_its_provenance(tiny_state, tmp_path):
    """fairseq saves its training time in every checkpoint and carries it across resumes (an
    invocation killed by a time limit prints no "done training in"); the averaged checkpoint
    keeps the newest one's. A log without provenance lines keeps what an earlier run.json said."""
    state, _ = tiny_state
    save = write_run(tmp_path, "demo", "sinusoidal", 1, bleu=12.5)
    checkpoint = save / "checkpoint_avg_last5.pt"
    torch.save({"model": state, "extra_state": {"previous_training_time": 5000.5}}, checkpoint)
    (save / "eval" / "results.json").write_text(json.dumps({"bleu_tokenized": 12.5, "checkpoint": str(checkpoint)}))
    earlier = {"train_threads": 2, "train_cpu": "then", "code_commit": "abc", "train_device": "cpu"}
    summary_path(save).write_text(json.dumps(earlier))
    summary = run_summary.summarize_run(ROWS["sinusoidal"], SCALES["demo"], 1, save,
                                      Path("configs/sinusoidal_demo.yaml"), "command")
    assert summary["train_wall_seconds"] == 5000.5 and "previous_training_time" in summary["train_wall_source"]
    assert {key: summary[key] for key in earlier} == earlier


# --- collect


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, path


def table_line(markdown: str, row: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| {row} |"))


def test_a_cell_keeps_every_seed_in_its_place():
    fmt = "{:.1f}".format
    assert cells.cell([1.0, 3.0], fmt) == "2.0 ± 1.4 [1.0, 3.0]"
    assert cells.cell([2.0, 2.0], fmt) == "2.0"  # every seed the same: once
    assert cells.cell([None, None], fmt) == "—"
    # A value some runs did not measure: the mean is over the others, and the list shows which.
    assert cells.cell([None, 2.0], fmt) == "2.0 [—, 2.0]"
    assert cells.cell([None, 1.0, 3.0], fmt) == "2.0 ± 1.4 [—, 1.0, 3.0]"


def test_collect_on_fake_runs(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    write_run(work, "demo", "sinusoidal", 1, bleu=20.0, sacre=19.0, wall=240.0)
    write_run(work, "demo", "sinusoidal", 2, bleu=22.0, sacre=21.0, wall=360.0)
    write_run(work, "demo", "learned", 1, bleu=25.0, params=2000, extra=("--max-update", "60"))
    for seed, bleu in ((1, 30.0), (2, 31.0), (3, 32.0)):
        write_run(work, "demo", "rope", seed, bleu=bleu, sacre=bleu - 1)
    # rpe: not run. A run without run.json is not finished and not counted.
    (run_dir(work, SCALES["demo"], ROWS["rpe"], 1) / "eval").mkdir(parents=True)

    written = reproduce.collect.collect(SCALES["demo"], work, out)
    assert [p.name for p in written] == ["demo.md", "demo_valid_loss.png", "demo_bleu.png"]
    for png in written[1:]:
        assert_png(png)
    md = (out / "demo.md").read_text()
    assert "not comparable" in md and "WMT14" in md
    sinusoidal = table_line(md, "sinusoidal")
    assert "| 1, 2 |" in sinusoidal
    assert "21.00 ± 1.41 [20.00, 22.00]" in sinusoidal  # BLEU: mean ± sample std [seeds]
    assert "20.00 ± 1.41 [19.00, 21.00]" in sinusoidal  # sacreBLEU
    assert "5.0 ± 1.4 [4.0, 6.0]" in sinusoidal  # wall time, in minutes
    assert "| 1,000 |" in sinusoidal and "| 5,000 |" in sinusoidal  # equal over seeds: shown once
    assert "27.3 (Vaswani et al.) / 26.5 (Shaw et al.)" in sinusoidal
    assert "31.00 ± 1.00 [30.00, 31.00, 32.00]" in table_line(md, "rope")
    learned = table_line(md, "learned")
    assert "| 25.00 | — |" in learned and "| — |" in learned  # no sacreBLEU; no paper row
    rpe = table_line(md, "rpe")
    assert "not run" in rpe and "26.8 (Shaw et al.)" in rpe and "`transformer_rpe_tiny`" in rpe
    # The commands, from each run's command.txt (paths relative to the checkout it ran in), and
    # the reproduce command.
    assert "# from the checkout's root:\nfairseq-train DATA --arch arch_learned --seed 1 --max-update 60" in md
    assert "/repo" not in md
    assert "scripts/reproduce_table.sh learned --scale demo --seed 1 -- --max-update 60" in md
    assert "![validation loss](demo_valid_loss.png)" in md
    assert "| trained with |" in md and "| not recorded |" in md  # runs made before it was
    assert "[demo-length.md](demo-length.md)" in md  # the length study of the same models
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_collect_length_study_and_no_runs(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    labels = ["1-7", "8-14", "15-21", "22-28", "29-35", "36-42"]
    write_run(work, "demo-length", "rope", 1, bleu=60.0, length=dict(zip(labels, [90, 88, 70, 50, 30, 20])))
    write_run(work, "demo-length", "rope", 2, bleu=62.0, length=dict(zip(labels, [92, 90, 72, 52, 32, 22])))
    write_run(work, "demo-length", "learned", 1, bleu=40.0, length=dict(zip(labels, [90, 85, 20, 5, 1, 0])))
    written = collect.collect(SCALES["demo-length"], work, out)
    assert [p.name for p in written][-1] == "demo-length_bleu_by_length.png"
    for png in written[1:]:
        assert_png(png)
    md = (out / "demo-length.md").read_text()
    assert "## Length extrapolation" in md
    assert "| 15-21 † (n=150) |" in md and "| 8-14 (n=150) |" in md
    assert "71.00 ± 1.41 [70.00, 72.00]" in table_line(md.split("## Length")[1], "rope")
    assert "not run" in table_line(md.split("## Length")[1], "sinusoidal")

    # No finished run at all: every row "not run", still valid plots.
    written = collect.collect(SCALES["wmt14"], work, out)
    md = (out / "wmt14.md").read_text()
    assert all("not run" in table_line(md, row) for row in ROWS)
    assert "not comparable" not in md
    for png in written[1:]:
        assert_png(png)


def test_collect_cli(tmp_path, capsys):
    write_run(tmp_path / "w", "demo", "rope", 1, bleu=30.0)
    assert reproduce.main(["collect", "--scale", "demo", "--work-dir", str(tmp_path / "w"),
                           "--out-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "demo.md").is_file()
    assert "demo.md" in capsys.readouterr().out


# --- The multi30k scales


def test_multi30k_data_is_prepared_once_and_from_the_raw_dir(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(reproduce, "run_step", lambda command, device=CPU: ran.append(command))
    multi30k = SCALES["multi30k"]
    data_bin = reproduce.prepare_data(multi30k, tmp_path, "/shared/multi30k")
    assert data_bin == tmp_path / "multi30k" / "data" / "data-bin"
    assert ran == [[*reproduce.entry_point("data.prepare.cli"), "multi30k", "--tgt", "de",
                    "--raw-dir", "/shared/multi30k", tmp_path / "multi30k" / "data"]]
    data_bin.mkdir(parents=True)
    reproduce.prepare_data(multi30k, tmp_path)
    assert len(ran) == 1


def test_multi30k_length_trains_on_the_short_pairs_of_the_prepared_corpus(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(reproduce, "run_step", lambda command, device=CPU: ran.append(command))
    raw = tmp_path / "multi30k" / "data" / "raw"
    raw.mkdir(parents=True)
    (raw.parent / "data-bin").mkdir()
    limit = SCALES["multi30k-length"].max_train_words
    lengths = {"train": [3, limit, limit + 1, 30], "valid": [limit + 5, 2], "test": [1, limit + 9]}
    for split, ns in lengths.items():
        (raw / f"{split}.en").write_text("".join(" ".join(["w"] * n) + "\n" for n in ns))
        (raw / f"{split}.de").write_text("".join(f"satz {i}\n" for i in range(len(ns))))
    data_bin = reproduce.prepare_data(SCALES["multi30k-length"], tmp_path)
    corpus = tmp_path / "multi30k-length" / "corpus"
    assert (corpus / "train.de").read_text() == "satz 0\nsatz 1\n"  # at most `limit` words
    assert (corpus / "valid.de").read_text() == "satz 1\n"
    assert (corpus / "test.de").read_text() == (raw / "test.de").read_text()  # the whole test set
    command = [str(a) for a in ran[0]]
    assert command[2:4] == ["fairseq_rope.data.prepare.cli", "parallel"] and "--no-clean" in command
    assert command[command.index("--vocab-size") + 1] == "10000"
    assert data_bin == tmp_path / "multi30k-length" / "data" / "data-bin"


def write_outputs(run: Path, hypotheses, reference: Path, runaways=(0, 0)) -> None:
    """Detokenized hypotheses and what run.json records of the references and runaways."""
    (run / "eval" / "hyps.detok.de").write_text("".join(h + "\n" for h in hypotheses))
    summary = json.loads((run / "eval" / "run.json").read_text())
    summary.update(raw_reference=str(reference), raw_reference_sha256=run_summary._sha256(str(reference)),
                   chrf=50.0 + len(hypotheses[0]) / 10,
                   runaways={"ratio": 1.5, "longer_than_ratio": runaways[0], "at_length_limit": runaways[1]})
    (run / "eval" / "run.json").write_text(json.dumps(summary))


def test_collect_multi30k_significance_chrf_runaways_and_records(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    refs = [f"Ein Hund {i} läuft über die Wiese ." for i in range(60)]
    reference = tmp_path / "test.de"
    reference.write_text("".join(r + "\n" for r in refs))
    good, bad = refs, [f"Eine Katze {i} ." for i in range(60)]
    labels = ["1-8", "9-12", "13-16"]
    for seed in (1, 2):
        write_outputs(write_run(work, "multi30k", "sinusoidal", seed, bleu=30.0 + seed,
                                length=dict(zip(labels, [40, 30, 20]))), bad, reference)
        write_outputs(write_run(work, "multi30k", "rope", seed, bleu=35.0 + seed,
                                length=dict(zip(labels, [42, 33, 21]))), good, reference, runaways=(seed, 1))
    write_outputs(write_run(work, "multi30k", "rpe", 1, bleu=31.0), bad, reference)
    collect.collect(SCALES["multi30k"], work, out)
    md = (out / "multi30k.md").read_text()
    main = md.split("## Significance")[0]
    assert "| 1/1, 2/1 |" in table_line(main, "rope")  # runaways per seed: longer / at the limit
    assert "| sacreBLEU | chrF |" in main and "| 53.30 |" in table_line(main, "rope")  # chrF, equal seeds
    significance = md.split("## Significance")[1].split("\n## ")[0]
    bootstrap = significance.split("### Over training seeds")[0]
    rope_lines = [line for line in bootstrap.splitlines() if line.startswith("| rope |")]
    assert [line.split(" | ")[1] for line in rope_lines] == ["1", "2", "pooled 1+2"]
    assert all("0.001 *" in line for line in rope_lines)  # far better than the baseline everywhere
    assert "| rpe | 1 |" in significance and "| learned | — | not run |" in significance
    assert "bs:1000" in significance
    assert "## BLEU by source length" in md and "| 9-12 (n=150) |" in md and "†" not in md
    # Records keep the runs when the work directory is gone (another session, another machine).
    record = out / "runs" / "multi30k" / "rope" / "seed1"
    assert (record / "run.json").is_file() and (record / "command.txt").is_file()
    assert (record / "hyps.detok.de.gz").is_file()
    first = (record / "hyps.detok.de.gz").read_bytes()
    collect.collect(SCALES["multi30k"], work, out)
    assert (record / "hyps.detok.de.gz").read_bytes() == first  # same run, same bytes: nothing for git
    shutil.rmtree(work)
    collect.collect(SCALES["multi30k"], work, out)
    again = (out / "multi30k.md").read_text()
    assert table_line(again, "rope") == table_line(md, "rope")
    assert again.split("## Significance")[1].split("\n## ")[0] == significance


def test_collect_compares_an_ablation_with_the_baseline_and_with_the_row_it_takes_apart(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    refs = [f"Ein Hund {i} läuft über die Wiese ." for i in range(60)]
    reference = tmp_path / "test.de"
    reference.write_text("".join(r + "\n" for r in refs))
    half = refs[:30] + [f"Eine Katze {i} ." for i in range(30, 60)]
    for seed in (1, 2):
        write_outputs(write_run(work, "multi30k", "sinusoidal", seed, bleu=30.0, sacre=30.0), half, reference)
        write_outputs(write_run(work, "multi30k", "rope", seed, bleu=36.0, sacre=36.0), refs, reference)
        write_outputs(write_run(work, "multi30k", "rope_enc", seed, bleu=33.0, sacre=33.0), half, reference)
    collect.collect(SCALES["multi30k"], work, out)
    md = (out / "multi30k.md").read_text()
    assert "| 1, 2 | 33.00 | 33.00 |" in table_line(md, "rope_enc")
    assert "not run" in table_line(md, "rope_dec")
    significance = md.split("## Significance")[1].split("\n## ")[0]
    headings = [line for line in significance.splitlines() if line.startswith("### ")]
    assert headings == ["### Over test sentences (paired bootstrap)", "### Over training seeds (paired t-test)",
                        "### Over test sentences (paired bootstrap), against `rope`",
                        "### Over training seeds (paired t-test), against `rope`"]
    against_baseline, against_rope = significance.split(", against `rope`", 1)
    assert "| rope_enc | 1, 2 | +3.00, +3.00 |" in against_baseline
    assert "| rope_enc | 1, 2 | -3.00, -3.00 |" in against_rope
    assert "| rope_dec | — | not run |" in against_rope and "| learned |" not in against_rope
    assert (out / "runs" / "multi30k" / "rope_enc" / "seed2" / "run.json").is_file()
    collect.collect(SCALES["multi30k-fr"], work, out)  # another scale: no ablation rows
    assert "rope_enc" not in (out / "multi30k-fr.md").read_text()
    shutil.rmtree(work / "multi30k" / "rope_enc")
    shutil.rmtree(out / "runs" / "multi30k" / "rope_enc")
    collect.collect(SCALES["multi30k"], work, out)  # no ablation run: no tables against rope yet
    assert "against `rope`" not in (out / "multi30k.md").read_text()


def test_significance_says_why_it_is_unavailable(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    reference = tmp_path / "test.de"
    reference.write_text("a\nb\n")
    write_outputs(write_run(work, "multi30k", "sinusoidal", 1, bleu=30.0), ["a", "b"], reference)
    write_outputs(write_run(work, "multi30k", "rope", 1, bleu=30.0), ["a", "b"], reference)
    reference.write_text("a\nc\n")  # not the references the runs were scored against
    collect.collect(SCALES["multi30k"], work, out)
    assert "is not the reference the run was scored against" in (out / "multi30k.md").read_text()
    reference.unlink()
    collect.collect(SCALES["multi30k"], work, out)
    assert "not found, nor one with its checksum in" in (out / "multi30k.md").read_text()
    # The record outlived its checkout: the same references prepared in another work directory serve.
    moved = work / "multi30k" / "data" / "raw" / "test.de"
    moved.parent.mkdir(parents=True)
    moved.write_text("a\nc\n")
    collect.collect(SCALES["multi30k"], work, out)
    assert "not found, nor one with its checksum in" in (out / "multi30k.md").read_text()  # other text
    moved.write_text("a\nb\n")
    collect.collect(SCALES["multi30k"], work, out)
    significance = (out / "multi30k.md").read_text().split("## Significance")[1].split("\n## ")[0]
    assert "| rope | 1 | " in significance and "unavailable" not in significance


def test_a_record_whose_reference_is_gone_finds_the_one_another_run_recorded(tmp_path):
    """Seeds trained in two checkouts: seed 1 recorded a reference since removed, seed 2 the same
    file elsewhere. Every seed is tested, whichever is asked first (seed 1 is)."""
    work, out = tmp_path / "work", tmp_path / "results"
    gone, kept = tmp_path / "old" / "test.de", tmp_path / "new" / "test.de"
    for reference in (gone, kept):
        reference.parent.mkdir()
        reference.write_text("a\nb\n")
    for seed, reference in ((1, gone), (2, kept)):
        write_outputs(write_run(work, "multi30k", "sinusoidal", seed, bleu=30.0), ["a", "b"], reference)
        write_outputs(write_run(work, "multi30k", "rope", seed, bleu=30.0), ["a", "b"], reference)
    gone.unlink()
    collect.collect(SCALES["multi30k"], work, out)
    significance = (out / "multi30k.md").read_text().split("## Significance")[1].split("\n## ")[0]
    assert [line.split(" | ")[1] for line in significance.splitlines() if line.startswith("| rope |")][:3] == [
        "1", "2", "pooled 1+2"]
    assert "unavailable" not in significance


def test_collect_multi30k_length_marks_buckets_beyond_training(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    labels = ["1-8", "9-12", "13-16", "17-20"]
    save = write_run(work, "multi30k-length", "rope", 1, bleu=30.0, length=dict(zip(labels, [40, 35, 20, 10])))
    summary = json.loads((save / "eval" / "run.json").read_text())
    for bucket, ratio in zip(summary["bleu_by_length"]["buckets"], [1.0, 0.98, 0.8, 0.6]):
        bucket["length_ratio"] = ratio
    (save / "eval" / "run.json").write_text(json.dumps(summary))
    write_run(work, "multi30k-length", "rpe", 1, bleu=30.0, length=dict(zip(labels, [40, 35, 20, 10])))
    collect.collect(SCALES["multi30k-length"], work, out)
    md = (out / "multi30k-length.md").read_text()
    assert "## Length extrapolation" in md and "at most 12 source words" in md
    assert "| 9-12 (n=150) |" in md and "| 13-16 † (n=150) |" in md
    ratios = md.split("Hypothesis length over reference length")[1]
    assert table_line(ratios, "rope") == "| rope | 1.000 | 0.980 | 0.800 | 0.600 |"
    assert table_line(ratios, "rpe") == "| rpe | — | — | — | — |"  # recorded before it was measured
    assert_png(out / "multi30k-length_bleu_by_length.png")


def test_runs_say_what_they_were_trained_with():
    run = {"train_threads": 2, "train_cpu": "AMD EPYC", "code_commit": "0123456789abcdef" * 2 + "01234567"}
    assert cells._trained_with(run) == "2 threads, AMD EPYC, `0123456789`"
    run["code_commit"] += " (modified)"
    assert cells._trained_with(run) == "2 threads, AMD EPYC, `0123456789` (modified)"
    assert cells._trained_with({**run, "code_commit": None}) == "2 threads, AMD EPYC, commit unknown"
    assert cells._trained_with({}) == "not recorded"


def test_multi30k_length_against_the_same_rows_trained_on_all_lengths(tmp_path):
    """Difficulty by length is taken out by the models trained on the full corpus (from their records)."""
    work, out = tmp_path / "work", tmp_path / "results"
    labels = ["1-8", "9-12", "13-16", "17-20"]
    for seed, full in ((1, [42, 36, 30, 28]), (2, [44, 38, 32, 30])):
        # Seed 1 was recorded before length ratios were measured.
        write_run(work, "multi30k", "rope", seed, bleu=35.0, length=dict(zip(labels, full)),
                  ratios=None if seed == 1 else dict(zip(labels, [1.0, 1.0, 0.9, 0.8])))
    collect.collect(SCALES["multi30k"], work, out)
    shutil.rmtree(work / "multi30k")  # recorded: the full-data runs' directories may be gone
    write_run(work, "multi30k-length", "rope", 1, bleu=30.0, length=dict(zip(labels, [41, 35, 20, 10])),
              ratios=dict(zip(labels, [1.0, 1.02, 0.72, 0.4])))
    write_run(work, "multi30k-length", "sinusoidal", 1, bleu=30.0, length=dict(zip(labels, [40, 35, 20, 10])))
    collect.collect(SCALES["multi30k-length"], work, out)
    section = (out / "multi30k-length.md").read_text().split("## Against the same rows trained on all lengths")[1]
    assert "[multi30k.md](multi30k.md)" in section and "| 13-16 † |" in section
    # rope: 41 - mean(42, 44), 35 - 37, 20 - 31, 10 - 29
    bleu, lengths = section.split("Output length over the full-data model's output length")
    assert table_line(bleu, "rope") == "| rope | -2.00 | -2.00 | -11.00 | -19.00 |"
    # Output lengths: the study's ratio over the mean of the full-data runs that measured one.
    assert table_line(lengths, "rope") == "| rope | 1.000 | 1.020 | 0.800 | 0.500 |"
    assert "multi30k not run" in table_line(section, "sinusoidal")
    assert "| learned | not run |" in table_line(section, "learned") + "|"


# --- The converged scale


CONVERGED_LOG = """\
# 2026-01-01T00:00:00 host in /repo: fairseq-train ... --max-update 1791
2026-01-01 00:10:00 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 8.154 | nll_loss 7.282 | ppl 155.63 | bleu 4.64 | wps 551.6 | wpb 2650 | bsz 168 | num_updates 199
2026-01-01 00:20:00 | INFO | valid | epoch 004 | valid on 'valid' subset | loss 6.1 | bleu 13.89 | num_updates 398 | best_bleu 13.89
2026-01-01 00:30:00 | INFO | valid | epoch 005 | valid on 'valid' subset | loss 5.9 | bleu 13.5 | num_updates 597 | best_bleu 13.89
2026-01-01 00:40:00 | INFO | valid | epoch 007 | valid on 'valid' subset | loss 5.8 | bleu 13.89 | num_updates 796 | best_bleu 13.89
"""


def test_parse_train_log_reads_valid_bleu():
    log = train_log.parse_train_log(CONVERGED_LOG.splitlines())
    assert log.valid_bleu == {199: 4.64, 398: 13.89, 597: 13.5, 796: 13.89}
    assert log.valid_loss[199] == 8.154 and log.num_updates == 796
    assert train_log.parse_train_log(TRAIN_LOG.splitlines()).valid_bleu == {}  # no --eval-bleu


def test_a_converged_run_is_not_trained_again(tmp_path, monkeypatch):
    """Patience 2 is met at update 796 (two validations without a new best, a tie included)."""
    ran = timed_steps(monkeypatch)
    config = Path(load_experiment("rope_multi30k-converged").path)
    (tmp_path / "train.log").write_text(CONVERGED_LOG)
    assert reproduce.train(config, tmp_path / "bin", tmp_path, 1, ["--patience", "2"]) is None
    assert reproduce.convergence_of(tmp_path, config, ["--patience", "2"]) == {
        "patience": 2, "max_update": int(load_experiment(config).train["max-update"]),
        "validate_interval_updates": "199", "update": 796, "reason": "patience",
        "best_update": 398, "best_bleu": 13.89}
    assert not ran
    assert reproduce.train(config, tmp_path / "bin", tmp_path, 1, ["--patience", "3"]) == STEP_SECONDS  # resumes
    assert len(ran) == 1 and ran[0][-5:] == [tmp_path, "--seed", "1", "--patience", "3"]
    with pytest.raises(TableError, match="has not converged by its rule .patience 3.*last validation at update 796"):
        reproduce.convergence_of(tmp_path, config, ["--patience", "3"])


def test_a_converged_scale_scores_the_equal_budget_before_training_on(tmp_path, monkeypatch):
    """Train to 1791, average the last 5 checkpoints up to it into eval-budget/, train on to the
    rule, then average the last 5 up to where the rule stopped into eval/."""
    calls = []
    monkeypatch.setattr(reproduce, "prepare_data", lambda scale, work, raw: work / "multi30k" / "data" / "data-bin")
    monkeypatch.setattr(reproduce, "check_language_pair", lambda scale, data_bin: None)
    monkeypatch.setattr(reproduce, "train", lambda *a: calls.append(("train", list(a[4]))) or 1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(reproduce, "evaluate", lambda *a, **k: calls.append(("evaluate", k)))
    monkeypatch.setattr(reproduce, "length_results", lambda scale, save, data, where="eval": calls.append(("length", where)))
    monkeypatch.setattr(reproduce, "convergence_of", lambda *a: {"update": 4179})
    monkeypatch.setattr(reproduce, "summarize_run", lambda *a, **k: calls.append(("summarize", k)) or {})
    monkeypatch.setattr(reproduce, "summarize_budget", lambda *a: calls.append(("summarize budget", a[2])))
    reproduce.reproduce_row(ROWS["rope"], SCALES["multi30k-converged"], 2, tmp_path, ["--patience", "3"])
    assert calls == [
        ("train", ["--patience", "3", "--max-update", "1791"]),
        ("evaluate", {"upper_bound": 1791, "eval_dir": "eval-budget", "device": CPU}),
        ("length", "eval-budget"),
        ("summarize budget", 2),  # recorded before training on: a run cut off later keeps it
        ("train", ["--patience", "3"]),
        ("evaluate", {"upper_bound": 4179, "device": CPU}),
        ("length", "eval"),
        ("summarize", {"convergence": {"update": 4179}, "budget_length": None}),
    ]
    # The data of the multi30k table: one preparation for both scales.
    assert reproduce.data_dir(tmp_path, SCALES["multi30k-converged"]) == tmp_path / "multi30k" / "data"


def test_a_converged_scales_run_is_summarized_at_its_equal_budget_before_it_converges(tiny_state, tmp_path):
    """eval-budget/run.json: the run as it stood at the budget, its curves cut there and no
    converged score; the finished run.json repeats its identity and equal-budget entry."""
    state, expected = tiny_state
    scale = dataclasses.replace(SCALES["multi30k-converged"], equal_budget=398)
    save = tmp_path / "run"
    (save / "eval").mkdir(parents=True)
    (save / "eval-budget").mkdir()
    (save / "command.txt").write_text("cd /repo\nfairseq-train /repo/DATA --arch arch_rope --seed 2\n")
    (save / "train.log").write_text(CONVERGED_LOG)  # validations at 199, 398, 597 and 796
    for where, bleu, seconds in (("eval-budget", 30.0, 100.0), ("eval", 33.0, 200.0)):
        checkpoint = save / where / "checkpoint_avg.pt"
        torch.save({"model": state, "extra_state": {"previous_training_time": seconds}}, checkpoint)
        (save / where / "results.json").write_text(json.dumps(
            {"bleu_tokenized": bleu, "sacrebleu": bleu - 1, "checkpoint": str(checkpoint),
             "date": f"2026-01-0{int(seconds) // 100}T00:00:00+00:00"}))
    args = (ROWS["rope"], scale, 2, save, Path("configs/rope_multi30k-converged.yaml"), "the command")
    early = run_summary.summarize_budget(*args)
    assert json.loads(budget_summary_path(save).read_text()) == early
    assert under_way(early) and early["stage"] == UNDER_WAY and early["num_updates"] == 398
    assert early["valid_bleu"] == [[199, 4.64], [398, 13.89]]
    assert [u for u, _ in early["valid_loss"]] == [199, 398]
    assert "bleu_tokenized" not in early and "convergence" not in early
    assert early["equal_budget"]["updates"] == 398 and early["equal_budget"]["bleu_tokenized"] == 30.0
    assert early["equal_budget"]["train_wall_seconds"] == 100.0
    assert early["date"] == "2026-01-01T00:00:00+00:00"  # when the budget was scored
    assert (early["parameters"], early["arch"], early["seed"], early["language_pair"]) == (
        expected, "arch_rope", 2, "en-de")
    final = run_summary.summarize_run(*args, convergence={"update": 796})
    assert not under_way(final) and final["bleu_tokenized"] == 33.0 and final["num_updates"] == 796
    assert final["equal_budget"] == early["equal_budget"]
    assert {k: v for k, v in final.items() if k in early and k not in ("valid_bleu", "valid_loss", "num_updates", "date")} == {
        k: v for k, v in early.items() if k not in ("stage", "valid_bleu", "valid_loss", "num_updates", "date")}


def write_converged_run(work: Path, row: str, seed: int, converged: float, budget: float,
                        curve: Dict[int, float], stop: int, hyps: str, budget_hyps: str, reference: Path,
                        budget_wall: Optional[float] = None) -> Path:
    """A fake finished run of the converged scale with its valid BLEU curve and both evaluations."""
    save = write_run(work, "multi30k-converged", row, seed, bleu=converged, sacre=converged - 0.5)
    for where, text in (("eval", hyps), ("eval-budget", budget_hyps)):
        (save / where).mkdir(exist_ok=True)
        (save / where / "hyps.detok.de").write_text(text)
    summary = json.loads(summary_path(save).read_text())
    sha = sha256_file(reference)
    best = max(b for u, b in curve.items() if u <= stop)
    summary.update({
        "raw_reference": str(reference), "raw_reference_sha256": sha, "train_device": "cpu",
        "valid_bleu": [[u, b] for u, b in sorted(curve.items())],
        "convergence": {"patience": 3, "max_update": 5970, "update": stop, "reason": "patience",
                        "best_update": min(u for u, b in curve.items() if b == best), "best_bleu": best},
        "updates_at_convergence": stop,
        "equal_budget": {"updates": 1791, "bleu_tokenized": budget, "sacrebleu": budget - 0.5, "chrf": 50.0,
                         "raw_reference": str(reference), "raw_reference_sha256": sha,
                         "train_wall_seconds": budget_wall},
    })
    summary_path(save).write_text(json.dumps(summary))
    return save


def converged_scale_files(tmp_path: Path) -> Tuple[Path, Path, Path, str]:
    """(work directory, results directory, a 40-caption reference, hypotheses equal to it)."""
    reference = tmp_path / "test.de"
    good = "".join(f"ein Hund {i} läuft über die grüne Wiese .\n" for i in range(40))
    reference.write_text(good)
    return tmp_path / "work", tmp_path / "results", reference, good


def test_collect_a_converged_scale(tmp_path):
    work, out, reference, good = converged_scale_files(tmp_path)
    poor = "\n".join(f"ein Hund {i} läuft" for i in range(40)) + "\n"
    sinusoidal = {199 * k: v for k, v in enumerate([10.0, 20.0, 30.0, 36.0, 38.0, 40.0, 39.5, 39.0, 39.8], 1)}
    rope = {199 * k: v for k, v in enumerate([15.0, 30.0, 38.5, 39.7, 40.2, 40.1, 39.9, 40.0], 1)}
    write_converged_run(work, "sinusoidal", 1, 40.0, 35.0, sinusoidal, 1791, good, poor, reference)
    write_converged_run(work, "rope", 1, 39.0, 37.0, rope, 1592, poor, good, reference, budget_wall=1200.0)
    written = collect.collect(SCALES["multi30k-converged"], work, out)
    assert [p.name for p in written][-1] == "multi30k-converged_valid_bleu.png"
    for png in written[1:]:
        assert_png(png)
    md = (out / "multi30k-converged.md").read_text()
    # Runs outside the checkout: the committed table names no machine's paths for them.
    assert "the runs of `WORK_DIR/multi30k-converged` of `collect --work-dir WORK_DIR` are recorded" in md
    assert str(work) not in md
    # Records keep both evaluations' hypotheses.
    record = out / "runs" / "multi30k-converged" / "rope" / "seed1"
    assert {p.name for p in record.glob("*.gz")} == {"hyps.detok.de.gz", "budget.hyps.detok.de.gz"}
    converged, budget = md.split("## The same runs at the equal budget (1791 updates)")
    # Converged: rope's poor hypotheses against sinusoidal's good ones; at the budget the other way round.
    assert "| 40.00 |" in table_line(converged, "sinusoidal") and "| 39.00 |" in table_line(converged, "rope")
    assert "| 35.00 |" in table_line(budget, "sinusoidal") and "| 37.00 |" in table_line(budget, "rope")
    assert "| 1,791 |" in table_line(budget, "rope")  # updates: the budget
    # Wall time at the budget: its own (20 min) where recorded, never the whole run's (5 min).
    assert "| 20.0 | 1,791 |" in table_line(budget, "rope") and "| — | 1,791 |" in table_line(budget, "sinusoidal")
    significance = [line for line in md.splitlines() if line.startswith("| rope | 1 |") and "→" in line]
    assert len(significance) == 2 and "| 100.00 → 28.65 | 0.001 * |" in significance[0]
    assert "| 28.65 → 100.00 | 0.001 * |" in significance[1]
    # Convergence: best valid BLEU and where, where the rule stopped, and the updates to 95 % and
    # 99 % of sinusoidal's converged valid BLEU (40.0: 38.0 and 39.6).
    line = table_line(converged.split("## Convergence")[1], "rope")
    assert line == "| rope | 1 | 40.20 | 995 | 1,592 | patience | 597 | 796 |"
    line = table_line(converged.split("## Convergence")[1], "sinusoidal")
    assert line == "| sinusoidal | 1 | 40.00 | 1,194 | 1,791 | patience | 995 | 1,194 |"
    assert "not run" in table_line(converged.split("## Convergence")[1], "rpe")
    assert "![valid BLEU](multi30k-converged_valid_bleu.png)" in md


def write_under_way_run(work: Path, row: str, seed: int, budget: float, curve: Dict[int, float],
                        budget_hyps: str, reference: Path) -> Path:
    """A fake run of the converged scale scored at its equal budget and still training."""
    save = write_converged_run(work, row, seed, 0.0, budget, curve, max(curve), "", budget_hyps, reference)
    summary = json.loads(summary_path(save).read_text())
    for key in ("bleu_tokenized", "sacrebleu", "convergence", "updates_at_convergence"):
        del summary[key]
    budget_summary_path(save).write_text(json.dumps({**summary, "stage": UNDER_WAY, "num_updates": 1791}))
    summary_path(save).unlink()
    (save / "eval" / "hyps.detok.de").unlink()
    return save


def test_a_run_under_way_counts_at_the_equal_budget_only_and_never_replaces_its_finished_record(tmp_path):
    work, out, reference, good = converged_scale_files(tmp_path)
    curve = {199 * k: 10.0 * k for k in range(1, 10)}
    write_converged_run(work, "sinusoidal", 1, 40.0, 35.0, {**curve, 1990: 40.0}, 1990, good, good, reference)
    write_converged_run(work, "rope", 1, 39.0, 37.0, {**curve, 1990: 41.0}, 1990, good, good, reference)
    going = write_under_way_run(work, "rope", 2, 39.0, curve, good, reference)
    collect.collect(SCALES["multi30k-converged"], work, out)
    md = (out / "multi30k-converged.md").read_text()
    assert "from 2 finished run(s) and 1 under way (at the equal budget only)" in md
    converged, budget = md.split("## The same runs at the equal budget (1791 updates)")
    assert "`arch_rope` | 1 | 39.00 |" in table_line(converged, "rope")  # seeds: the finished one
    assert table_line(converged.split("## Convergence")[1], "rope").startswith("| rope | 1 |")
    assert "`arch_rope` | 1, 2 | 38.00 ± 1.41 [37.00, 39.00] |" in table_line(budget, "rope")
    assert "Under way, so in these tables only: rope seed 2 (scored at the equal budget" in budget
    assert "# rope, seed 2" in md  # its command, to resume or reproduce it
    record = out / "runs" / "multi30k-converged" / "rope" / "seed2"
    assert under_way(json.loads((record / "run.json").read_text()))
    assert {p.name for p in record.glob("*.gz")} == {"budget.hyps.detok.de.gz"}
    # It converges: its record becomes the finished run's.
    write_converged_run(tmp_path / "later", "rope", 2, 38.0, 39.0, {**curve, 1990: 40.5}, 1990, good, good, reference)
    collect.collect(SCALES["multi30k-converged"], tmp_path / "later", out)
    md = (out / "multi30k-converged.md").read_text()
    assert "from 3 finished run(s) recorded" in md and "Under way" not in md
    assert "`arch_rope` | 1, 2 | 38.50 ± 0.71 [39.00, 38.00] |" in table_line(md.split("## The same runs")[0], "rope")
    # The same cell started again elsewhere, only under way there: the finished record stays.
    collect.collect(SCALES["multi30k-converged"], work, out)
    assert not under_way(json.loads((record / "run.json").read_text()))
    assert "from 3 finished run(s) recorded" in (out / "multi30k-converged.md").read_text()
    assert going.is_dir()



def valid_lines(curve: Dict[int, float]) -> str:
    """fairseq-train's validation lines (--eval-bleu) for a curve."""
    return "".join(f"2026-01-01 00:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.0 "
                   f"| bleu {b} | num_updates {u}\n" for u, b in sorted(curve.items()))


def test_a_run_under_way_records_how_far_it_has_trained_and_its_convergence_speed_so_far(tmp_path):
    """What a run under way showed past its budget is kept in its record: a session's end on a
    machine that forgets its files cannot take the updates it took to reach 95 % away."""
    work, out, reference, good = converged_scale_files(tmp_path)
    sinusoidal = {199 * k: 4.0 * k for k in range(1, 11)}  # converged valid BLEU 40.0 at 1990
    write_converged_run(work, "sinusoidal", 1, 40.0, 35.0, sinusoidal, 1990, good, good, reference)
    budget = {199 * k: round(4.2 * k, 1) for k in range(1, 10)}  # 37.8 at 1791: not yet 95 % (38.0)
    going = write_under_way_run(work, "rope", 2, 39.0, budget, good, reference)
    (going / "train.log").write_text(valid_lines(budget))
    collect.collect(SCALES["multi30k-converged"], work, out)  # not past its budget: nothing to add
    record = out / "runs" / "multi30k-converged" / "rope" / "seed2" / "run.json"
    assert "progress" not in json.loads(record.read_text())
    table = (out / "multi30k-converged.md").read_text().split("Runs under way")[1]
    assert table_line(table, "rope") == "| rope | 2 | 1,791 | 37.80 | 1,791 | not by 1,791 | not by 1,791 |"
    # It trains on to 2587 (38.5 at 1990: 95 %; never 99 %, 39.6) and the session ends.
    later = {**budget, 1990: 38.5, 2189: 38.0, 2388: 39.0, 2587: 38.9}
    (going / "train.log").write_text(valid_lines(later))
    collect.collect(SCALES["multi30k-converged"], work, out)
    kept = json.loads(record.read_text())
    assert under_way(kept) and kept["num_updates"] == 1791 and kept["valid_bleu"][-1] == [1791, 37.8]
    assert kept["progress"]["num_updates"] == 2587 and kept["progress"]["valid_bleu"][-1] == [2587, 38.9]
    shutil.rmtree(work / "multi30k-converged" / "rope")  # the machine forgets the run
    collect.collect(SCALES["multi30k-converged"], work, out)
    md = (out / "multi30k-converged.md").read_text()
    convergence = md.split("## Convergence")[1].split("## The same runs")[0]
    assert table_line(convergence.split("Runs under way")[0], "rope").startswith("| rope | not run |")
    assert table_line(convergence.split("Runs under way")[1], "rope") == (
        "| rope | 2 | 2,587 | 39.00 | 2,388 | 1,990 | not by 2,587 |")
    # Started again from scratch on the next machine: the record keeps the further trajectory
    # until the new run passes it.
    write_under_way_run(work, "rope", 2, 39.0, budget, good, reference)
    (going / "train.log").write_text(valid_lines({**budget, 1990: 38.5}))
    collect.collect(SCALES["multi30k-converged"], work, out)
    assert json.loads(record.read_text())["progress"]["num_updates"] == 2587
    (going / "train.log").write_text(valid_lines({**later, 2786: 39.7}))
    collect.collect(SCALES["multi30k-converged"], work, out)
    assert json.loads(record.read_text())["progress"]["num_updates"] == 2786


def test_a_row_trained_at_uneven_speed_is_marked_in_tokens_per_second_and_wall_time():
    """A shared CPU (or a resume elsewhere) shows as epochs of very different speed: the row's speed
    cells say so, and the table says why, rather than pass the slowdown off as the model's cost."""
    def run(epochs):
        return {"seed": 1, "arch": "a", "bleu_tokenized": 30.0, "train_wall_seconds": 300.0,
                "train_tokens_per_second": statistics.fmean(epochs), "train_tokens_per_second_range": epochs}

    runs = {name: [] for name in ROWS}
    runs.update(sinusoidal=[run([1000.0, 1400.0])], rope=[run([300.0, 1400.0])])
    table = cells.main_table(SCALES["multi30k"], runs)
    assert "| 850 ‡ | 5.0 ‡ |" in table_line("\n".join(table), "rope")
    assert "‡" not in table_line("\n".join(table), "sinusoidal")  # 1.4x apart: one speed
    assert table[-1] == cells.UNEVEN_NOTE
    runs["rope"] = []
    assert "‡" not in "\n".join(cells.main_table(SCALES["multi30k"], runs))


def test_runs_of_one_row_on_different_devices_say_so():
    runs = [{"seed": 1, "train_device": "cpu"}, {"seed": 2, "train_device": "NVIDIA H100"}]
    assert cells.seeds_cell(runs) == "1, 2 (devices differ, each cell pools them: cpu, NVIDIA H100)"
    assert cells.seeds_cell([{"seed": 1, "train_device": "cpu"}, {"seed": 3, "train_device": "cpu"}]) == "1, 3"
