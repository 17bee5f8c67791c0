"""The preparation recipes as lists of resumable steps, and the output layout.

``OUT_DIR`` layout (identical for WMT14 and user corpora)::

    raw/{split}.{lang}          extracted text as released (raw/test.{tgt}: sacreBLEU reference)
    tok/{split}.{lang}          normalized, non-printing chars removed, Moses-tokenized
    bpe/codes                   subword-nmt merges       (--bpe subword-nmt)
    bpe/spm.model, spm.vocab    SentencePiece BPE model  (--bpe sentencepiece)
    bpe/{split}.{lang}          subword-segmented text
    bpe/train.clean.{lang}      cleaned training pairs (not for curated corpora: Multi30k)
    data-bin/                   fairseq-preprocess output (joined dict.{src,tgt}.txt)
    .done/STEP.done             completion markers (+ hashes.json: input hash cache, lock)

Line ``i`` of every file of a split is the same sentence pair throughout,
except in the cleaned training files.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Sequence, Tuple

from fairseq_rope_serve.text import TOKENIZER_OPTIONS
from tqdm import tqdm

from fairseq_rope.base import decode_lines
from fairseq_rope.data.prepare import bpe as subword
from fairseq_rope.data.prepare.archives import Part, scan_archive, unwrap_sgm
from fairseq_rope.data.prepare.binarize import binarize, dictionary_size
from fairseq_rope.data.prepare.files import (
    PrepareError,
    check_aligned,
    copy_user_file,
    count_lines,
    open_text,
    read_lines,
)
from fairseq_rope.data.prepare.multiproc import DEFAULT_CHUNK_LINES, map_lines, pool_context
from fairseq_rope.data.prepare.pipeline import Step
from fairseq_rope.data.prepare.text import keep_pair, preprocess_chunk

#: clean-corpus-n.perl -ratio 1.5 train 1 250, as in fairseq's WMT14 recipe.
CLEAN_OPTIONS = {"min_len": 1, "max_len": 250, "ratio": 1.5}


@dataclass
class Options:
    """Everything a recipe needs to know besides its inputs."""

    out_dir: Path
    src: str
    tgt: str
    bpe: str = subword.SUBWORD_NMT
    vocab_size: int = 37000
    workers: int = 1
    chunk_lines: int = DEFAULT_CHUNK_LINES
    tokenize: bool = True
    has_test: bool = True
    #: Drop training pairs outside CLEAN_OPTIONS (noisy web-crawled corpora such
    #: as WMT); off for curated corpora, whose every pair is a translation.
    clean_train: bool = True
    log: Callable[[str], None] = print

    @property
    def langs(self) -> List[str]:
        return [self.src, self.tgt]

    @property
    def splits(self) -> List[str]:
        return ["train", "valid", "test"] if self.has_test else ["train", "valid"]

    def raw(self, split: str, lang: str) -> Path:
        return self.out_dir / "raw" / f"{split}.{lang}"

    def tok(self, split: str, lang: str) -> Path:
        return self.out_dir / "tok" / f"{split}.{lang}"

    def text(self, split: str, lang: str) -> Path:
        """The input of BPE: tokenized text, or the raw text with ``--no-tokenize``."""
        return self.tok(split, lang) if self.tokenize else self.raw(split, lang)

    def bpe_text(self, split: str, lang: str) -> Path:
        return self.out_dir / "bpe" / f"{split}.{lang}"

    def clean(self, lang: str) -> Path:
        """The training text that is binarized: cleaned, or as segmented without cleaning."""
        return self.out_dir / "bpe" / f"train.clean.{lang}" if self.clean_train else self.bpe_text("train", lang)

    @property
    def bpe_model_files(self) -> List[Path]:
        """Files of the learned subword model; the first one is what segmentation loads."""
        d = self.out_dir / "bpe"
        return [d / "codes"] if self.bpe == subword.SUBWORD_NMT else [d / "spm.model", d / "spm.vocab"]

    @property
    def data_bin(self) -> Path:
        return self.out_dir / "data-bin"

    def raw_outputs(self) -> List[Path]:
        return [self.raw(split, lang) for split in self.splits for lang in self.langs]


# ----------------------------------------------------------------------------
# First step: raw text from WMT archives or from user files
# ----------------------------------------------------------------------------


def wmt_extract_step(
    opts: Options, parts: Mapping[str, Sequence[Part]], archive_paths: Mapping[str, Path]
) -> Step:
    """Verify every archive (full read, expected members) and unwrap the splits into raw/."""
    spec = {
        split: [{"archive": p.archive.filename, "members": dict(p.members), "sgm": p.sgm} for p in ps]
        for split, ps in parts.items()
    }
    return Step(
        name="extract",
        run=partial(_extract, opts, parts, archive_paths),
        outputs=opts.raw_outputs(),
        inputs=[archive_paths[name] for name in sorted(archive_paths)],
        options={"parts": spec},
    )


def _extract(
    opts: Options, parts: Mapping[str, Sequence[Part]], archive_paths: Mapping[str, Path], tmps: List[Path]
) -> None:
    work = opts.out_dir / "raw" / "members.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        # member name -> extracted file, per archive
        wanted: Dict[str, Dict[str, Path]] = {}
        for part in chain.from_iterable(parts.values()):
            files = wanted.setdefault(part.archive.filename, {})
            for member in part.members.values():
                files[member] = work / f"{len(files)}-{Path(member).name}"
        urls = {part.archive.filename: part.archive.url for part in chain.from_iterable(parts.values())}
        _scan_all(opts, archive_paths, wanted, urls)

        out = dict(zip(opts.raw_outputs(), tmps))
        for split in opts.splits:
            src_out, tgt_out = (out[opts.raw(split, lang)] for lang in opts.langs)
            with open_text(src_out, "w") as fs, open_text(tgt_out, "w") as ft:
                total = 0
                for part in parts[split]:
                    (n_src, src), (n_tgt, tgt) = (_member_lines(part, lang, wanted[part.archive.filename])
                                                  for lang in opts.langs)
                    names = [f"{part.archive.filename}:{part.members[lang]}" for lang in opts.langs]
                    check_aligned(names[0], n_src, names[1], n_tgt)
                    if not n_src:
                        raise PrepareError(f"{names[0]}: no text in this member")
                    fs.writelines(line + "\n" for line in src)
                    ft.writelines(line + "\n" for line in tgt)
                    total += n_src
                    opts.log(f"  {split}: {n_src:>9,} pairs from {part.archive.filename} "
                             f"({Path(names[0]).name})")
                opts.log(f"  {split}: {total:>9,} pairs in total")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _scan_all(opts: Options, archive_paths: Mapping[str, Path], wanted: Mapping[str, Mapping[str, Path]],
              urls: Mapping[str, str]) -> None:
    """Full read of every archive, in parallel; one error listing every bad archive."""
    jobs = sorted(wanted, key=lambda name: -archive_paths[name].stat().st_size)  # biggest first
    with pool_context().Pool(max(1, min(opts.workers, len(jobs)))) as pool, \
            tqdm(total=len(jobs), desc="verify archives", unit=" archives") as bar:
        results = {name: pool.apply_async(scan_archive, (archive_paths[name], wanted[name]),
                                          callback=lambda _: bar.update()) for name in jobs}
        errors = {name: r.get() for name, r in results.items()}
    bad = [f"  {error}\n    (a complete copy: {urls[name]})" for name, error in errors.items() if error]
    if bad:
        raise PrepareError(
            "bad archive(s):\n" + "\n".join(bad) + "\nReplace them in the raw directory and rerun."
        )


def _member_lines(part: Part, lang: str, files: Mapping[str, Path]) -> Tuple[int, Iterable[str]]:
    """Number of lines (segments) of an extracted member, and an iterator over them."""
    path = files[part.members[lang]]
    name = f"{part.archive.filename}:{part.members[lang]}"
    if part.sgm:  # test sets are small
        segments = unwrap_sgm("\n".join(decode_lines(path.read_bytes().split(b"\n"), name, strict=False)))
        return len(segments), segments

    def lines() -> Iterator[str]:
        with open(path, "rb") as f:
            # WMT text is trusted: a bad byte becomes U+FFFD with a warning
            # instead of stopping a run over millions of lines.
            yield from decode_lines(f, name, strict=False)

    return count_lines(path), lines()


def import_step(opts: Options, prefixes: Mapping[str, str]) -> Step:
    """Validate user files ``PREFIX.{src,tgt}`` (UTF-8, non-empty, aligned) and copy them into raw/."""
    inputs = [Path(f"{prefixes[split]}.{lang}") for split in opts.splits for lang in opts.langs]
    return Step("import", partial(_import, opts, inputs), opts.raw_outputs(), inputs)


def _import(opts: Options, inputs: List[Path], tmps: List[Path]) -> None:
    for split, (src, tgt), (tmp_src, tmp_tgt) in zip(opts.splits, _pairs(inputs), _pairs(tmps)):
        n_src, n_tgt = copy_user_file(src, tmp_src), copy_user_file(tgt, tmp_tgt)
        check_aligned(src, n_src, tgt, n_tgt)
        opts.log(f"  {split}: {n_src:,} pairs from {src} / {tgt.name}")


def _pairs(paths: Sequence[Path]) -> List[Sequence[Path]]:
    return [paths[i:i + 2] for i in range(0, len(paths), 2)]


# ----------------------------------------------------------------------------
# Shared steps: raw/ → tok/ → bpe/ → data-bin/
# ----------------------------------------------------------------------------


def tokenize_steps(opts: Options) -> List[Step]:
    """One step per file: normalize punctuation, remove non-printing chars, tokenize."""
    if not opts.tokenize:
        return []
    steps = []
    for split in opts.splits:
        for lang in opts.langs:
            src, dest = opts.raw(split, lang), opts.tok(split, lang)
            fn = partial(preprocess_chunk, lang=lang)
            run = partial(_map_file, opts, fn, src, f"tokenize {split}.{lang}")
            steps.append(Step(f"tokenize {split}.{lang}", run, [dest], [src], {
                "lang": lang, "normalizer": "MosesPunctNormalizer", "non_printing": r"\p{C} -> space",
                **TOKENIZER_OPTIONS,
            }))
    return steps


def _map_file(opts: Options, fn: Callable[[Sequence[str]], List[str]], src: Path, desc: str,
              tmps: List[Path]) -> None:
    map_lines(fn, src, tmps[0], workers=opts.workers, chunk_lines=opts.chunk_lines, desc=desc)


def learn_bpe_step(opts: Options) -> Step:
    """Joint subword model on the source and target training text."""
    inputs = [opts.text("train", lang) for lang in opts.langs]
    return Step("learn-bpe", partial(_learn_bpe, opts, inputs), opts.bpe_model_files, inputs,
                {"method": opts.bpe, "vocab_size": opts.vocab_size})


def _learn_bpe(opts: Options, inputs: List[Path], tmps: List[Path]) -> None:
    if opts.bpe == subword.SUBWORD_NMT:
        merges = subword.learn_subword_nmt(
            inputs, tmps[0], opts.vocab_size, workers=opts.workers, chunk_lines=opts.chunk_lines
        )
        opts.log(f"  subword-nmt: {merges:,} merge operations for a requested vocabulary "
                 f"of {opts.vocab_size:,}")
    else:
        pieces = subword.learn_sentencepiece(inputs, tmps[0], tmps[1], opts.vocab_size, workers=opts.workers)
        note = "" if pieces == opts.vocab_size else " (the corpus supports no more)"
        opts.log(f"  sentencepiece: {pieces:,} pieces for a requested vocabulary "
                 f"of {opts.vocab_size:,}{note}")


def apply_bpe_steps(opts: Options) -> List[Step]:
    """One step per file: segment with the learned model."""
    model = opts.bpe_model_files[0]
    steps = []
    for split in opts.splits:
        for lang in opts.langs:
            src = opts.text(split, lang)
            fn = subword.segmenter(opts.bpe, model)
            run = partial(_map_file, opts, fn, src, f"apply-bpe {split}.{lang}")
            steps.append(Step(f"apply-bpe {split}.{lang}", run, [opts.bpe_text(split, lang)], [src, model],
                              {"method": opts.bpe}))
    return steps


def clean_step(opts: Options) -> Step:
    """Drop training pairs outside 1–250 tokens or with a length ratio above 1.5."""
    inputs = [opts.bpe_text("train", lang) for lang in opts.langs]
    outputs = [opts.clean(lang) for lang in opts.langs]
    return Step("clean", partial(_clean, opts, inputs), outputs, inputs, CLEAN_OPTIONS)


def _clean(opts: Options, inputs: List[Path], tmps: List[Path]) -> None:
    check_aligned(inputs[0], count_lines(inputs[0]), inputs[1], count_lines(inputs[1]))
    kept = total = 0
    with open_text(tmps[0], "w") as fs, open_text(tmps[1], "w") as ft:
        for src, tgt in zip(read_lines(inputs[0]), read_lines(inputs[1])):
            total += 1
            if keep_pair(src, tgt, **CLEAN_OPTIONS):
                fs.write(src + "\n")
                ft.write(tgt + "\n")
                kept += 1
    opts.log(f"  kept {kept:,} of {total:,} training pairs ({total - kept:,} removed)")


def binarize_step(opts: Options) -> Step:
    """fairseq-preprocess with a joined dictionary into data-bin/."""
    inputs = [opts.clean(lang) for lang in opts.langs]
    inputs += [opts.bpe_text(split, lang) for split in opts.splits if split != "train" for lang in opts.langs]
    return Step("binarize", partial(_binarize, opts), [opts.data_bin], inputs,
                {"src": opts.src, "tgt": opts.tgt, "joined_dictionary": True})


def _binarize(opts: Options, tmps: List[Path]) -> None:
    prefix = opts.out_dir / "bpe"
    train = opts.clean(opts.src).with_suffix("")
    binarize(opts.src, opts.tgt, tmps[0], train, prefix / "valid",
             prefix / "test" if opts.has_test else None, workers=opts.workers)


def common_steps(opts: Options) -> List[Step]:
    """Everything after raw/ exists."""
    return [
        *tokenize_steps(opts),
        learn_bpe_step(opts),
        *apply_bpe_steps(opts),
        *([clean_step(opts)] if opts.clean_train else []),
        binarize_step(opts),
    ]


def report(opts: Options) -> int:
    """Print and return the joined dictionary size (fairseq's special symbols included)."""
    dicts = [opts.data_bin / f"dict.{lang}.txt" for lang in opts.langs]
    if dicts[0].read_bytes() != dicts[1].read_bytes():
        raise PrepareError(f"{dicts[0]} and {dicts[1]} differ although the dictionary is joined")
    size = dictionary_size(dicts[0])
    opts.log(f"joined dictionary: {size:,} symbols ({dicts[0]} == {dicts[1].name}; "
             f"{opts.bpe}, requested vocabulary {opts.vocab_size:,})")
    opts.log(f"binarized data: {opts.data_bin}")
    return size
