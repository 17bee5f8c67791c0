"""Archive verification, extraction and the (network-free) download path."""

from __future__ import annotations

import tarfile

import pytest

from fairseq_rope.data.prepare.archives import (
    DEV,
    WMT14_ARCHIVES,
    WMT14_EN_DE,
    download,
    ensure_archives,
    scan_archive,
)
from fairseq_rope.data.prepare.files import PrepareError

from .conftest import write_tgz


def test_fixture_archives_have_the_real_layout(wmt14_archives):
    for archive in WMT14_ARCHIVES:
        with tarfile.open(wmt14_archives.archive(archive.filename), "r:gz") as tar:
            names = set(tar.getnames())
        assert set(archive.members) <= names
        assert len(names - set(archive.members)) >= 1  # decoys the extraction must skip
    assert [p.archive.filename for p in WMT14_EN_DE["train"]] == [
        "training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "training-parallel-nc-v9.tgz"]


def test_scan_archive_extracts_wanted_members(wmt14_archives, tmp_path):
    wanted = {DEV.members[0]: tmp_path / "en", DEV.members[1]: tmp_path / "de"}
    assert scan_archive(wmt14_archives.archive("dev.tgz"), wanted) is None
    assert (tmp_path / "en").read_text(encoding="utf-8").splitlines()[0] == wmt14_archives.valid[0][0]
    assert len((tmp_path / "de").read_bytes().split(b"\n")) == len(wmt14_archives.valid) + 1


@pytest.mark.parametrize("damage", ["truncated", "tail-cut", "not-gzip", "missing-member"])
def test_scan_archive_reports_bad_archives(wmt14_archives, tmp_path, damage):
    good = wmt14_archives.archive("dev.tgz").read_bytes()
    bad = tmp_path / "dev.tgz"
    if damage == "truncated":
        bad.write_bytes(good[: len(good) // 2])
    elif damage == "tail-cut":  # members complete, gzip trailer (CRC, length) gone
        bad.write_bytes(good[:-6])
    elif damage == "not-gzip":
        bad.write_bytes(b"<html><body>404 Not Found</body></html>\n")
    else:
        write_tgz(bad, {"dev/newstest2013.en": b"only one side\n"})
    wanted = {m: tmp_path / f"m{i}" for i, m in enumerate(DEV.members)}
    error = scan_archive(bad, wanted)
    assert error is not None and str(bad) in error
    expected = "lacks the expected member(s) dev/newstest2013.de" if damage == "missing-member" else "not a complete gzipped tar"
    assert expected in error


def test_download_from_url(tmp_path):
    src = tmp_path / "remote.tgz"
    src.write_bytes(b"x" * 3_000_000)
    dest = tmp_path / "raw" / "copy.tgz"
    download(src.as_uri(), dest)
    assert dest.read_bytes() == src.read_bytes()
    assert not (tmp_path / "raw" / "copy.tgz.part").exists()


def test_failed_download_names_url_and_raw_dir(tmp_path):
    url = (tmp_path / "nowhere.tgz").as_uri()
    with pytest.raises(PrepareError) as exc:
        download(url, tmp_path / "raw" / "dev.tgz")
    assert url in str(exc.value) and "--raw-dir" in str(exc.value) and str(tmp_path / "raw") in str(exc.value)
    assert not list((tmp_path / "raw").iterdir())


def test_offline_missing_archives_are_an_error_without_download(tmp_path):
    (tmp_path / "dev.tgz").write_bytes(b"present")
    with pytest.raises(PrepareError) as exc:
        ensure_archives(tmp_path, WMT14_ARCHIVES, offline=True, log=lambda _: None)
    message = str(exc.value)
    assert "test-full.tgz" in message and "http://statmt.org/wmt14/test-full.tgz" in message
    assert "dev.tgz" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.tgz"]
