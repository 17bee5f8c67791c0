"""``fairseq-rope-translate MODEL_DIR < input.en > output.de``: raw text through an exported model.

Each line goes through what the project's data preparation and evaluation do to text, with
the settings and BPE codes saved in MODEL_DIR by ``fairseq-rope-export-ct2``:

1. Moses punctuation normalization, non-printing characters removed, Moses tokenization
   (:func:`fairseq_rope.data.prepare.text.preprocess_line`, as ``fairseq-rope-prepare``);
2. subword-nmt BPE with the model's codes (:func:`fairseq_rope.data.prepare.bpe.apply_subword_nmt`);
3. CTranslate2 beam search decoding as fairseq-generate does (:mod:`fairseq_rope.deploy.decoding`;
   beam 4, length penalty 0.6 and the length limit of the tables unless told otherwise);
4. BPE removed as fairseq's ``--remove-bpe`` does, then Moses detokenization for the target
   language (:func:`fairseq_rope.evaluation.scoring.detokenize`, as the sacreBLEU score).

One output line per input line; an empty (or blank) line gives an empty line. Input is read
and written in chunks, so it can be any size; progress goes to stderr once a run takes longer
than a few seconds.
"""

from __future__ import annotations

import argparse
import sys
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, TextIO

from tqdm import tqdm

from fairseq_rope.base import FairseqRopeError, PathLike, decode_lines, report_error
from fairseq_rope.data.prepare.bpe import apply_subword_nmt
from fairseq_rope.data.prepare.text import preprocess_line
from fairseq_rope.deploy.decoding import Decoding
from fairseq_rope.deploy.decoding import translate as translate_subwords
from fairseq_rope.deploy.generate import load_translator
from fairseq_rope.deploy.model_dir import ModelDirectory
from fairseq_rope.evaluation.scoring import detokenize

#: Lines read, translated and written at a time (CTranslate2 sorts each chunk by length).
CHUNK_LINES = 2000


class TextTranslator:
    """An exported model with its text processing: raw source lines in, detokenized lines out."""

    def __init__(self, model_dir: PathLike, threads: int = 0, device: str = "cpu",
                 compute_type: str = "default", beam: Optional[int] = None, lenpen: Optional[float] = None,
                 max_batch_size: int = 64) -> None:
        self.settings = ModelDirectory.read(model_dir)
        self.codes = str(self.settings.codes_path(model_dir))
        decoding = Decoding.from_settings(self.settings.decoding)
        self.decoding = Decoding(beam or decoding.beam, decoding.lenpen if lenpen is None else lenpen,
                                 decoding.max_len_a, decoding.max_len_b)
        self.translator = load_translator(model_dir, threads, device, compute_type)
        self.max_batch_size = max_batch_size

    def subwords(self, lines: Sequence[str]) -> List[List[str]]:
        """Normalized, tokenized and BPE-segmented source lines, as subword lists."""
        tokenized = [preprocess_line(line, self.settings.source_lang) for line in lines]
        return [line.split() for line in apply_subword_nmt(tokenized, self.codes)]

    def translate(self, lines: Sequence[str]) -> List[str]:
        """Translations of raw source ``lines``, one per line."""
        sources = self.subwords(lines)
        todo = [i for i, s in enumerate(sources) if s]
        hypotheses = translate_subwords(self.translator, [sources[i] for i in todo], self.decoding,
                                        self.settings, max_batch_size=self.max_batch_size)
        out = [""] * len(lines)
        texts = detokenize([_remove_bpe(h.tokens, self.settings.bpe_separator) for h in hypotheses],
                           self.settings.target_lang)
        for i, text in zip(todo, texts):
            out[i] = text
        return out

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = CHUNK_LINES) -> Iterator[str]:
        """:meth:`translate` over an iterable of any length, a chunk at a time."""
        lines = iter(lines)
        while True:
            chunk = list(islice(lines, chunk_lines))
            if not chunk:
                return
            yield from self.translate(chunk)


def _remove_bpe(tokens: Sequence[str], separator: str) -> str:
    """What fairseq's ``--remove-bpe`` makes of subword-nmt output (fairseq's own function)."""
    from fairseq.data.data_utils import post_process

    return post_process(" ".join(tokens), separator + " ")


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
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--compute-type", default="default",
                        help="CTranslate2 compute type (default: the exported weights' own, e.g. int8)")
    parser.add_argument("--beam", type=int, help="beam size (default: the tables', 4)")
    parser.add_argument("--lenpen", type=float, help="length penalty (default: the tables', 0.6)")
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
    # delay: a short input shows no bar at all.
    with tqdm(unit=" sentences", file=sys.stderr, disable=quiet, delay=3) as progress:
        for n, translation in enumerate(model.translate_stream(lines), start=1):
            print(translation, file=out)
            progress.update()
            if n % CHUNK_LINES == 0:
                out.flush()  # a chunk at a time, for whoever reads the output as it comes


if __name__ == "__main__":
    sys.exit(main())
