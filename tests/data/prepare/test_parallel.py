"""The recipe for user-supplied parallel corpora."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict, Tuple

from fairseq_rope.data.prepare.files import read_lines

from .conftest import REPO, lopsided_pair, make_pairs, run_cli, write_parallel


def corpus(tmp_path: Path, n_train: int = 600):
    d = tmp_path / "corpus"
    train = make_pairs(n_train, seed=11, min_words=2, max_words=8)
    train[0] = lopsided_pair()
    return (write_parallel(d / "train", train, "en", "fr"), write_parallel(d / "dev", make_pairs(30, seed=12), "en", "fr"),
            write_parallel(d / "test", make_pairs(25, seed=13), "en", "fr"))


def test_default_vocabulary_is_capped_on_a_small_corpus(tmp_path):
    train, dev, test = corpus(tmp_path)
    out = tmp_path / "out"
    result = run_cli("parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
                     "--testpref", test, "--workers", 2, out)
    assert result.rc == 0, result.err
    merges = len((out / "bpe" / "codes").read_text().splitlines()) - 1
    assert 0 < merges < 37000
    assert f"subword-nmt: {merges:,} merge operations for a requested vocabulary of 37,000" in result.out
    dicts = [(out / "data-bin" / f"dict.{lang}.txt").read_bytes() for lang in ("en", "fr")]
    assert dicts[0] == dicts[1]
    size = len(dicts[0].decode().splitlines()) + 4
    assert re.search(rf"joined dictionary: {size:,} symbols", result.out)
    assert list(read_lines(out / "raw" / "test.fr")) == list(read_lines(f"{test}.fr"))
    assert len(list(read_lines(out / "bpe" / "train.clean.en"))) < 600  # the lopsided pair is gone
    assert "@-@" in (out / "tok" / "train.en").read_text(encoding="utf-8")
    for split in ("train", "valid", "test"):
        assert (out / "data-bin" / f"{split}.en-fr.fr.bin").exists()


def test_no_tokenize_and_optional_test_set(tmp_path):
    train, dev, _ = corpus(tmp_path, n_train=200)
    out = tmp_path / "out"
    result = run_cli("parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
                     "--no-tokenize", "--bpe", "sentencepiece", "--vocab-size", 100, "--workers", 1, out)
    assert result.rc == 0, result.err
    assert not (out / "tok").exists() and not (out / "raw" / "test.en").exists()
    assert "sentencepiece: 100 pieces" in result.out
    first = next(read_lines(out / "bpe" / "valid.en"))
    assert first.replace(" ", "").replace("\u2581", " ").strip() == next(read_lines(f"{dev}.en"))  # untokenized
    assert not (out / "data-bin" / "test.en-fr.en.bin").exists()
    assert (out / "data-bin" / "valid.en-fr.en.bin").exists()


def test_a_vocabulary_smaller_than_the_alphabet_fails_clearly(tmp_path):
    train, dev, test = corpus(tmp_path, n_train=40)
    result = run_cli("parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
                     "--vocab-size", 10, tmp_path / "out")
    assert result.rc == 1
    assert "subword-nmt learned no BPE merges for --vocab-size 10: the training text has" in result.err
    assert "choose a --vocab-size above" in result.err
    # The finished steps stay for a rerun to resume; the failed one left nothing.
    assert not (tmp_path / "out" / "bpe" / "codes").exists()
    assert not list((tmp_path / "out").rglob("*.tmp*"))


def test_misaligned_files_fail_naming_both(tmp_path):
    train, dev, test = corpus(tmp_path, n_train=40)
    Path(f"{dev}.fr").write_text("".join(f"ligne {i}\n" for i in range(29)), encoding="utf-8")
    result = run_cli("parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
                     "--testpref", test, tmp_path / "out")
    assert result.rc == 1
    assert f"misaligned parallel files: {dev}.en has 30 lines but {dev}.fr has 29 lines" in result.err
    assert not (tmp_path / "out").exists()  # nothing committed, no empty OUT_DIR left


def test_empty_and_non_utf8_files_fail_clearly(tmp_path):
    train, dev, test = corpus(tmp_path, n_train=40)
    args = ["parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
            "--testpref", test, tmp_path / "out"]
    Path(f"{test}.fr").write_bytes(b"")
    result = run_cli(*args)
    assert result.rc == 1 and f"{test}.fr: file is empty; every split needs at least one sentence pair" in result.err
    assert not (tmp_path / "out").exists()

    Path(f"{test}.fr").write_bytes(b"un\ndeux\n" + "trois \xe9t\xe9\n".encode("latin-1"))
    result = run_cli(*args)
    assert result.rc == 1 and re.search(rf"{re.escape(str(test))}\.fr: line 3 is not valid UTF-8 .*; "
                                         r"convert the file to UTF-8", result.err)
    assert not (tmp_path / "out").exists()

    Path(f"{test}.fr").unlink()
    result = run_cli(*args)
    assert result.rc == 1 and f"{test}.fr: no such file (inputs are PREFIX.LANG" in result.err
    assert not (tmp_path / "out").exists()

    Path(f"{test}.fr").mkdir()  # unreadable as a file
    result = run_cli(*args)
    assert result.rc == 1 and f"{test}.fr: is a directory, not a text file of sentences" in result.err
    assert not (tmp_path / "out").exists() and "Traceback" not in result.err


def snapshot(directory: Path) -> Dict[str, Tuple[int, bytes]]:
    """Every file under ``directory``: (mtime, contents), to show that nothing changed."""
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_finished_preparation_of_other_inputs_is_refused_unless_forced(tmp_path):
    train, dev, _ = corpus(tmp_path, n_train=40)
    out = tmp_path / "out"
    args = ["parallel", "--src", "en", "--tgt", "fr", "--trainpref", train, "--validpref", dev,
            "--vocab-size", 200, "--workers", 1, out]
    assert run_cli(*args).rc == 0
    rerun = run_cli(*args)  # the same command: every step skipped
    assert rerun.rc == 0 and "running" not in rerun.out
    before = snapshot(out)

    other_options = run_cli(*args[:-1], "--vocab-size", 150, out)
    assert other_options.rc == 1 and "step 'learn-bpe' would be redone" in other_options.err
    Path(f"{train}.en").write_text("".join(f"new line {i}\n" for i in range(40)), encoding="utf-8")
    result = run_cli(*args)
    assert result.rc == 1
    assert (f"error: {out} already holds a finished preparation made from other inputs or options "
            "(step 'import' would be redone") in result.err
    assert "pass --force to redo it" in result.err
    assert snapshot(out) == before  # not even the hash cache changed

    forced = run_cli(*args[:-1], "--force", out)
    assert forced.rc == 0, forced.err
    assert next(read_lines(out / "raw" / "train.en")) == "new line 0"


def test_shell_entry_point_reports_misalignment(tmp_path):
    train, dev, test = corpus(tmp_path, n_train=40)
    Path(f"{train}.fr").write_text("une seule ligne\n", encoding="utf-8")
    proc = subprocess.run(
        [str(REPO / "scripts" / "prepare_parallel.sh"), "--src", "en", "--tgt", "fr", "--trainpref", str(train),
         "--validpref", str(dev), "--testpref", str(test), "--workers", "1", "out"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert proc.returncode == 1
    assert f"error: misaligned parallel files: {train}.en has 40 lines but {train}.fr has 1 lines" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"→ {tmp_path / 'out'} " in proc.stdout  # a relative OUT_DIR is taken from the caller's directory
    assert not (tmp_path / "out").exists()  # the failed first run leaves no OUT_DIR behind
