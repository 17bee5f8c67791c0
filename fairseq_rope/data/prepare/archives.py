"""WMT release archives: download, verification by a full read, extraction, SGM unwrapping."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from tqdm import tqdm

from fairseq_rope.data.prepare.files import PrepareError


@dataclass(frozen=True)
class Archive:
    """A release archive (gzipped tar) and the members the pipeline needs from it."""

    filename: str
    url: str
    members: Sequence[str]


@dataclass(frozen=True)
class Part:
    """One parallel corpus inside an archive: a member per language.

    ``sgm`` marks WMT test sets, whose segments are wrapped in SGML markup.
    """

    archive: Archive
    members: Mapping[str, str]  # language -> member name
    sgm: bool = False


EUROPARL_V7 = Archive(
    "training-parallel-europarl-v7.tgz",
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    ("training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de"),
)
COMMONCRAWL = Archive(
    "training-parallel-commoncrawl.tgz",
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    ("commoncrawl.de-en.en", "commoncrawl.de-en.de"),
)
NEWS_COMMENTARY_V9 = Archive(
    "training-parallel-nc-v9.tgz",
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    ("training/news-commentary-v9.de-en.en", "training/news-commentary-v9.de-en.de"),
)
DEV = Archive("dev.tgz", "http://statmt.org/wmt14/dev.tgz", ("dev/newstest2013.en", "dev/newstest2013.de"))
TEST_FULL = Archive(
    "test-full.tgz",
    "http://statmt.org/wmt14/test-full.tgz",
    ("test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm"),
)

#: WMT14 En-De as split → corpora concatenated in this order.
WMT14_EN_DE: Dict[str, List[Part]] = {
    "train": [
        Part(a, {"en": a.members[0], "de": a.members[1]})
        for a in (EUROPARL_V7, COMMONCRAWL, NEWS_COMMENTARY_V9)
    ],
    "valid": [Part(DEV, {"en": DEV.members[0], "de": DEV.members[1]})],
    "test": [Part(TEST_FULL, {"en": TEST_FULL.members[0], "de": TEST_FULL.members[1]}, sgm=True)],
}
WMT14_ARCHIVES: List[Archive] = [EUROPARL_V7, COMMONCRAWL, NEWS_COMMENTARY_V9, DEV, TEST_FULL]

_READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


def download(url: str, dest: Path, timeout: float = 60.0) -> None:
    """Download ``url`` to ``dest`` (via ``dest.part``) with a progress bar."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            size = int(resp.headers.get("Content-Length") or 0) or None
            got = 0
            with open(part, "wb") as out, tqdm(
                total=size, desc=dest.name, unit="B", unit_scale=True, unit_divisor=1024
            ) as bar:
                while block := resp.read(1 << 20):
                    out.write(block)
                    got += len(block)
                    bar.update(len(block))
        if size is not None and got != size:
            raise OSError(f"connection closed after {got} of {size} bytes")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        raise PrepareError(
            f"could not download {url}: {exc}\n"
            f"Download it by other means and put it in {dest.parent} as {dest.name} (see --raw-dir)."
        ) from None
    os.replace(part, dest)


def ensure_archives(raw_dir: Path, archives: Sequence[Archive], offline: bool, log=print) -> Dict[str, Path]:
    """Return the local path of each archive, downloading the missing ones unless ``offline``."""
    paths = {a.filename: raw_dir / a.filename for a in archives}
    missing = [a for a in archives if not paths[a.filename].is_file()]
    if not missing:
        log(f"fetch: skip (all {len(archives)} archives are in {raw_dir})")
        return paths
    if offline:
        listing = "\n".join(f"  {paths[a.filename]}  <-  {a.url}" for a in missing)
        raise PrepareError(f"missing archives (and --offline forbids downloading them):\n{listing}")
    for archive in missing:
        log(f"fetch: downloading {archive.url}")
        download(archive.url, paths[archive.filename])
    return paths


def _member_name(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def scan_archive(path: Path, wanted: Mapping[str, Path]) -> Optional[str]:
    """Read the whole gzipped tar ``path`` and save the ``wanted`` members.

    ``wanted`` maps member names to destination files. Everything is read to
    the end, so a truncated or corrupt archive is caught (gzip CRC and length
    included) even if the wanted members come first. Returns an error message
    naming the file, or None. Runs in worker processes, hence no exception.
    """
    seen = set()
    try:
        with gzip.open(path, "rb") as gz:
            with tarfile.open(fileobj=gz, mode="r|") as tar:
                for member in tar:
                    name = _member_name(member.name)
                    src = tar.extractfile(member) if member.isfile() else None
                    if src is None:
                        continue
                    if name in wanted:
                        with open(wanted[name], "wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        seen.add(name)
                    else:
                        while src.read(1 << 20):
                            pass
            while gz.read(1 << 20):  # the tar end marker is not the end of the gzip stream
                pass
    except _READ_ERRORS as exc:
        return f"{path}: not a complete gzipped tar archive ({type(exc).__name__}: {exc})"
    missing = sorted(set(wanted) - seen)
    if missing:
        return f"{path}: archive lacks the expected member(s) {', '.join(missing)}"
    return None


_SEG = re.compile(r"<seg\b[^>]*>(.*?)</seg\s*>", re.DOTALL | re.IGNORECASE)
_ENTITY = re.compile(r"&(?:(amp|lt|gt|quot|apos)|#(\d+)|#[xX]([0-9a-fA-F]+));")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def xml_unescape(text: str) -> str:
    """Resolve the five XML entities and numeric character references, in one pass.

    Deliberately not :func:`html.unescape`: it also expands HTML names without
    a semicolon (``&copy`` → ©), which would corrupt raw ``&`` in real text.
    """

    def resolve(m: re.Match) -> str:
        name, dec, hexa = m.groups()
        if name:
            return _NAMED[name]
        code = int(dec) if dec else int(hexa, 16)
        return chr(code) if 0 < code <= 0x10FFFF else m.group(0)

    return _ENTITY.sub(resolve, text)


def unwrap_sgm(text: str) -> List[str]:
    """Segments of a WMT SGML file: the text of each ``<seg id=…>…</seg>``, unescaped.

    Whitespace inside a segment is collapsed, as sacreBLEU does when it reads SGM.
    """
    return [" ".join(xml_unescape(seg).split()) for seg in _SEG.findall(text)]
