"""``fairseq-rope-translate MODEL_DIR < input.en > output.de``: raw text through an exported model.

One output line per input line, processed as :mod:`fairseq_rope_serve.translator` describes.
Input is read and written in chunks, so it can be any size; progress goes to stderr once a
run takes longer than a few seconds. A line that is not UTF-8 is an error naming it. A line
longer than the model's bound (in subwords) is translated cut to it, and a warning on stderr
names it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, TextIO

from tqdm import tqdm

from fairseq_rope_serve.common import FairseqRopeError, decode_lines, report_error
from fairseq_rope_serve.decoding import max_source_subwords
from fairseq_rope_serve.translator import TextTranslator


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """How the model is loaded and decodes: the options of :class:`TextTranslator` that the
    translate and serve commands share."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--compute-type", default="default",
                        help="CTranslate2 compute type (default: the exported weights' own, e.g. int8)")
    parser.add_argument("--beam", type=int, help="beam size (default: the tables', 4)")
    parser.add_argument("--lenpen", type=float, help="length penalty (default: the tables', 0.6)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fairseq-rope-translate",
        description="Translate raw text (one sentence per line, stdin to stdout) with a model directory "
        "written by fairseq-rope-export-ct2: Moses normalization and tokenization, BPE, CTranslate2 beam "
        "search as fairseq decodes, BPE removal and Moses detokenization.")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--input", "-i", type=Path, help="source text (default: stdin)")
    parser.add_argument("--output", "-o", type=Path, help="translations (default: stdout)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads (default 0: CTranslate2's choice, the machine's cores)")
    add_model_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per CTranslate2 batch")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        model = TextTranslator(args.model_dir, args.threads, args.device, args.compute_type, args.beam,
                               args.lenpen, args.batch_size)
        source = open(args.input, "rb") if args.input else sys.stdin.buffer
        with source:
            lines = decode_lines(source, str(args.input or "<stdin>"))
            if args.output:
                with open(args.output, "w", encoding="utf-8") as out:
                    _write(model, lines, out, args.quiet)
            else:
                _write(model, lines, sys.stdout, args.quiet)
    except (FairseqRopeError, OSError) as e:
        return report_error(e)
    return 0


def _write(model: TextTranslator, lines: Iterable[str], out: TextIO, quiet: bool) -> None:
    chunk: List[str] = []  # the lines of the chunk being translated

    def read() -> Iterator[str]:
        for line in lines:
            chunk.append(line)
            yield line

    done, cut = 0, []
    bound = max_source_subwords(model.settings)
    # delay: a short input shows no bar at all.
    with tqdm(unit=" sentences", file=sys.stderr, disable=quiet, delay=3) as progress:
        for translations in model.translate_chunks(read()):
            out.writelines(line + "\n" for line in translations)
            out.flush()  # a chunk at a time, for whoever reads the output as it comes
            if model.lines_cut > len(cut):  # rare: segmented again only to name them
                cut += [done + i + 1 for i, s in enumerate(model.subwords(chunk)) if len(s) > bound]
            done += len(translations)
            chunk.clear()
            progress.update(len(translations))
    if cut:
        shown = ", ".join(map(str, cut[:10])) + (f" and {len(cut) - 10} more" if len(cut) > 10 else "")
        print(f"warning: {len(cut)} line(s) longer than the model's {bound} subwords were translated cut to "
              f"them: line {shown}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
