"""Command line: ``python -m fairseq_rope.data.prepare.cli {wmt14,multi30k,parallel} [options] OUT_DIR``.

The shell entry points ``scripts/prepare_wmt14_en_de.sh``,
``scripts/prepare_multi30k.sh`` and ``scripts/prepare_parallel.sh`` call this. Problems with the data exit with
status 1 and a one-paragraph ``error:`` message instead of a traceback.

Rerunning a command resumes it, and skips what is done. An OUT_DIR holding a
finished preparation of other inputs or options is refused unless ``--force``
(it would be overwritten step by step). A first run that fails before any step
finished removes the OUT_DIR it created, so a failure leaves nothing behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

from fairseq_rope.data.prepare import multi30k, recipes
from fairseq_rope.data.prepare.archives import WMT14_ARCHIVES, WMT14_EN_DE, ensure_archives
from fairseq_rope.data.prepare.bpe import METHODS, SUBWORD_NMT
from fairseq_rope.base import FairseqRopeError
from fairseq_rope.data.prepare.files import PrepareError
from fairseq_rope.data.prepare.multiproc import DEFAULT_CHUNK_LINES
from fairseq_rope.data.prepare.pipeline import Pipeline, Step


def log(message: str) -> None:
    print(message, flush=True)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("out_dir", metavar="OUT_DIR", type=Path,
                        help="output directory (created; reruns resume)")
    common.add_argument("--bpe", choices=METHODS, default=SUBWORD_NMT,
                        help="joint subword model: subword-nmt BPE or a SentencePiece BPE model "
                        "(default: %(default)s)")
    common.add_argument("--vocab-size", type=_positive,
                        help="target joined vocabulary size; smaller corpora stop earlier "
                        f"(default: 37000; multi30k: {multi30k.DEFAULT_VOCAB_SIZE})")
    common.add_argument("--workers", type=_positive, default=os.cpu_count() or 1,
                        help="worker processes; outputs do not depend on it "
                        "(default: all cores, %(default)s)")
    common.add_argument("--chunk-lines", type=_positive, default=DEFAULT_CHUNK_LINES,
                        help="lines per unit of parallel work (default: %(default)s)")
    common.add_argument("--force", action="store_true",
                        help="redo a finished preparation in OUT_DIR that used other inputs or options")

    parser = argparse.ArgumentParser(
        prog="python -m fairseq_rope.data.prepare.cli",
        description="Prepare parallel data for fairseq (see fairseq_rope.data.prepare).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    wmt = sub.add_parser("wmt14", parents=[common], help="WMT14 English-German (Europarl v7, Common Crawl, "
                         "News Commentary v9; newstest2013 valid; newstest2014 full test)")
    wmt.add_argument("--raw-dir", type=Path, help="directory with the release archives; missing ones are "
                     "downloaded into it (default: OUT_DIR/orig)")
    wmt.add_argument("--offline", action="store_true", help="never download: a missing archive is an error")

    m30k = sub.add_parser("multi30k", parents=[common], help="Multi30k English-German or English-French, "
                          "task 1 (train, val, test_2016_flickr), checked against the published checksums")
    m30k.add_argument("--tgt", choices=multi30k.TARGETS, default=multi30k.TARGETS[0],
                      help="target language (default: %(default)s)")
    m30k.add_argument("--raw-dir", type=Path, help="directory with the pair's six release files "
                      "(train/val/test_2016_flickr.{en,TGT}.gz); missing ones are downloaded into it "
                      "(default: OUT_DIR/orig)")
    m30k.add_argument("--offline", action="store_true", help="never download: a missing file is an error")

    par = sub.add_parser("parallel", parents=[common], help="any raw parallel corpus given by file prefixes")
    par.add_argument("--src", required=True, help="source language suffix, e.g. en (files PREFIX.en)")
    par.add_argument("--tgt", required=True, help="target language suffix, e.g. de")
    par.add_argument("--trainpref", required=True, help="training files prefix")
    par.add_argument("--validpref", required=True, help="validation files prefix")
    par.add_argument("--testpref", help="test files prefix (optional)")
    par.add_argument("--no-tokenize", dest="tokenize", action="store_false",
                     help="the text is tokenized already: skip normalization, non-printing character "
                     "removal and Moses tokenization (BPE is learned and applied on the text as is)")
    par.add_argument("--no-clean", dest="clean", action="store_false",
                     help="keep every training pair (curated corpora): no removal of pairs outside "
                     "1-250 tokens or with a length ratio above 1.5")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the recipe selected by ``args``; return the joined dictionary size."""
    out_dir: Path = args.out_dir.resolve()
    parallel = args.command == "parallel"
    if parallel and args.src == args.tgt:
        raise PrepareError("--src and --tgt must differ")
    default_vocab = multi30k.DEFAULT_VOCAB_SIZE if args.command == "multi30k" else 37000
    opts = recipes.Options(
        out_dir=out_dir,
        src=args.src if parallel else "en",
        tgt=args.tgt if args.command != "wmt14" else "de",
        bpe=args.bpe,
        vocab_size=args.vocab_size or default_vocab,
        workers=args.workers,
        chunk_lines=args.chunk_lines,
        tokenize=args.tokenize if parallel else True,
        has_test=args.testpref is not None if parallel else True,
        clean_train=args.clean if parallel else args.command == "wmt14",
        log=log,
    )
    name = {"wmt14": "WMT14", "multi30k": "Multi30k"}.get(args.command, "parallel corpus")
    log(f"{name} {opts.src}-{opts.tgt} → {out_dir} "
        f"({opts.bpe}, vocabulary {opts.vocab_size:,}, {opts.workers} workers)")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline(out_dir, log=log)
    try:
        with pipeline.lock():
            first: Step
            if args.command == "wmt14":
                raw_dir = (args.raw_dir or out_dir / "orig").resolve()
                archives = ensure_archives(raw_dir, WMT14_ARCHIVES, offline=args.offline, log=log)
                first = recipes.wmt_extract_step(opts, WMT14_EN_DE, archives)
            elif args.command == "multi30k":
                raw_dir = (args.raw_dir or out_dir / "orig").resolve()
                release = multi30k.language_pair(multi30k.TASK1, opts.tgt)
                files = [f.archive for f in multi30k.release_files(release)]
                paths = ensure_archives(raw_dir, files, offline=args.offline, log=log)
                first = multi30k.import_step(opts, paths, release)
            else:
                prefixes = {"train": args.trainpref, "valid": args.validpref, "test": args.testpref}
                first = recipes.import_step(opts, prefixes)
            steps = [first, *recipes.common_steps(opts)]
            if not args.force:
                refuse_to_overwrite(pipeline, steps, out_dir)
            pipeline.run(steps)
            return recipes.report(opts)
    except BaseException:
        if created:
            remove_if_empty(out_dir, pipeline)
        raise


def refuse_to_overwrite(pipeline: Pipeline, steps: Sequence[Step], out_dir: Path) -> None:
    """Raise if ``out_dir`` holds a finished preparation that ``steps`` would partly redo."""
    if not pipeline.has_finished(steps[-1]):
        return  # nothing finished to protect: a first run, or the resume of an interrupted one
    changed = pipeline.first_changed(steps)
    if changed is not None:
        raise PrepareError(
            f"{out_dir} already holds a finished preparation made from other inputs or options "
            f"(step '{changed.name}' would be redone and data-bin/ replaced). Rerun the original "
            "command to resume it, choose another OUT_DIR, or pass --force to redo it."
        )


def remove_if_empty(out_dir: Path, pipeline: Pipeline) -> None:
    """Remove an OUT_DIR this run created if it holds nothing but empty folders and the lock.

    Anything else (a finished step, downloaded archives) is kept for the rerun.
    """
    bookkeeping = {pipeline.state_dir / "lock", pipeline.state_dir / "hashes.json"}
    if all(p.is_dir() or p in bookkeeping for p in out_dir.rglob("*")):
        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except FairseqRopeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:  # an unwritable OUT_DIR, a full disk: the path is in the message
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: finished steps are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
