"""A binarized subset decoded with CTranslate2 in fairseq-generate's format, and
``fairseq-rope-evaluate --engine ctranslate2``: the same scoring, the engine on record."""

from __future__ import annotations

import json
import math
import shutil

from fairseq_rope.evaluation import evaluate
from fairseq_rope.evaluation.scoring import read_generate_output


def test_evaluate_with_ctranslate2(trained, deploy_data, fairseq_model, fairseq_beams, tmp_path):
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    shutil.copy(trained("rope"), save_dir / "checkpoint_1_150.pt")
    data_bin = deploy_data / "data-bin"
    assert evaluate.main([str(save_dir), str(data_bin), "--engine", "ctranslate2", "--num-checkpoints", "1",
                          "--threads", "1"]) == 0
    eval_dir = save_dir / "eval-ctranslate2"
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["engine"]["name"] == "ctranslate2" and results["engine"]["quantization"] == "float32"
    assert results["decoding"]["beam"] == 4 and results["decoding"]["lenpen"] == 0.6
    assert results["sacrebleu"] is not None and results["runaways"]["at_length_limit"] == 0

    # fairseq's own hypotheses (BPE removed as --remove-bpe does) and scores (base 2).
    _, task, _ = fairseq_model("rope")
    beams = fairseq_beams("rope")
    translations = read_generate_output(eval_dir / "generate-test.txt")
    assert len(translations) == len(beams) == results["num_sentences"]
    for t in translations:
        tokens, score = beams[t.id]
        assert t.hypothesis == " ".join(tokens).replace("@@ ", "")
        assert math.isclose(t.score, score / math.log(2), abs_tol=1e-4)  # the model's own, not renormalised
        assert t.subwords == len(tokens)
    hyps = (eval_dir / "hyps.tok.de").read_text().splitlines()
    assert hyps == [t.hypothesis for t in translations]
    assert (eval_dir / "ctranslate2" / "model.bin").is_file()
