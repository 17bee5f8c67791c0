"""The WMT14 recipe end to end on tiny archives in the real layout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fairseq_rope.data.prepare.files import read_lines
from fairseq_rope.data.prepare.text import keep_pair

from .conftest import REPO, TINY_VOCAB, run_cli, text_bytes, write_tgz

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")


def lines(path: Path):
    return list(read_lines(path))


def test_outputs_exist(wmt14_prepared):
    out, _ = wmt14_prepared
    for split in SPLITS:
        for lang in LANGS:
            for d in ("raw", "tok", "bpe"):
                assert (out / d / f"{split}.{lang}").stat().st_size > 0
            assert (out / "data-bin" / f"{split}.en-de.{lang}.bin").stat().st_size > 0
            assert (out / "data-bin" / f"{split}.en-de.{lang}.idx").exists()
    assert (out / "bpe" / "codes").read_text().startswith("#version")
    assert not list(out.rglob("*.tmp"))


def test_raw_text_and_sgm_unwrapping(wmt14_prepared, wmt14_archives):
    out, _ = wmt14_prepared
    fx = wmt14_archives
    for split, pairs in (("train", fx.train), ("valid", fx.valid)):
        assert lines(out / "raw" / f"{split}.en") == [s for s, _ in pairs]
        assert lines(out / "raw" / f"{split}.de") == [t for _, t in pairs]
    # SGM segments: whitespace collapsed, as sacreBLEU reads them
    assert lines(out / "raw" / "test.en") == [" ".join(s.split()) for s, _ in fx.test]
    assert lines(out / "raw" / "test.de") == [" ".join(t.split()) for _, t in fx.test]
    # the SGM segment with &amp; &quot; &lt; &gt; in the archive, unescaped
    ref = lines(out / "raw" / "test.de")
    assert ref[2] == "Die Gewinne von „AT&T“ stiegen <stark> & schnell."
    assert lines(out / "raw" / "test.en")[2] == 'Profits of "AT&T" rose <sharply> & fast.'
    assert not any("<seg" in line or "&amp;" in line for line in ref)


def test_tokenization(wmt14_prepared):
    out, _ = wmt14_prepared
    test_en = lines(out / "tok" / "test.en")
    assert test_en[2] == 'Profits of " AT & T " rose < sharply > & fast .'
    train_en = "\n".join(lines(out / "tok" / "train.en"))
    assert "@-@" in train_en  # aggressive hyphen splitting
    assert "\u200b" not in train_en and "\t" not in train_en and "\r" not in train_en
    assert "„" not in "\n".join(lines(out / "tok" / "train.de"))  # punctuation normalized


def test_bpe_applied_and_dictionary_joined(wmt14_prepared):
    out, result = wmt14_prepared
    for split in SPLITS:
        for lang in LANGS:
            bpe, tok = lines(out / "bpe" / f"{split}.{lang}"), lines(out / "tok" / f"{split}.{lang}")
            assert len(bpe) == len(tok)
            assert [line.replace("@@ ", "") for line in bpe] == tok  # BPE is lossless
    assert "@@ " in (out / "bpe" / "train.de").read_text(encoding="utf-8")
    dict_en, dict_de = (out / "data-bin" / f"dict.{lang}.txt" for lang in LANGS)
    assert dict_en.read_bytes() == dict_de.read_bytes()
    size = len(dict_en.read_text(encoding="utf-8").splitlines()) + 4  # + fairseq's special symbols
    assert re.search(rf"joined dictionary: {size:,} symbols", result.out)
    assert size <= TINY_VOCAB + 4 + 8  # characters + merges ≈ requested size (+ specials, padding)
    merges = len((out / "bpe" / "codes").read_text().splitlines()) - 1
    assert f"subword-nmt: {merges:,} merge operations" in result.out


def test_cleaning_limits_train_only(wmt14_prepared, wmt14_archives):
    out, result = wmt14_prepared
    src, tgt = lines(out / "bpe" / "train.en"), lines(out / "bpe" / "train.de")
    clean = list(zip(lines(out / "bpe" / "train.clean.en"), lines(out / "bpe" / "train.clean.de")))
    expected = [(s, t) for s, t in zip(src, tgt) if keep_pair(s, t)]
    assert clean == expected
    for s, t in clean:
        ns, nt = len(s.split()), len(t.split())
        assert 1 <= ns <= 250 and 1 <= nt <= 250 and ns <= 1.5 * nt and nt <= 1.5 * ns
    for i in wmt14_archives.bad_train:  # the inserted long, lopsided and half-empty pairs
        assert not keep_pair(src[i], tgt[i])
    assert len(clean) <= len(src) - len(wmt14_archives.bad_train)
    assert f"kept {len(clean):,} of {len(src):,} training pairs" in result.out
    # valid and test keep every line, including pairs cleaning would drop
    for split, n in (("valid", len(wmt14_archives.valid)), ("test", len(wmt14_archives.test))):
        for lang in LANGS:
            assert len(lines(out / "bpe" / f"{split}.{lang}")) == n
    assert (len(wmt14_archives.valid), len(wmt14_archives.test)) == (50, 53)
    assert max(len(line.split()) for line in lines(out / "bpe" / "test.en")) > 250
    log = (out / "data-bin" / "preprocess.log").read_text()
    assert f"test.en: {len(wmt14_archives.test)} sents" in log and f"train.clean.de: {len(clean)} sents" in log


def test_rerun_is_a_noop(wmt14_prepared, wmt14_archives):
    out, _ = wmt14_prepared
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    result = run_cli("wmt14", "--raw-dir", wmt14_archives.raw_dir, "--offline", "--vocab-size", TINY_VOCAB,
                     "--workers", 1, out)
    assert result.rc == 0, result.err
    steps = [line for line in result.out.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert len(steps) == 16 and all(line.endswith("skip (done)") for line in steps)
    assert "fetch: skip" in result.out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_output_is_independent_of_worker_count(wmt14_prepared, wmt14_archives, tmp_path):
    out, _ = wmt14_prepared
    result = run_cli("wmt14", "--raw-dir", wmt14_archives.raw_dir, "--offline", "--vocab-size", TINY_VOCAB,
                     "--workers", 1, tmp_path)
    assert result.rc == 0, result.err
    for rel in ["bpe/codes", *(f"{d}/{s}.{lang}" for d in ("tok", "bpe") for s in SPLITS for lang in LANGS),
                "data-bin/dict.en.txt", "data-bin/train.en-de.de.bin", "data-bin/test.en-de.en.idx"]:
        assert (tmp_path / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_changed_option_redoes_only_downstream_steps(wmt14_archives, wmt14_prepared, tmp_path):
    out, _ = wmt14_prepared
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    result = run_cli("wmt14", "--raw-dir", wmt14_archives.raw_dir, "--offline", "--vocab-size", 150,
                     "--workers", 2, "--force", tmp_path / "out")
    assert result.rc == 0, result.err
    ran = [m.group(1) for m in re.finditer(r"\] (\S+(?: \S+)?): running", result.out)]
    assert ran[0] == "learn-bpe" and "extract" not in ran and not any(r.startswith("tokenize") for r in ran)
    assert ran[-1] == "binarize"


def _copy_archives(fx, dest: Path) -> Path:
    shutil.copytree(fx.raw_dir, dest)
    return dest


def test_truncated_archive_fails_naming_the_file(wmt14_archives, tmp_path):
    raw = _copy_archives(wmt14_archives, tmp_path / "raw")
    bad = raw / "training-parallel-commoncrawl.tgz"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    result = run_cli("wmt14", "--raw-dir", raw, "--offline", "--vocab-size", TINY_VOCAB, tmp_path / "out")
    assert result.rc == 1
    assert "error: bad archive(s):" in result.err
    assert str(bad) in result.err and "not a complete gzipped tar" in result.err
    assert "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz" in result.err
    assert "europarl" not in result.err  # only the bad one is named
    assert not (tmp_path / "out").exists()  # nothing extracted, no empty OUT_DIR left


@pytest.mark.parametrize("de_lines, message", [
    (49, "misaligned parallel files: dev.tgz:dev/newstest2013.en has 50 lines but "
         "dev.tgz:dev/newstest2013.de has 49 lines"),
    (0, "dev.tgz:dev/newstest2013.en: no text in this member"),
])
def test_misaligned_or_empty_archive_members_fail_naming_them(wmt14_archives, tmp_path, de_lines, message):
    raw = _copy_archives(wmt14_archives, tmp_path / "raw")
    en = [] if de_lines == 0 else [s for s, _ in wmt14_archives.valid]
    write_tgz(raw / "dev.tgz", {"dev/newstest2013.en": text_bytes(en),
                                "dev/newstest2013.de": text_bytes(t for _, t in wmt14_archives.valid[:de_lines])})
    result = run_cli("wmt14", "--raw-dir", raw, "--offline", "--workers", 1, tmp_path / "out")
    assert result.rc == 1 and f"error: {message}" in result.err
    assert not (tmp_path / "out").exists()


def test_missing_archive_offline_fails_without_downloading(wmt14_archives, tmp_path):
    raw = _copy_archives(wmt14_archives, tmp_path / "raw")
    (raw / "dev.tgz").unlink()
    result = run_cli("wmt14", "--raw-dir", raw, "--offline", tmp_path / "out")
    assert result.rc == 1
    assert "missing archives" in result.err and "http://statmt.org/wmt14/dev.tgz" in result.err
    assert not (raw / "dev.tgz").exists() and not (raw / "dev.tgz.part").exists()
    assert not (tmp_path / "out").exists()


def test_shell_entry_point_with_sentencepiece(wmt14_archives, tmp_path):
    """prepare_wmt14_en_de.sh from another directory, SentencePiece with a tiny vocabulary."""
    out = tmp_path / "spm-out"
    proc = subprocess.run(
        [str(REPO / "scripts" / "prepare_wmt14_en_de.sh"), "--raw-dir", str(wmt14_archives.raw_dir), "--offline",
         "--bpe", "sentencepiece", "--vocab-size", "120", "--workers", "2", str(out)],
        cwd=tmp_path, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHON"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "bpe" / "spm.model").exists() and (out / "bpe" / "spm.vocab").exists()
    assert not (out / "bpe" / "codes").exists()
    assert len((out / "bpe" / "spm.vocab").read_text(encoding="utf-8").splitlines()) == 120
    assert "sentencepiece: 120 pieces" in proc.stdout
    for split in SPLITS:
        for lang in LANGS:
            seg = lines(out / "bpe" / f"{split}.{lang}")
            tok = lines(out / "tok" / f"{split}.{lang}")
            decoded = [line.replace(" ", "").replace("\u2581", " ").strip() for line in seg]
            if split == "test":  # "<" and ">" never occur in training: unknown to the model
                assert decoded[2].split() == [w if w not in "<>" else "<unk>" for w in tok[2].split()]
                decoded[2] = tok[2]
            assert decoded == tok
    assert "\u2581" in (out / "bpe" / "train.de").read_text(encoding="utf-8")
    dicts = [(out / "data-bin" / f"dict.{lang}.txt").read_bytes() for lang in LANGS]
    assert dicts[0] == dicts[1]
    size = len(dicts[0].decode().splitlines()) + 4
    assert f"joined dictionary: {size:,} symbols" in proc.stdout
    assert size <= 120 + 4 + 8
