"""fairseq-rope-translate: raw text in, detokenized translations out, from a model directory
alone; its text processing is the data preparation's, its translations fairseq's."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from argparse import Namespace
from typing import Dict

import fairseq_rope_serve.translator as translator_module
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


def test_translate_command_end_to_end(exported, deploy_data, fairseq_translations, tmp_path):
    """The command on raw text, from a copy of the model directory: fairseq's best hypotheses
    (its SequenceGenerator's), BPE removed and detokenized; an empty line stays one."""
    model_dir = tmp_path / "model"
    shutil.copytree(exported("rope"), model_dir)
    raw = (deploy_data / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    lines = [*raw[:5], "", *raw[5:]]
    (tmp_path / "in.en").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main([str(model_dir), "--input", str(tmp_path / "in.en"), "--output", str(tmp_path / "out.de"),
                 "--threads", "1", "--quiet"]) == 0
    translations = (tmp_path / "out.de").read_text(encoding="utf-8")
    expected = fairseq_translations("rope")
    assert translations.splitlines() == [*expected[:5], "", *expected[5:]]
    assert translations.splitlines()[0].endswith((".", "!", "?")) and " ." not in translations


#: CTranslate2 masks <pad> and EOS before its softmax, fairseq after (docs/deploy.md): that can
#: flip fairseq's best two where they are all but tied (seen: 7e-6 apart, beam 2, a looping toy model).
NEAR_TIE = 1e-3


def fairseq_near_ties(fairseq_model, row: str, **settings) -> Dict[int, str]:
    """id → fairseq's second-best translation where its score is within :data:`NEAR_TIE` of the
    best's (BPE removed, detokenized as the command does), at ``settings``."""
    from sacremoses import MosesDetokenizer

    from .conftest import TABLE, one_thread

    model, task, _ = fairseq_model(row)
    generator = task.build_generator([model], Namespace(**{**TABLE, **settings, "nbest": 2}))
    batches = task.get_batch_iterator(task.dataset("test"), max_tokens=120, required_batch_size_multiple=1)
    detokenizer, ties = MosesDetokenizer(lang="de"), {}
    with one_thread():
        for sample in batches.next_epoch_itr(shuffle=False):
            for sid, (best, second) in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                if abs(float(best["score"]) - float(second["score"])) < NEAR_TIE:
                    text = task.target_dictionary.string(second["tokens"][:-1], "@@ ")
                    ties[sid] = detokenizer.detokenize(text.split())
    return ties


def test_translate_as_documented_stdin_to_stdout_with_decoding_options(exported, deploy_data, fairseq_translations,
                                                                        fairseq_model):
    """``fairseq-rope-translate MODEL_DIR --beam 2 --lenpen 1.0 --batch-size 5 < in > out``, the
    installed command in its own process: fairseq's translations at that beam and penalty (which
    differ from the defaults' on some sentence; where fairseq's best two are near-tied, either),
    the same whatever the batch size."""
    raw = (deploy_data / "raw" / "test.en").read_text(encoding="utf-8")
    expected = fairseq_translations("rope", beam=2, lenpen=1.0)
    assert expected != fairseq_translations("rope")  # the options matter on this test set
    ties = fairseq_near_ties(fairseq_model, "rope", beam=2, lenpen=1.0)
    assert len(ties) <= 2  # near-ties are rare: the comparison stays exact almost everywhere
    outputs = []
    for batch_size in ("5", "64"):
        result = subprocess.run([console_script("fairseq-rope-translate"), str(exported("rope")), "--beam", "2",
                                 "--lenpen", "1.0", "--batch-size", batch_size, "--threads", "1"],
                                input=raw.encode(), capture_output=True, check=True)
        outputs.append(result.stdout.decode().splitlines())
        differ = [i for i, (got, want) in enumerate(zip(outputs[-1], expected)) if got != want]
        assert len(outputs[-1]) == len(expected) and all(outputs[-1][i] == ties.get(i) for i in differ), batch_size
    assert outputs[0] == outputs[1]


def test_a_line_that_is_not_utf8_is_an_error_naming_it(exported, capsysbinary, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Good morning.\nbad \xff byte\n")))
    assert main([str(exported("rope")), "--threads", "1"]) == 1
    out, err = capsysbinary.readouterr()
    assert err.decode() == ("error: <stdin>: line 2 is not valid UTF-8 (invalid start byte at byte 4); convert the "
                            "file to UTF-8 (e.g. iconv -f latin1 -t utf-8)\n")
    assert out == b""  # nothing of the first chunk: it holds the bad line


def test_input_longer_than_a_chunk(exported, deploy_data, fairseq_translations, capsys, monkeypatch):
    """Chunks of 7 lines over the 48 of the test set (the last one partial): every line
    translated once, in order, as fairseq translates it."""
    monkeypatch.setattr(translator_module, "CHUNK_LINES", 7)
    raw = (deploy_data / "raw" / "test.en").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    chunks = []
    translate = TextTranslator.translate
    monkeypatch.setattr(TextTranslator, "translate", lambda self, lines: chunks.append(len(lines)) or
                        translate(self, lines))
    assert main([str(exported("rope")), "--threads", "1", "--quiet"]) == 0
    expected = fairseq_translations("rope")
    assert chunks == [7] * 6 + [6] and len(expected) == 48
    assert capsys.readouterr().out.splitlines() == expected


def test_without_ctranslate2_the_error_says_what_to_install(exported, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 → ImportError
    assert main([str(exported("rope"))]) == 1
    assert capsys.readouterr().err == ("error: CTranslate2 is not installed: pip install 'ctranslate2>=4.6.3,<5' "
                                       "(a dependency of fairseq-rope-serve, which fairseq-rope installs)\n")


def test_translate_refuses_a_directory_without_a_model(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path} is not a model directory written by fairseq-rope-export-ct2")
