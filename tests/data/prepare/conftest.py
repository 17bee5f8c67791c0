"""Fixtures for the data-preparation tests: tiny WMT14 archives in the real layout.

The archives have the member names of the real releases (plus decoy members of
other language pairs), SGM test files with ``<srcset>/<doc>/<seg id=…>``
wrappers and XML entities, and training pairs that cleaning must drop.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import tarfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from fairseq_rope.data.prepare import cli
from fairseq_rope.data.prepare.multi30k import ReleaseFile


REPO = Path(__file__).resolve().parents[3]

Pair = Tuple[str, str]

# A bilingual lexicon with shared stems, so BPE has something to merge.
LEXICON = [
    ("house", "Haus"), ("houses", "Häuser"), ("the", "das"), ("old", "alte"), ("new", "neue"),
    ("government", "Regierung"), ("governments", "Regierungen"), ("parliament", "Parlament"),
    ("european", "europäische"), ("commission", "Kommission"), ("member", "Mitglied"),
    ("states", "Staaten"), ("market", "Markt"), ("markets", "Märkte"), ("economic", "wirtschaftliche"),
    ("policy", "Politik"), ("people", "Menschen"), ("city", "Stadt"), ("cities", "Städte"),
    ("report", "Bericht"), ("reports", "Berichte"), ("important", "wichtige"), ("we", "wir"),
    ("must", "müssen"), ("support", "unterstützen"), ("believe", "glauben"), ("today", "heute"),
    ("and", "und"), ("with", "mit"), ("for", "für"), ("of", "von"), ("very", "sehr"),
    ("state-of-the-art", "hochmoderne"), ("well-known", "bekannte"), ("president", "Präsident"),
    ("question", "Frage"), ("questions", "Fragen"), ("freedom", "Freiheit"), ("security", "Sicherheit"),
]


def sentence_pair(rng: random.Random, n_words: int) -> Pair:
    """A pseudo-translation: aligned words, varied punctuation, the odd special character."""
    idx = [rng.randrange(len(LEXICON)) for _ in range(n_words)]
    en = [LEXICON[i][0] for i in idx]
    de = [LEXICON[i][1] for i in reversed(idx)]
    en[0], de[0] = en[0].capitalize(), de[0][0].upper() + de[0][1:]
    end = rng.choice([".", "?", "!", "..."])
    src, tgt = " ".join(en) + end, " ".join(de) + end
    roll = rng.random()
    if roll < 0.1:  # quotes: German ones are normalized to ASCII
        src, tgt = f'"{src}"', f"„{tgt}“"
    elif roll < 0.15:  # a zero-width space (Cf) and a tab: removed as non-printing
        src, tgt = src.replace(" ", "\u200b ", 1), tgt.replace(" ", "\t", 1)
    elif roll < 0.2:
        src, tgt = src.replace(" ", " & ", 1), tgt.replace(" ", " & ", 1)
    return src, tgt


def make_pairs(n: int, seed: int, min_words: int = 3, max_words: int = 12) -> List[Pair]:
    rng = random.Random(seed)
    return [sentence_pair(rng, rng.randint(min_words, max_words)) for _ in range(n)]


def long_pair(n_words: int = 300) -> Pair:
    rng = random.Random(n_words)
    return sentence_pair(rng, n_words)


def lopsided_pair() -> Pair:
    """Two English words against twenty German ones: length ratio far above 1.5."""
    rng = random.Random(7)
    src, _ = sentence_pair(rng, 2)
    _, tgt = sentence_pair(rng, 20)
    return src.replace('"', ""), tgt


def text_bytes(lines: Sequence[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_400_000_000
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    tar.addfile(info)


def write_tgz(path: Path, members: Dict[str, bytes], dirs: Sequence[str] = ()) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for d in dirs:
            add_dir(tar, d)
        for name, data in members.items():
            add_member(tar, name, data)
    return path


def xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def sgm(kind: str, lang: str, docs: Sequence[Sequence[str]]) -> bytes:
    """A WMT14-style SGM file; ``docs`` are the segment texts (unescaped) per document."""
    if kind == "src":
        out = ['<srcset setid="newstest2014" srclang="any">']
    else:
        out = [f'<refset setid="newstest2014" srclang="any" trglang="{lang}">']
    for d, segs in enumerate(docs):
        out.append(f'<doc sysid="ref" docid="{1000 + d}-test" genre="news" origlang="en">')
        out.append("<p>")
        out += [f'<seg id="{i}">{xml_escape(s)}</seg>' for i, s in enumerate(segs, start=1)]
        out += ["</p>", "</doc>"]
    out.append("</srcset>" if kind == "src" else "</refset>")
    return text_bytes(out)


@dataclass
class Wmt14Fixture:
    """Tiny WMT14 release archives and what they contain."""

    raw_dir: Path
    train: List[Pair]
    valid: List[Pair]
    test: List[Pair]
    bad_train: List[int] = field(default_factory=list)  # indices into ``train`` cleaning must drop

    def archive(self, name: str) -> Path:
        return self.raw_dir / name


def build_wmt14_archives(raw_dir: Path) -> Wmt14Fixture:
    """Write the five WMT14 archives (a few hundred pairs) in the real layout to ``raw_dir``."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    europarl = make_pairs(150, seed=1)
    commoncrawl = make_pairs(120, seed=2)
    nc = make_pairs(80, seed=3)
    # pairs that clean-corpus-n must drop: too long, lopsided, an empty side
    europarl[10] = long_pair(300)
    europarl[20] = lopsided_pair()
    commoncrawl[5] = ("", "Ein Satz ohne Übersetzung.")
    commoncrawl[6] = lopsided_pair()[::-1]
    commoncrawl[7] = ("A line with a lone\rcarriage return.", "Eine Zeile mit einem\rWagenrücklauf.")
    bad = [10, 20, len(europarl) + 5, len(europarl) + 6]
    valid = make_pairs(50, seed=4)
    valid[3] = lopsided_pair()  # valid and test are never cleaned
    test_docs = [make_pairs(n, seed=5 + d) for d, n in enumerate((20, 18, 15))]
    test_docs[0][2] = ('Profits of "AT&T" rose <sharply> & fast.', "Die Gewinne von „AT&T“ stiegen <stark> & schnell.")
    test_docs[1][4] = long_pair(280)

    decoy = text_bytes(["Ceci n'est pas de l'allemand."])
    write_tgz(raw_dir / "training-parallel-europarl-v7.tgz", {
        "training/europarl-v7.fr-en.fr": decoy,
        "training/europarl-v7.de-en.de": text_bytes(t for _, t in europarl),
        "training/europarl-v7.de-en.en": text_bytes(s for s, _ in europarl),
        "training/europarl-v7.fr-en.en": decoy,
    }, dirs=["training"])
    write_tgz(raw_dir / "training-parallel-commoncrawl.tgz", {
        "commoncrawl.de-en.annotation": text_bytes(["x"] * len(commoncrawl)),
        "commoncrawl.de-en.de": text_bytes(t for _, t in commoncrawl),
        "commoncrawl.de-en.en": text_bytes(s for s, _ in commoncrawl),
        "commoncrawl.fr-en.fr": decoy,
    })
    write_tgz(raw_dir / "training-parallel-nc-v9.tgz", {
        "training/news-commentary-v9.de-en.de": text_bytes(t for _, t in nc),
        "training/news-commentary-v9.de-en.en": text_bytes(s for s, _ in nc),
        "training/news-commentary-v9.cs-en.cs": decoy,
    }, dirs=["training"])
    write_tgz(raw_dir / "dev.tgz", {
        "dev/newstest2013.de": text_bytes(t for _, t in valid),
        "dev/newstest2013.en": text_bytes(s for s, _ in valid),
        "dev/newstest2013-src.en.sgm": b"<srcset></srcset>\n",
    }, dirs=["dev"])
    write_tgz(raw_dir / "test-full.tgz", {
        "test-full/newstest2014-deen-src.de.sgm": sgm("src", "de", [[t for _, t in d] for d in test_docs]),
        "test-full/newstest2014-deen-src.en.sgm": sgm("src", "en", [[s for s, _ in d] for d in test_docs]),
        "test-full/newstest2014-deen-ref.de.sgm": sgm("ref", "de", [[t for _, t in d] for d in test_docs]),
        "test-full/newstest2014-deen-ref.en.sgm": sgm("ref", "en", [[s for s, _ in d] for d in test_docs]),
    }, dirs=["test-full"])
    test = [p for d in test_docs for p in d]
    return Wmt14Fixture(raw_dir, europarl + commoncrawl + nc, valid, test, bad)


@dataclass
class CliResult:
    rc: int
    out: str
    err: str


def run_cli(*args: object) -> CliResult:
    """Run ``python -m fairseq_rope.data.prepare.cli ARGS`` in-process, capturing its output."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main([str(a) for a in args])
    return CliResult(rc, out.getvalue(), err.getvalue())


#: Small enough for a few hundred sentences, big enough for real merges.
TINY_VOCAB = 200


@pytest.fixture(scope="session")
def wmt14_archives(tmp_path_factory) -> Wmt14Fixture:
    return build_wmt14_archives(tmp_path_factory.mktemp("wmt14-raw"))


@pytest.fixture(scope="session")
def wmt14_prepared(tmp_path_factory, wmt14_archives) -> Tuple[Path, CliResult]:
    """The WMT14 recipe run once, in-process, on the tiny archives (2 workers, small chunks)."""
    out_dir = tmp_path_factory.mktemp("wmt14-out")
    result = run_cli("wmt14", "--raw-dir", wmt14_archives.raw_dir, "--offline", "--vocab-size", TINY_VOCAB,
                     "--workers", 2, "--chunk-lines", 16, out_dir)
    assert result.rc == 0, result.err
    return out_dir, result


def write_parallel(prefix: Path, pairs: Sequence[Pair], src: str = "en", tgt: str = "de") -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.{src}").write_bytes(text_bytes(s for s, _ in pairs))
    Path(f"{prefix}.{tgt}").write_bytes(text_bytes(t for _, t in pairs))
    return prefix


# --- Multi30k: six gzipped files named as published (never the real captions)

MULTI30K_SPLITS = {"train": ("train", 300), "valid": ("val", 30), "test": ("test_2016_flickr", 25)}


def french(german: str) -> str:
    """The French side of a tiny release: the German line behind an elided article, whose
    apostrophe the Moses tokenizer splits one way for French ("L' homme") and another for any
    other language."""
    return f"L'homme {german}"


def write_multi30k_release(raw_dir: Path) -> Tuple[Dict[str, Dict[str, ReleaseFile]], Dict[str, List[Tuple[str, str]]]]:
    """Nine gzipped files named as published (English, German, French), and the release table
    describing them; the pairs are English-German (French: :func:`french` of the German)."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    release: Dict[str, Dict[str, ReleaseFile]] = {}
    pairs = {}
    for seed, (split, (stem, n)) in enumerate(MULTI30K_SPLITS.items()):
        pairs[split] = make_pairs(n, seed=40 + seed, min_words=2, max_words=9)
        if split == "train":
            pairs[split][0] = lopsided_pair()  # kept: Multi30k is not cleaned
        release[split] = {}
        sides = {"en": [en for en, _ in pairs[split]], "de": [de for _, de in pairs[split]]}
        sides["fr"] = [french(de) for de in sides["de"]]
        for lang, lines in sides.items():
            path = raw_dir / f"{stem}.{lang}.gz"
            path.write_bytes(gzip.compress(text_bytes(lines), mtime=0))
            release[split][lang] = ReleaseFile(path.name, hashlib.sha256(path.read_bytes()).hexdigest(), n)
    return release, pairs
