"""The Multi30k recipe, on tiny gzipped files of the release's layout (never the real captions)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest
import sacremoses

from fairseq_rope.data.prepare import archives, multi30k
from fairseq_rope.data.prepare.files import read_lines
from fairseq_rope.data.prepare.multi30k import ReleaseFile

from .conftest import TINY_VOCAB, french, run_cli, write_multi30k_release


@pytest.fixture
def release(tmp_path, monkeypatch):
    table, pairs = write_multi30k_release(tmp_path / "raw")
    monkeypatch.setattr(multi30k, "TASK1", table)
    return tmp_path / "raw", pairs


def prepare(raw_dir: Path, out: Path, *extra: object):
    return run_cli("multi30k", "--raw-dir", raw_dir, "--offline", "--vocab-size", TINY_VOCAB,
                   "--workers", 1, *extra, out)


def test_the_real_release_is_described_by_its_published_checksums_and_counts():
    files = multi30k.release_files()
    assert sorted(f.filename for f in files) == sorted(
        f"{stem}.{lang}.gz" for stem in ("train", "val", "test_2016_flickr") for lang in ("en", "de", "fr"))
    for lang in ("en", "de", "fr"):  # the same captions, line by line, in every language
        assert [multi30k.TASK1[s][lang].lines for s in ("train", "valid", "test")] == [29000, 1014, 1000]
    assert all(len(f.sha256) == 64 for f in files) and len({f.sha256 for f in files}) == 9
    assert multi30k.TASK1["test"]["fr"].url == (
        "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2016_flickr.fr.gz")
    assert multi30k.TARGETS == ("de", "fr")  # de first: the default pair


def test_a_pair_takes_the_english_files_and_its_targets_only():
    french_pair = multi30k.language_pair(multi30k.TASK1, "fr")
    assert {split: sorted(files) for split, files in french_pair.items()} == {
        split: ["en", "fr"] for split in ("train", "valid", "test")}
    assert french_pair["valid"]["fr"].filename == "val.fr.gz"
    with pytest.raises(multi30k.PrepareError, match="no English→cs release; target languages: de, fr"):
        multi30k.language_pair(multi30k.TASK1, "cs")


def test_prepares_english_french_with_french_moses_settings(release, tmp_path):
    """--tgt fr: raw/test.fr is the reference, data-bin is en-fr, and each side is tokenized in
    its own language (French splits an elision after its apostrophe; English before it)."""
    raw_dir, pairs = release
    for german in raw_dir.glob("*.de.gz"):  # a French preparation needs no German file
        german.unlink()
    out = tmp_path / "out"
    result = prepare(raw_dir, out, "--tgt", "fr")
    assert result.rc == 0, result.err
    assert "Multi30k en-fr" in result.out and "test: 25 pairs from test_2016_flickr.en.gz / test_2016_flickr.fr.gz" in result.out
    assert list(read_lines(out / "raw" / "test.fr")) == [french(de) for _, de in pairs["test"]]
    assert not (out / "raw" / "test.de").exists()
    tokenized = list(read_lines(out / "tok" / "test.fr"))
    assert all(line.startswith("L' homme ") for line in tokenized)
    assert sacremoses.MosesTokenizer(lang="en").tokenize("L'homme", return_str=True, escape=False) == "L 'homme"  # not French
    for split in ("train", "valid", "test"):
        assert (out / "data-bin" / f"{split}.en-fr.fr.bin").is_file()
    assert (out / "data-bin" / "dict.fr.txt").read_bytes() == (out / "data-bin" / "dict.en.txt").read_bytes()


def test_a_french_file_that_differs_from_the_release_is_refused_naming_it(release, tmp_path):
    raw_dir, _ = release
    bad = raw_dir / "test_2016_flickr.fr.gz"
    bad.write_bytes(gzip.compress(b"Une autre phrase.\n" * 25, mtime=0))
    assert prepare(raw_dir, tmp_path / "de").rc == 0  # not a file of the German pair
    result = prepare(raw_dir, tmp_path / "fr", "--tgt", "fr")
    assert result.rc == 1
    assert str(bad) in result.err and multi30k.TASK1["test"]["fr"].url in result.err


def test_prepares_every_pair_with_raw_references_and_a_joined_dictionary(release, tmp_path):
    raw_dir, pairs = release
    out = tmp_path / "out"
    result = prepare(raw_dir, out)
    assert result.rc == 0, result.err
    for split in ("train", "valid", "test"):
        assert list(read_lines(out / "raw" / f"{split}.de")) == [de for _, de in pairs[split]]
    assert not (out / "bpe" / "train.clean.en").exists()  # curated: no cleaning
    train_bpe = list(read_lines(out / "bpe" / "train.en"))
    assert len(train_bpe) == 300  # the lopsided pair too
    dicts = [(out / "data-bin" / f"dict.{lang}.txt").read_bytes() for lang in ("en", "de")]
    assert dicts[0] == dicts[1]
    for split in ("train", "valid", "test"):
        assert (out / "data-bin" / f"{split}.en-de.de.bin").is_file()
    assert "Multi30k en-de" in result.out and "test: 25 pairs from test_2016_flickr.en.gz" in result.out

    again = prepare(raw_dir, out)  # a rerun skips every step
    assert again.rc == 0 and "running" not in again.out


def test_default_vocabulary_is_sized_for_the_corpus():
    parser_args = ["multi30k", "out"]
    from fairseq_rope.data.prepare.cli import build_parser

    assert build_parser().parse_args(parser_args).vocab_size is None  # resolved per recipe
    assert multi30k.DEFAULT_VOCAB_SIZE == 10000


def test_a_file_that_differs_from_the_release_is_refused_naming_it(release, tmp_path):
    raw_dir, _ = release
    bad = raw_dir / "val.de.gz"
    bad.write_bytes(gzip.compress(b"Ein anderer Satz.\n" * 30, mtime=0))
    out = tmp_path / "out"
    result = prepare(raw_dir, out)
    assert result.rc == 1
    assert str(bad) in result.err and "differ from the published Multi30k release" in result.err
    assert multi30k.TASK1["valid"]["de"].url in result.err
    assert not out.exists()  # nothing left behind


def test_a_wrong_line_count_is_refused(release, tmp_path, monkeypatch):
    raw_dir, _ = release
    table = {split: dict(files) for split, files in multi30k.TASK1.items()}
    stale = table["test"]["en"]
    table["test"]["en"] = ReleaseFile(stale.filename, stale.sha256, stale.lines + 1)
    monkeypatch.setattr(multi30k, "TASK1", table)
    result = prepare(raw_dir, tmp_path / "out")
    assert result.rc == 1
    assert "25 lines, but the published test_2016_flickr.en.gz has 26" in result.err


def test_a_truncated_gzip_is_an_error_naming_it(release, tmp_path, monkeypatch):
    raw_dir, _ = release
    path = raw_dir / "train.en.gz"
    path.write_bytes(path.read_bytes()[:-20])
    table = {split: dict(files) for split, files in multi30k.TASK1.items()}
    table["train"]["en"] = ReleaseFile(path.name, hashlib.sha256(path.read_bytes()).hexdigest(), 300)
    monkeypatch.setattr(multi30k, "TASK1", table)
    result = prepare(raw_dir, tmp_path / "out")
    assert result.rc == 1 and f"{path}: not a complete gzip file" in result.err


def test_offline_without_the_files_lists_what_to_download(tmp_path):
    result = run_cli("multi30k", "--raw-dir", tmp_path / "empty", "--offline", tmp_path / "out")
    assert result.rc == 1
    assert "https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.en.gz" in result.err


def test_missing_files_are_downloaded_from_the_release(release, tmp_path, monkeypatch):
    raw_dir, _ = release
    fetched = []

    def fake_download(url: str, dest: Path, timeout: float = 60.0) -> None:
        fetched.append(url)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(raw_dir / Path(url).name, dest)

    monkeypatch.setattr(archives, "download", fake_download)
    out = tmp_path / "out"
    result = run_cli("multi30k", "--vocab-size", TINY_VOCAB, "--workers", 1, out)  # no --raw-dir: OUT/orig
    assert result.rc == 0, result.err
    # The default pair's files only: no French file is fetched for English-German.
    assert sorted(fetched) == sorted(f.url for f in multi30k.release_files(multi30k.language_pair(multi30k.TASK1, "de")))
    assert (out / "orig" / "train.de.gz").is_file()
