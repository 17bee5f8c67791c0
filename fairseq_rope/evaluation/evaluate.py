"""Evaluate a training run the paper's way: average the last N checkpoints, decode
with beam 4 / length penalty 0.6, report tokenized compound-split BLEU and
sacreBLEU (:mod:`fairseq_rope.evaluation.scoring` explains both).

``fairseq-rope-evaluate SAVE_DIR DATA_BIN [--raw-ref FILE] [--subset test]
[--num-checkpoints 5] [--upper-bound N] [--eval-dir eval] [--detok-lang LANG]
[--max-tokens 8192] [--engine fairseq|ctranslate2 [--quantization Q] [--threads N]] [--force]
[-- extra fairseq-generate args...]`` (``scripts/evaluate.sh`` is the same command).

``--engine ctranslate2`` decodes with CTranslate2 instead of fairseq-generate: the averaged
checkpoint is exported (``fairseq-rope-export-ct2``, ``--quantization`` for its weights) to
``EVAL_DIR/ctranslate2[-Q]`` and decoded as fairseq-generate decodes
(:func:`fairseq_rope.deploy.generate.generate`, the same beam, length penalty and length limit,
fairseq-generate's output format; extra fairseq-generate arguments are refused); the
scoring is the same code. The results go to
``SAVE_DIR/eval-ctranslate2[-Q]/`` unless ``--eval-dir`` says otherwise, beside fairseq's
``eval/``, and ``results.json`` names the engine.

Averages the last N update checkpoints (epoch checkpoints if there are no
update checkpoints; fewer than N is an error), or with ``--upper-bound U`` the
last N up to update (epoch) U, into ``SAVE_DIR/checkpoint_avg_lastN.pt``
(``checkpoint_avg_lastN_uptoU.pt``) and decodes it. Writes to ``SAVE_DIR/eval/``
(``--eval-dir`` names another directory under SAVE_DIR):
``generate-SUBSET.txt`` (fairseq-generate's output; its log: ``generate-SUBSET.log``),
``hyps.tok.TGT``, ``refs.tok.TGT``, ``hyps.detok.TGT``, ``averaged_checkpoints.txt``
and ``results.json``. ``--raw-ref`` (untokenized references) defaults to
``DATA_BIN/../raw/SUBSET.TGT``; if that does not exist, sacreBLEU is reported as
unavailable. Extra arguments after ``--`` go to fairseq-generate, last.

``results.json`` is written last and marks a finished evaluation: a SAVE_DIR that
has one is refused unless ``--force``. The inputs (the subset and its
references, ``--raw-ref``) are checked before anything is averaged or decoded;
every output appears atomically.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, fairseq_command, report_error, split_passthrough
from fairseq_rope.deploy import export, generate
from fairseq_rope.evaluation import averaging, scoring
from fairseq_rope.evaluation.decoding import generate_command

# Outputs derived from eval/ (by scoring and the table harness): stale once eval/ is redone.
DERIVED = ("results.json", "run.json", "bleu_by_length.json")
FAIRSEQ, CTRANSLATE2 = "fairseq", "ctranslate2"
ENGINES = (FAIRSEQ, CTRANSLATE2)


def decode(command: Sequence[str], output: Path, log: Path) -> bool:
    """Run fairseq-generate into ``output`` (atomically) and its log into ``log``;
    False, having shown the log's tail, if it failed."""
    print(f"decoding with {command[command.index('--path') + 1]} -> {output} (log: {log})", file=sys.stderr)
    try:
        with base.atomic_path(output) as tmp, open(tmp, "wb") as out, open(log, "wb") as err:
            subprocess.run([*fairseq_command(command[0]), *command[1:]], stdout=out, stderr=err, check=True)
    except subprocess.CalledProcessError:
        print("\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]), file=sys.stderr)
        print(f"error: fairseq-generate failed (full log: {log})", file=sys.stderr)
        return False
    return True


def decode_with_ctranslate2(checkpoint: Path, args: argparse.Namespace, eval_dir: Path,
                            output: Path) -> Tuple[List[str], List[str]]:
    """Export ``checkpoint`` and decode the subset with it into ``output`` (atomically);
    returns the decoding's command line (what results.json records: the same decoding run on
    its own) and scoring's ``--engine`` arguments."""
    model_dir = eval_dir / "-".join([CTRANSLATE2, *([args.quantization] if args.quantization else [])])
    codes = export.default_bpe_codes(args.data_bin)  # for raw text later; decoding needs none
    settings = export.export_checkpoint(checkpoint, model_dir, data_bin=args.data_bin,
                                        bpe_codes=codes if codes.is_file() else None,
                                        quantization=args.quantization, force=True)
    print(f"decoding with CTranslate2 ({model_dir}) -> {output}", file=sys.stderr)
    with base.atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as out:
        # deploy's default decoding is the tables' (TABLE_DECODING), as fairseq-generate's here.
        generate.generate(model_dir, args.data_bin, out, args.subset, max_tokens=args.max_tokens,
                          threads=args.threads)
    command = generate.generate_command(model_dir, args.data_bin, args.subset, max_tokens=args.max_tokens,
                                        threads=args.threads)
    engine = ["--engine", CTRANSLATE2, "--engine-info", f"version={settings.provenance['ctranslate2']}",
              "--engine-info", f"quantization={settings.quantization or 'float32'}",
              "--engine-info", f"model_dir={model_dir.resolve()}"]
    return command, engine


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fairseq-rope-evaluate",
        description="Average the last N checkpoints of SAVE_DIR, decode DATA_BIN's subset with beam 4 "
        "and length penalty 0.6, and score it (tokenized compound-split BLEU, sacreBLEU, chrF).",
        epilog="Arguments after '--' go to fairseq-generate, last.",
    )
    parser.add_argument("save_dir", type=Path)
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("--raw-ref", help="untokenized references (default: DATA_BIN/../raw/SUBSET.TGT)")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--num-checkpoints", type=int, default=5)
    parser.add_argument("--upper-bound", type=int, metavar="U",
                        help="average the last checkpoints up to update (epoch) U, not the last ones")
    parser.add_argument("--eval-dir", help="the results' directory under SAVE_DIR (default: eval; "
                        "eval-ctranslate2[-Q] with --engine ctranslate2)")
    parser.add_argument("--detok-lang", help="Moses detokenizer language (default: the target language)")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--engine", choices=ENGINES, default=FAIRSEQ,
                        help="decode with fairseq-generate (default) or an export to CTranslate2")
    parser.add_argument("--quantization", help="ctranslate2: the exported weights' type (int8, float16, ...; "
                        "default float32)")
    parser.add_argument("--threads", type=int, default=base.usable_cores(),
                        help="ctranslate2: CPU threads (default: the usable cores)")
    parser.add_argument("--force", action="store_true",
                        help="evaluate again (replaces eval/'s results and the averaged checkpoint)")
    args = parser.parse_args(argv)
    if args.engine == FAIRSEQ and args.quantization:
        parser.error("--quantization needs --engine ctranslate2")
    if args.eval_dir is None:
        args.eval_dir = "eval" if args.engine == FAIRSEQ else "-".join(
            ["eval", CTRANSLATE2, *([args.quantization] if args.quantization else [])])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = parse_args(own)
    if args.engine == CTRANSLATE2 and extra:
        print(f"error: extra arguments go to fairseq-generate, which --engine ctranslate2 does not run: "
              f"{' '.join(extra)}", file=sys.stderr)
        return 2
    for directory in (args.save_dir, args.data_bin):
        if not directory.is_dir():
            print(f"error: no such directory: {directory}", file=sys.stderr)
            return 1
    eval_dir = args.save_dir / args.eval_dir
    bound = "" if args.upper_bound is None else f"_upto{args.upper_bound}"
    averaged = args.save_dir / f"checkpoint_avg_last{args.num_checkpoints}{bound}.pt"
    if (eval_dir / "results.json").exists() and not args.force:
        print(f"error: {eval_dir}/results.json exists: {args.save_dir} is evaluated already. "
              f"Pass --force to evaluate it again (replaces its eval/ results and {averaged}).", file=sys.stderr)
        return 1

    # Before averaging and decoding: the subset must have references, --raw-ref must match it.
    reference = ["--data-bin", str(args.data_bin), "--subset", args.subset]
    reference += ["--raw-ref", args.raw_ref] if args.raw_ref else []
    if scoring.main(["--check", *reference]) != 0:
        return 1
    # From here on the old results no longer describe eval/: gone, so a failure
    # cannot leave them looking current.
    for name in DERIVED:
        (eval_dir / name).unlink(missing_ok=True)
    try:
        # --force: the averaged checkpoint is this command's own intermediate, redone every time.
        paths = averaging.average_last_checkpoints(args.save_dir, averaged, args.num_checkpoints, "auto",
                                                   args.upper_bound, force=True)
    except averaging.AveragingError as e:
        return report_error(e)
    print(f"averaged {len(paths)} checkpoints into {averaged}", file=sys.stderr)
    base.write_lines(eval_dir / "averaged_checkpoints.txt", [str(p) for p in paths])

    output = eval_dir / f"generate-{args.subset}.txt"
    if args.engine == CTRANSLATE2:
        try:
            command, engine = decode_with_ctranslate2(averaged, args, eval_dir, output)
        except FairseqRopeError as e:
            return report_error(e)
    else:
        command = generate_command(averaged, args.data_bin, args.subset, max_tokens=args.max_tokens) + extra
        engine = ["--engine", "fairseq"]
        if not decode(command, output, eval_dir / f"generate-{args.subset}.log"):
            return 1
    score = [str(output), "--out-dir", str(eval_dir), *reference[:4], "--checkpoint", str(averaged),
             "--averaged-checkpoints", *map(str, paths), *engine]
    score += ["--raw-ref", args.raw_ref] if args.raw_ref else []
    score += ["--detok-lang", args.detok_lang] if args.detok_lang else []
    return scoring.main([*score, "--", *command])


if __name__ == "__main__":
    sys.exit(main())
