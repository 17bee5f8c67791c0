"""fairseq-rope-translate: raw text in, detokenized translations out, from a model directory
alone; its text processing is the data preparation's, its translations fairseq's."""

from __future__ import annotations

import shutil

import torch

from fairseq_rope_serve.text import detokenize
from fairseq_rope_serve.translate import main
from fairseq_rope_serve.translator import TextTranslator
from tests.conftest import console_script


def test_source_processing_is_the_data_preparations(exported, deploy_data):
    """Raw test sentences become exactly the subwords fairseq-rope-prepare binarized."""
    model = TextTranslator(exported("rope"), threads=1)
    raw = (deploy_data / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    prepared = (deploy_data / "bpe" / "test.en").read_text(encoding="utf-8").splitlines()
    assert model.subwords(raw) == [line.split() for line in prepared]
    assert any("@@" in line for line in prepared)


def test_translate_command_end_to_end(exported, deploy_data, fairseq_model, fairseq_beams, tmp_path):
    """The command on raw text, from a copy of the model directory: fairseq's best hypotheses
    (its SequenceGenerator's), BPE removed and detokenized; an empty line stays one."""
    model_dir = tmp_path / "model"
    shutil.copytree(exported("rope"), model_dir)
    raw = (deploy_data / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    lines = [*raw[:5], "", *raw[5:]]
    (tmp_path / "in.en").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert console_script("fairseq-rope-translate")  # installed (in-process below: no second fairseq import)
    assert main([str(model_dir), "--input", str(tmp_path / "in.en"), "--output", str(tmp_path / "out.de"),
                 "--threads", "1", "--quiet"]) == 0
    translations = (tmp_path / "out.de").read_text(encoding="utf-8")
    _, task, _ = fairseq_model("rope")
    beams = fairseq_beams("rope")
    dictionary = task.target_dictionary
    expected = detokenize([dictionary.string(torch.tensor([dictionary.index(t) for t in beams[i][0]]), "@@ ")
                           for i in range(len(raw))], "de")
    assert translations.splitlines() == [*expected[:5], "", *expected[5:]]
    assert translations.splitlines()[0].endswith((".", "!", "?")) and " ." not in translations


def test_translate_refuses_a_directory_without_a_model(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path} is not a model directory written by fairseq-rope-export-ct2")
