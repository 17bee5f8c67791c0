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


def test_evaluate_with_ctranslate2_int8_writes_its_own_records(trained, deploy_data, exported, fairseq_model,
                                                               tmp_path):
    """``--quantization int8``: its export, decoding and results under eval-ctranslate2-int8/, the
    int8 model's own hypotheses; the records of fairseq and of the float32 export are untouched."""
    from fairseq_rope_serve.decoding import Decoding
    from fairseq_rope_serve.model_dir import ModelDirectory
    from tests.deploy.test_decoding import ct2_beams

    save_dir = tmp_path / "run"
    save_dir.mkdir()
    shutil.copy(trained("rope"), save_dir / "checkpoint_1_150.pt")
    for earlier in ("eval", "eval-ctranslate2"):
        (save_dir / earlier).mkdir()
        for name in ("results.json", "generate-test.txt", "hyps.tok.de", "run.json"):
            (save_dir / earlier / name).write_text(f"{earlier}/{name}\n")
    records = lambda: {p: p.read_bytes() for d in ("eval", "eval-ctranslate2") for p in (save_dir / d).rglob("*")}  # noqa: E731
    before = records()
    assert evaluate.main([str(save_dir), str(deploy_data / "data-bin"), "--engine", "ctranslate2",
                          "--quantization", "int8", "--num-checkpoints", "1", "--threads", "1"]) == 0
    assert records() == before

    eval_dir = save_dir / "eval-ctranslate2-int8"
    results = json.loads((eval_dir / "results.json").read_text())
    model_dir = eval_dir / "ctranslate2-int8"
    assert results["engine"]["name"] == "ctranslate2" and results["engine"]["quantization"] == "int8"
    assert results["engine"]["model_dir"] == str(model_dir.resolve())
    assert ModelDirectory.read(model_dir).quantization == "int8"
    # The int8 export's hypotheses, which differ from the float32 export's in some sentences.
    int8 = ct2_beams(exported, fairseq_model, "rope", Decoding(), "int8")
    float32 = ct2_beams(exported, fairseq_model, "rope", Decoding())
    assert any(a.tokens != b.tokens for a, b in zip(int8, float32))
    translations = {t.id: t.hypothesis for t in read_generate_output(eval_dir / "generate-test.txt")}
    assert translations == {i: " ".join(h.tokens).replace("@@ ", "") for i, h in enumerate(int8)}
    assert results["num_sentences"] == len(int8)


def test_scores_are_of_the_source_the_search_was_given(exported, fairseq_model, deploy_data, tmp_path):
    """An export whose position table is shorter than some test sources: the search is given them
    cut (fairseq_rope_serve.decoding), and the ``H-`` scores are of those cut sources, as fairseq's
    own forced decoding of the hypothesis given that source scores them."""
    from dataclasses import replace

    import torch

    from fairseq_rope.deploy.generate import generate
    from fairseq_rope_serve.model_dir import ModelDirectory
    from tests.deploy.conftest import source_subwords

    model_dir, bound = tmp_path / "model", 4
    shutil.copytree(exported("rope"), model_dir)
    replace(ModelDirectory.read(model_dir), max_source_positions=bound + 1).write(model_dir)  # and the EOS
    output = tmp_path / "generate-test.txt"
    with output.open("w", encoding="utf-8") as out:
        hypotheses = generate(model_dir, deploy_data / "data-bin", out)
    assert 0 < sum(h.source_truncated for h in hypotheses) < len(hypotheses)

    model, task, _ = fairseq_model("rope")
    source_dict, target_dict, sources = task.source_dictionary, task.target_dictionary, source_subwords(task)
    translations = read_generate_output(output)
    assert [t.id for t in translations] == list(range(len(hypotheses)))
    for t, hypothesis in zip(translations, hypotheses):
        source = torch.tensor([[source_dict.index(w) for w in sources[t.id][:bound]] + [source_dict.eos()]])
        target = torch.tensor([[target_dict.index(w) for w in hypothesis.tokens] + [target_dict.eos()]])
        previous = torch.cat([target[:, -1:], target[:, :-1]], dim=1)  # EOS first, as fairseq's decoder input
        with torch.no_grad():
            log_probs = model.get_normalized_probs(model(source, torch.tensor([source.size(1)]), previous),
                                                   log_probs=True)
        score = float(log_probs.gather(2, target.unsqueeze(2)).sum()) / target.size(1) ** 0.6
        assert math.isclose(t.score, score / math.log(2), abs_tol=1e-4), (t.id, hypothesis.source_truncated)
