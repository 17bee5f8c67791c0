"""The real fairseq CLIs and hub interface with --user-dir fairseq_rope, as subprocesses.

No environment-variable workarounds: checkpoints are read by torch's safe
(weights_only) loader, allowed only what fairseq checkpoints pickle.
"""

import os
import re
import subprocess
import sys

import torch

from fairseq_rope.checkpoints import load_checkpoint
from tests.conftest import BIN_DIR, REPO, TINY_TRAINING, TOY_LEXICON, fairseq_cli


def test_torch_loads_safely_by_default_here():
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 6), "these tests are meant to run under weights_only=True by default"


def test_generate_with_beam_4_and_lenpen_prints_bleu(toy_data_bin, trained_rope_checkpoint):
    out = fairseq_cli("fairseq-generate", [
        toy_data_bin, "--user-dir", "fairseq_rope", "--path", trained_rope_checkpoint,
        "--beam", "4", "--lenpen", "0.6", "--batch-size", "64", "--cpu",
    ])
    match = re.search(r"Generate test with beam=4: BLEU4 = ([\d.]+)", out.stdout + out.stderr)
    assert match, out.stdout[-2000:]
    # The toy task (reverse and translate word by word) is learned, not guessed.
    assert float(match.group(1)) > 50.0
    assert len(re.findall(r"^H-\d+\t", out.stdout, flags=re.M)) == 40


def run_interactive(data_bin, checkpoint, lines, cwd=REPO):
    result = subprocess.run(
        [str(BIN_DIR / "fairseq-interactive"), str(data_bin), "--user-dir", str(REPO / "fairseq_rope"),
         "--path", str(checkpoint), "--beam", "4", "--lenpen", "0.6", "--cpu",
         "--source-lang", "en", "--target-lang", "de"],
        input="".join(line + "\n" for line in lines), capture_output=True, text=True, cwd=cwd,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [line.split("\t")[2] for line in result.stdout.splitlines() if line.startswith("H-")]


def test_interactive_translates_from_any_directory(toy_data_bin, trained_rope_checkpoint, tmp_path):
    hyps = run_interactive(toy_data_bin, trained_rope_checkpoint, ["red house", "the old dog"], cwd=tmp_path)
    assert len(hyps) == 2
    assert hyps[0] == "haus rot"
    # An unknown word ("the"): the known ones still translated in reverse order, whatever the
    # model makes of it, and nothing outside the lexicon.
    assert hyps[1].split()[:2] == ["hund", "alt"]
    assert set(hyps[1].split()) <= set(TOY_LEXICON.values()) | {"<unk>"}


def test_hub_interface_translates_like_the_cli(toy_data_bin, trained_rope_checkpoint, tmp_path):
    script = (
        "import fairseq_rope\n"
        "from fairseq_rope.models.transformer_rope import TransformerRopeModel\n"
        f"m = TransformerRopeModel.from_pretrained({str(trained_rope_checkpoint.parent)!r}, "
        f"checkpoint_file='checkpoint_last.pt', data_name_or_path={str(toy_data_bin)!r}, "
        "source_lang='en', target_lang='de')\n"
        "print(m.translate('small cat car', beam=4, lenpen=0.6))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    hub = result.stdout.strip().splitlines()[-1]
    assert hub == run_interactive(toy_data_bin, trained_rope_checkpoint, ["small cat car"])[0]
    assert hub == "auto katze klein"


def test_tensorboard_logdir_writes_training_and_validation_events(trained_rope_checkpoint):
    """--tensorboard-logdir works with the [tensorboard] extra (part of [test])."""
    logdir = trained_rope_checkpoint.parent / "tensorboard"
    for subset in ("train", "valid"):
        events = list((logdir / subset).glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 100, subset


def test_restore_file_resumes_training_under_safe_loading(toy_data_bin, trained_rope_checkpoint, tmp_path):
    out = fairseq_cli("fairseq-train", [
        toy_data_bin, *TINY_TRAINING, "--restore-file", trained_rope_checkpoint,
        "--max-update", "245", "--save-dir", tmp_path, "--no-epoch-checkpoints",
    ])
    assert "Loaded checkpoint" in out.stdout + out.stderr
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 245


def test_base_architecture_trains_and_generates_through_the_cli(toy_data_bin, tmp_path):
    fairseq_cli("fairseq-train", [
        toy_data_bin, "--user-dir", "fairseq_rope", "--arch", "transformer_rope_wmt_en_de",
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "300",
        "--max-update", "1", "--save-dir", tmp_path, "--no-epoch-checkpoints",
        "--no-save-optimizer-state", "--cpu", "--no-progress-bar", "--disable-validation",
    ])
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    # This fairseq saves args as None and the configuration under cfg: the model's
    # options there are the parsed Namespace of an args-configured (legacy) model.
    model_cfg = state["cfg"]["model"]
    assert (model_cfg.arch, model_cfg._name) == ("transformer_rope_wmt_en_de", "transformer_rope_wmt_en_de")
    assert (model_cfg.encoder_layers, model_cfg.encoder_embed_dim, model_cfg.encoder_attention_heads) == (6, 512, 8)
    assert state["model"]["encoder.layers.5.self_attn.q_proj.weight"].shape == (512, 512)
    out = fairseq_cli("fairseq-generate", [
        toy_data_bin, "--user-dir", "fairseq_rope", "--path", tmp_path / "checkpoint_last.pt",
        "--beam", "4", "--lenpen", "0.6", "--max-len-b", "5", "--batch-size", "64", "--cpu",
    ])
    # One hypothesis per test sentence, of 1 to 5 tokens (--max-len-b 5), all of them scored:
    # BLEU's system and reference lengths are those of the H- and T- lines.
    hyps = {int(i): h.split() for i, h in re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", out.stdout, flags=re.M)}
    refs = {int(i): t.split() for i, t in re.findall(r"^T-(\d+)\t(.*)$", out.stdout, flags=re.M)}
    assert sorted(hyps) == sorted(refs) == list(range(40))
    assert all(1 <= len(h) <= 5 for h in hyps.values()), hyps
    bleu = re.search(r"BLEU4 = [\d.]+, [\d./]+ \(BP=[\d.]+, ratio=[\d.]+, syslen=(\d+), reflen=(\d+)\)", out.stdout)
    assert bleu, out.stdout[-2000:]
    assert (int(bleu[1]), int(bleu[2])) == (sum(map(len, hyps.values())), sum(map(len, refs.values())))
