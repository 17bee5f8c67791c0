"""Multi30k (task 1), English→German or English→French: the published files, their checksums,
and the import step.

Elliott et al. (2016), *Multi30K: Multilingual English-German Image
Descriptions*: 29,000 training, 1,014 validation and 1,000 test (``test2016``,
Flickr) English captions, true-cased and untokenized, translated line by line
into German and (Elliott et al. 2017, *Findings of the Second Shared Task on
Multimodal Machine Translation and Multilingual Image Description*) into French,
as released in the ``multi30k/dataset`` GitHub repository under
``data/task1/raw/`` (gzipped, one sentence a line). The captions derive from
Flickr30K and are for non-commercial research and education: they are
downloaded or read from a local copy (``--raw-dir``), never shipped with this
package.

A preparation takes one pair (``--tgt de`` or ``fr``): the English files and
the target's. The import step checks each of its six files' SHA-256 against the
published release and its line count, then decompresses the pairs into
``raw/{train,valid,test}.{en,TGT}`` (``raw/test.TGT``: the sacreBLEU reference).
Everything after that is the shared recipe of
:mod:`fairseq_rope.data.prepare.recipes`, whose Moses steps take the language
of each side.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

from fairseq_rope.data.prepare.archives import Archive
from fairseq_rope.base import decode_lines
from fairseq_rope.data.prepare.files import PrepareError, check_aligned, write_lines
from fairseq_rope.data.prepare.pipeline import Step, sha256_file
from fairseq_rope.data.prepare.recipes import Options

BASE_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
#: Joined BPE vocabulary of the recipe. 29k caption pairs hold ~20k word types
#: per side; a ~10k joint vocabulary (about 9.7k subword-nmt merges) keeps
#: frequent words whole and splits the long tail (German compounds, rare
#: nouns) into pieces each seen dozens of times, the usual size for this corpus.
DEFAULT_VOCAB_SIZE = 10000


@dataclass(frozen=True)
class ReleaseFile:
    """One gzipped file of the release: where it comes from and what it must be."""

    filename: str
    sha256: str
    lines: int

    @property
    def url(self) -> str:
        return f"{BASE_URL}/{self.filename}"

    @property
    def archive(self) -> Archive:
        """As an :class:`Archive` with no members, for the shared download logic."""
        return Archive(self.filename, self.url, ())


#: split -> language -> file, as published (commit a3d2e0d2 of multi30k/dataset, whose
#: SHA256 the repository lists for each file).
TASK1: Dict[str, Dict[str, ReleaseFile]] = {
    "train": {
        "en": ReleaseFile("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f", 29000),
        "de": ReleaseFile("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6", 29000),
        "fr": ReleaseFile("train.fr.gz", "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c", 29000),
    },
    "valid": {
        "en": ReleaseFile("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28", 1014),
        "de": ReleaseFile("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a", 1014),
        "fr": ReleaseFile("val.fr.gz", "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9", 1014),
    },
    "test": {
        "en": ReleaseFile("test_2016_flickr.en.gz",
                          "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9", 1000),
        "de": ReleaseFile("test_2016_flickr.de.gz",
                          "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8", 1000),
        "fr": ReleaseFile("test_2016_flickr.fr.gz",
                          "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90", 1000),
    },
}
SOURCE = "en"
#: The target languages of the release, the default first.
TARGETS = ("de", "fr")


Release = Mapping[str, Mapping[str, ReleaseFile]]


def language_pair(release: Release, tgt: str) -> Dict[str, Dict[str, ReleaseFile]]:
    """The files of the English→``tgt`` pair, split -> language -> file."""
    available = sorted(set.intersection(*(set(per_lang) for per_lang in release.values())) - {SOURCE})
    if tgt not in available:
        raise PrepareError(f"Multi30k has no English→{tgt} release; target languages: {', '.join(available)}")
    return {split: {SOURCE: per_lang[SOURCE], tgt: per_lang[tgt]} for split, per_lang in release.items()}


def release_files(release: Release = TASK1) -> List[ReleaseFile]:
    return [f for per_lang in release.values() for f in per_lang.values()]


def import_step(opts: Options, paths: Mapping[str, Path], release: Release) -> Step:
    """Verify the files of one pair (:func:`language_pair`: checksum, line count) and decompress
    them into raw/."""
    inputs = [paths[f.filename] for f in release_files(release)]
    spec = {split: {lang: [f.filename, f.sha256, f.lines] for lang, f in per_lang.items()}
            for split, per_lang in release.items()}
    return Step("import", partial(_import, opts, paths, release), opts.raw_outputs(), inputs,
                {"release": spec})


def _import(opts: Options, paths: Mapping[str, Path], release: Release, tmps: List[Path]) -> None:
    check_release(paths, release_files(release))
    out = dict(zip(opts.raw_outputs(), tmps))
    for split in opts.splits:
        counts = {}
        for lang in opts.langs:
            file = release[split][lang]
            counts[lang] = write_lines(out[opts.raw(split, lang)], _gz_lines(paths[file.filename]))
            if counts[lang] != file.lines:
                raise PrepareError(f"{paths[file.filename]}: {counts[lang]:,} lines, but the published "
                                   f"{file.filename} has {file.lines:,}; download it again from {file.url}")
        src_file, tgt_file = (paths[release[split][lang].filename] for lang in opts.langs)
        check_aligned(src_file, counts[opts.src], tgt_file, counts[opts.tgt])
        opts.log(f"  {split}: {counts[opts.src]:,} pairs from {release[split][opts.src].filename} "
                 f"/ {release[split][opts.tgt].filename}")


def check_release(paths: Mapping[str, Path], files: Sequence[ReleaseFile]) -> None:
    """One error listing every file whose SHA-256 is not the published one."""
    bad = []
    for file in files:
        got = sha256_file(paths[file.filename])
        if got != file.sha256:
            bad.append(f"  {paths[file.filename]}: SHA-256 {got}, expected {file.sha256}\n"
                       f"    (the published file: {file.url})")
    if bad:
        raise PrepareError("file(s) differ from the published Multi30k release:\n" + "\n".join(bad)
                           + "\nReplace them in the raw directory and rerun.")


def _gz_lines(path: Path):
    """The decoded lines of a gzipped UTF-8 file; a truncated file is an error naming it."""
    try:
        with gzip.open(path, "rb") as f:
            yield from decode_lines(f, str(path), strict=True)
    except (OSError, EOFError, zlib.error) as exc:
        raise PrepareError(f"{path}: not a complete gzip file ({exc})") from None
