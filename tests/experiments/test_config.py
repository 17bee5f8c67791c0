"""Experiment configs → fairseq-train arguments, checked against fairseq's own parser."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from fairseq_rope.experiments.table import ROWS
from fairseq_rope.experiments import config as experiment
from fairseq_rope.base import TABLE_DECODING
from fairseq_rope.experiments.config import ConfigError, load_experiment, options_to_argv, training_argv

from fairseq_rope.base import PLUGIN_DIR
from tests.conftest import REPO

SHIPPED = experiment.available_configs()


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def parse_fairseq(argv):
    """Parse fairseq-train arguments exactly as fairseq-train does."""
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def test_options_to_argv_scalars_flags_and_lists():
    argv = options_to_argv({
        "arch": "transformer_rope_tiny", "lr": 0.0005, "warmup-init-lr": "1e-7",
        "max-tokens": 4096, "share-all-embeddings": True, "fp16": False, "seed": None,
        "adam-betas": "(0.9, 0.98)", "some-list": ["a", 2, 0.5],
    })
    assert argv == [
        "--arch", "transformer_rope_tiny", "--lr", "0.0005", "--warmup-init-lr", "1e-7",
        "--max-tokens", "4096", "--share-all-embeddings",
        "--adam-betas", "(0.9, 0.98)", "--some-list", "a", "2", "0.5",
    ]


def test_extends_overrides_drops_and_appends(tmp_path):
    write(tmp_path, "base/recipe.yaml", """\
        description: base recipe
        train:
          lr: 5e-4
          no-epoch-checkpoints: true
          max-tokens: 4096
    """)
    write(tmp_path, "child.yaml", """\
        description: the child
        extends: base/recipe
        train:
          max-tokens: 1024
          no-epoch-checkpoints: false
          arch: transformer_rope_tiny
    """)
    exp = load_experiment("child", config_dir=tmp_path)
    assert exp.description == "the child"
    assert exp.name == "child"
    # Parent order kept, overridden in place, dropped by false, new keys last.
    assert exp.argv() == ["--lr", "5e-4", "--max-tokens", "1024", "--arch", "transformer_rope_tiny"]
    # A config given by path resolves its parent relative to itself, from any cwd.
    assert load_experiment(tmp_path / "child.yaml").argv() == exp.argv()


def test_extends_is_relative_to_the_config_not_the_cwd(tmp_path, monkeypatch):
    write(tmp_path, "configs/child.yaml", "description: c\nextends: parent\ntrain: {b: 2}\n")
    write(tmp_path, "configs/parent.yaml", "description: p\ntrain: {a: 1}\n")
    write(tmp_path, "parent.yaml", "description: decoy\ntrain: {decoy: 1}\n")
    monkeypatch.chdir(tmp_path)
    assert load_experiment("child", config_dir=tmp_path / "configs").argv() == ["--a", "1", "--b", "2"]
    write(tmp_path, "configs/orphan.yaml", "description: o\nextends: missing\n")
    with pytest.raises(ConfigError, match="extends 'missing', which is not a config"):
        load_experiment("orphan", config_dir=tmp_path / "configs")


def test_extends_cycle_is_an_error(tmp_path):
    write(tmp_path, "a.yaml", "description: a\nextends: b\n")
    write(tmp_path, "b.yaml", "description: b\nextends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_experiment("a", config_dir=tmp_path)


@pytest.mark.parametrize("text, message", [
    ("description: x\ntrian: {lr: 1}\n", "unknown top-level key"),
    ("train: {lr: 1}\n", "'description'"),
    ("description: x\ntrain: {--lr: 1}\n", "without the leading dashes"),
    ("description: x\ntrain: {save-dir: /tmp/x}\n", "set by the training entry point"),
    ("description: x\ntrain: {lr: {a: 1}}\n", "expected a scalar"),
    ("description: x\ntrain: {lr: []}\n", "one or more scalars"),
    ("description: x\ntrain: [lr]\n", "must be a mapping"),
])
def test_invalid_configs_are_clear_errors(tmp_path, text, message):
    write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError, match=message):
        load_experiment("bad", config_dir=tmp_path)


def test_unknown_config_lists_available_configs(tmp_path):
    write(tmp_path, "alpha.yaml", "description: a\n")
    write(tmp_path, "beta.yaml", "description: b\n")
    write(tmp_path, "base/shared.yaml", "description: shared\n")
    with pytest.raises(ConfigError, match=r"unknown config 'gamma'.*available configs: alpha, beta\)"):
        load_experiment("gamma", config_dir=tmp_path)


def test_cli_prints_nul_separated_full_command(capsys, tmp_path):
    assert experiment.main(["-0", "--data", "DATA", "--save-dir", "SAVE", "rope_demo",
                            "--", "--lr", "1e-3", "--fp16"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\0")
    argv = out[:-1].split("\0")
    assert argv[:5] == ["DATA", "--user-dir", str(PLUGIN_DIR), "--save-dir", "SAVE"]
    assert argv[-3:] == ["--lr", "1e-3", "--fp16"]
    assert "--adam-betas" in argv and "(0.9, 0.98)" in argv  # one argument, spaces and all


def test_cli_unknown_config_exits_with_the_list(capsys):
    assert experiment.main(["no_such_config"]) == 2
    err = capsys.readouterr().err
    assert "unknown config 'no_such_config'" in err
    assert all(name in err for name in ("rope_base", "rope_demo"))


def test_shipped_configs_exist():
    assert {"rope_base", "rope_demo", "sinusoidal_base"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_parses_with_fairseq(name, tmp_path):
    exp = load_experiment(name)
    args = parse_fairseq(training_argv(exp, tmp_path / "data-bin", tmp_path / "save"))
    assert args.arch == exp.train["arch"]
    assert args.save_dir == str(tmp_path / "save")
    assert args.lr == [float(exp.train["lr"])]
    assert args.max_tokens == exp.train["max-tokens"]
    # Enough update checkpoints survive for averaging the last 5.
    assert args.save_interval_updates > 0 and args.keep_interval_updates >= 5
    assert args.max_update >= 5 * args.save_interval_updates
    # Validation decodes only where a convergence rule needs valid BLEU.
    assert getattr(args, "eval_bleu", False) == name.endswith("-converged")


@pytest.mark.parametrize("name", [n for n in SHIPPED if n.endswith("-converged")])
def test_the_convergence_rule_validates_as_the_tables_decode(name, tmp_path):
    """Valid BLEU decodes like the test set (beam 4, lenpen 0.6, max length 200), scores BPE-removed,
    Moses-detokenized target text (German, or French for the -fr- configs), picks the best checkpoint
    by it, and keeps enough checkpoints to average the last 5 up to where the rule stops a resumed run
    that trained past it."""
    args = parse_fairseq(training_argv(load_experiment(name), tmp_path / "data-bin", tmp_path / "save"))
    assert json.loads(args.eval_bleu_args) == TABLE_DECODING
    assert args.eval_bleu_remove_bpe == "@@ " and not args.eval_tokenized_bleu
    assert args.eval_bleu_detok == "moses" and json.loads(args.eval_bleu_detok_args) == {
        "target_lang": "fr" if "-fr-" in name else "de"}
    assert args.best_checkpoint_metric == "bleu" and args.maximize_best_checkpoint_metric
    assert args.validate_interval_updates == args.save_interval_updates == 199  # the multi30k checkpoints
    assert args.keep_interval_updates >= args.patience + 5
    assert args.no_epoch_checkpoints


def test_rope_base_is_the_paper_recipe(tmp_path):
    args = parse_fairseq(training_argv(load_experiment("rope_base"), tmp_path, tmp_path / "save"))
    assert args.arch == "transformer_rope_wmt_en_de"
    assert args.share_all_embeddings
    assert args.optimizer == "adam" and eval(args.adam_betas) == (0.9, 0.98)
    assert args.clip_norm == 0.0 and args.weight_decay == 0.0
    assert args.lr == [5e-4] and args.lr_scheduler == "inverse_sqrt"
    assert args.warmup_init_lr == 1e-7 and args.warmup_updates == 4000
    assert args.criterion == "label_smoothed_cross_entropy" and args.label_smoothing == 0.1
    assert args.dropout == 0.1
    assert args.max_update == 100_000
    # ~25k target tokens per update: the token budget of 8 GPUs x 3584 (Ott et al.).
    assert args.max_tokens * args.update_freq[0] == 8 * 3584
    assert args.log_format == "simple" and args.log_interval == 100 and args.seed == 1
    assert args.max_update % args.save_interval_updates == 0  # the final update is checkpointed


def test_demo_is_tiny_with_the_paper_optimizer(tmp_path):
    args = parse_fairseq(training_argv(load_experiment("rope_demo"), tmp_path, tmp_path / "save"))
    assert args.arch == "transformer_rope_tiny"
    assert eval(args.adam_betas) == (0.9, 0.98) and args.lr_scheduler == "inverse_sqrt"
    assert args.warmup_init_lr == 1e-7 and args.label_smoothing == 0.1
    assert args.max_update % args.save_interval_updates == 0


def test_extra_args_override_config_in_fairseq_parser(tmp_path):
    exp = load_experiment("rope_base")
    extra = ["--lr", "0.001", "--update-freq", "2", "--arch", "transformer_rope_tiny",
             "--no-epoch-checkpoints", "--fp16"]
    args = parse_fairseq(training_argv(exp, tmp_path, tmp_path / "save", extra))
    assert args.lr == [0.001]
    assert args.update_freq == [2]
    assert args.arch == "transformer_rope_tiny"
    assert args.encoder_embed_dim == 64  # the overriding arch's defaults apply
    assert args.no_epoch_checkpoints  # a bare flag repeated is still set
    assert args.fp16  # a bare flag added by the extra args
    assert args.share_all_embeddings  # untouched config flags stay


def run_train_sh(*args, cwd):
    return subprocess.run([str(REPO / "scripts" / "train.sh"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_train_sh_unknown_config_fails_before_creating_save_dir(tmp_path):
    result = run_train_sh("no_such_config", tmp_path / "data", tmp_path / "save", cwd=tmp_path)
    assert result.returncode != 0
    assert "unknown config 'no_such_config'" in result.stderr
    assert "rope_base" in result.stderr
    assert not (tmp_path / "save").exists()


@pytest.mark.slow  # 36 s (2026-11-25); test_package trains and evaluates through the installed plugin
def test_train_and_evaluate_scripts_end_to_end(toy_data_bin, tmp_path):
    """train.sh (rope_demo config, overridden to 10 updates) then evaluate.sh on the average of 5."""
    save = tmp_path / "run"
    # Small batches so the 10 updates stay inside epoch 1: fairseq writes no update
    # checkpoint for an update that ends an epoch.
    train = run_train_sh("rope_demo", toy_data_bin, save, "--max-update", "10", "--save-interval-updates", "2",
                         "--max-tokens", "256", "--log-interval", "5", cwd=tmp_path)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert sorted(p.name for p in save.glob("checkpoint_*_*.pt")) == [
        f"checkpoint_1_{u}.pt" for u in (10, 2, 4, 6, 8)]
    cd_line, command = (save / "command.txt").read_text().splitlines()
    assert cd_line == f"cd {tmp_path}"
    assert command.startswith(f"fairseq-train {toy_data_bin} --user-dir {str(PLUGIN_DIR)} ")
    assert "--adam-betas '(0.9, 0.98)'" in command
    assert command.endswith("--max-update 10 --save-interval-updates 2 --max-tokens 256 --log-interval 5")
    log = (save / "train.log").read_text()
    assert "done training" in log and "num_updates=10" in train.stdout.replace(" ", "")

    # An untrained model never stops: cap the output length (extra fairseq-generate args).
    evaluate = subprocess.run([str(REPO / "scripts" / "evaluate.sh"), str(save), str(toy_data_bin),
                               "--", "--max-len-a", "1", "--max-len-b", "2"],
                              capture_output=True, text=True, cwd=tmp_path)
    assert evaluate.returncode == 0, evaluate.stdout[-3000:] + evaluate.stderr[-3000:]
    summary = evaluate.stdout.splitlines()
    assert summary[0].startswith("BLEU (tokenized, compound-split): ")
    assert summary[1].startswith("sacreBLEU (detokenized): ") and "nrefs:1|" in summary[1]

    results = json.loads((save / "eval" / "results.json").read_text())
    assert results["bleu_tokenized"] is not None and results["sacrebleu"] is not None
    assert [Path(p).name for p in results["averaged_checkpoints"]] == [
        f"checkpoint_1_{u}.pt" for u in (2, 4, 6, 8, 10)]
    assert results["decoding"]["beam"] == 4 and results["decoding"]["lenpen"] == 0.6
    command = results["decoding"]["command"]
    assert command[-2:] == ["--max-len-b", "2"] and "--required-batch-size-multiple" in command
    assert (save / "eval" / "generate-test.txt").read_text().count("\nH-") == results["num_sentences"] == 40
    # Extra arguments overrode the config in the run that wrote the checkpoints.
    cfg = torch.load(save / "checkpoint_avg_last5.pt", weights_only=True)["cfg"]
    assert cfg["optimization"]["max_update"] == 10 and cfg["dataset"]["max_tokens"] == 256


@pytest.mark.parametrize("scale", ["demo", "multi30k", "multi30k-converged", "base"])
def test_no_table_config_names_a_device(scale):
    """reproduce_table.sh --device chooses (fairseq_rope/experiments/device.py): a config forcing
    --cpu would keep every row off the GPU."""
    for row in ROWS:
        argv = load_experiment(f"{row}_{scale}").argv()
        assert "--cpu" not in argv and not any(a.startswith("--device-id") for a in argv), (row, scale)
