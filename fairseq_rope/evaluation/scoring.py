"""Scoring of ``fairseq-generate`` output under the two BLEU conventions.

(a) **Tokenized BLEU with compound splitting** — the convention of Vaswani et
    al. (2017), fairseq's ``scripts/compound_split_bleu.sh`` and hence of the
    RoFormer paper: the Moses-tokenized, BPE-removed hypotheses (``H-`` lines)
    and references (``T-`` lines) get hyphenated compounds split by the regex
    ``(\\S)-(\\S) → \\1 ##AT##-##AT## \\2`` (tensor2tensor's ``get_ende_bleu.sh``),
    then BLEU on whitespace tokens. We compute it with sacrebleu
    (``tokenize="none"``, ``smooth_method="none"``, ``force=True``), which
    equals ``multi-bleu.perl`` / ``fairseq-score``: case-sensitive, no
    smoothing (a zero n-gram precision gives 0).
(b) **sacreBLEU** — hypotheses detokenized with sacremoses' Moses detokenizer
    for the target language, scored against the untokenized references with
    sacreBLEU's defaults (13a tokenization); reported with its signature. Only
    available when the raw reference file exists; otherwise it is reported as
    unavailable, never computed against tokenized references.

``python -m fairseq_rope.evaluation.scoring GENERATE_OUTPUT --out-dir DIR ...`` writes
``hyps.tok.<tgt>`` (tokenized, BPE removed, no compound split),
``refs.tok.<tgt>``, ``hyps.detok.<tgt>`` and, last, ``results.json`` into DIR
(each atomically) and prints a two-line summary. ``--check`` only checks the
inputs (a subset with references, raw references that match it), so that
``scripts/evaluate.sh``, which drives this module, fails before decoding.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from fairseq_rope_serve.text import detokenize
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.bleu import BLEUScore

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, PathLike, read_lines, report_error, split_passthrough
from fairseq_rope.data.data_bin import DataBinError, infer_language_pair


# fairseq-generate lines: S-<id>\tsource, T-<id>\ttarget, H-<id>\tscore\thypothesis,
# D-<id>\tscore\tdetokenized, P-<id>\tpositional scores. Log lines interleave.
GENERATE_LINE = re.compile(r"([STHDP])-(\d+)\t(.*)")
COMPOUND = re.compile(r"(\S)-(\S)")
COMPOUND_SPLIT = r"\1 ##AT##-##AT## \2"
#: A hypothesis longer than this many times its reference counts as a runaway.
RUNAWAY_RATIO = 1.5
TOKENIZED_CONVENTION = (
    "tokenized BLEU (multi-bleu.perl / fairseq-score equivalent: sacrebleu tokenize=none, "
    "smooth=none) on Moses-tokenized, BPE-removed text with compound splitting "
    "(\\S)-(\\S) -> '\\1 ##AT##-##AT## \\2' applied to hypotheses and references"
)


class ScoringError(FairseqRopeError, ValueError):
    """Generate output or references that cannot be scored."""


@dataclass(frozen=True)
class Translation:
    """One sentence of fairseq-generate output (the best hypothesis)."""

    id: int
    hypothesis: str
    score: float
    source: Optional[str] = None
    reference: Optional[str] = None
    #: Subword tokens of the hypothesis before EOS (from its P- line), if printed.
    subwords: Optional[int] = None


def parse_generate_output(lines: Iterable[str]) -> List[Translation]:
    """Translations from fairseq-generate output, in original (id) order.

    fairseq prints sentences in batch order; ids are their line numbers in the
    test set. With ``--nbest`` > 1 the first ``H-`` line of an id (the best) is kept.
    """
    sources: Dict[int, str] = {}
    references: Dict[int, str] = {}
    hypotheses: Dict[int, Tuple[float, str]] = {}
    subwords: Dict[int, int] = {}
    for line in lines:
        m = GENERATE_LINE.fullmatch(line.rstrip("\r\n"))
        if m is None:
            continue
        tag, sid, rest = m.group(1), int(m.group(2)), m.group(3)
        if tag == "S":
            sources[sid] = rest
        elif tag == "T":
            references[sid] = rest
        elif tag == "H" and sid not in hypotheses:
            score, _, text = rest.partition("\t")
            hypotheses[sid] = (float(score), text)
        elif tag == "P" and sid not in subwords:  # one score per subword, then EOS's
            subwords[sid] = len(rest.split()) - 1
    if not hypotheses:
        raise ScoringError("no hypotheses (H-<id> lines) in the generate output")
    orphans = sorted(set(references) - set(hypotheses))
    if orphans:
        raise ScoringError(f"references without hypotheses, e.g. id {orphans[0]}")
    return [
        Translation(sid, text, score, sources.get(sid), references.get(sid), subwords.get(sid))
        for sid, (score, text) in sorted(hypotheses.items())
    ]


def read_generate_output(path: PathLike) -> List[Translation]:
    with open(path, encoding="utf-8") as f:
        return parse_generate_output(f)


def compound_split(line: str) -> str:
    """``Haus-Tür`` → ``Haus ##AT##-##AT## Tür`` (the regex of fairseq's compound_split_bleu.sh)."""
    return COMPOUND.sub(COMPOUND_SPLIT, line)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> Tuple[BLEUScore, str]:
    """Convention (a): compound-split, whitespace-tokenized BLEU; returns (score, signature)."""
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score(
        [compound_split(h) for h in hypotheses], [[compound_split(r) for r in references]]
    )
    return score, str(metric.get_signature())


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]) -> Tuple[BLEUScore, str]:
    """Convention (b): sacreBLEU with default settings on detokenized text; (score, signature)."""
    metric = BLEU()
    return metric.corpus_score(list(hypotheses), [list(references)]), str(metric.get_signature())


def chrf_score(hypotheses: Sequence[str], references: Sequence[str]) -> Tuple[float, str]:
    """chrF (sacrebleu's defaults: character 6-grams, beta 2) on detokenized text; (score, signature)."""
    metric = CHRF()
    return metric.corpus_score(list(hypotheses), [list(references)]).score, str(metric.get_signature())


def runaways(translations: Sequence[Translation], length_limits: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Hypotheses that ran away: longer than ``RUNAWAY_RATIO`` × their reference (tokenized
    words, BPE removed), and those stopped by the decoder's length limit instead of EOS.

    ``length_limits[id]`` is the most subword tokens decoding allowed sentence
    ``id`` (fairseq: max-len-a × source length + max-len-b); the limit count
    needs them and the hypotheses' P- lines.
    """
    long = [t.id for t in translations
            if len(t.hypothesis.split()) > RUNAWAY_RATIO * max(1, len((t.reference or "").split()))]
    at_limit: Optional[List[int]] = None
    if length_limits is not None and all(t.subwords is not None for t in translations):
        at_limit = [t.id for t in translations if t.subwords >= length_limits[t.id]]
    return {
        "ratio": RUNAWAY_RATIO,
        "longer_than_ratio": len(long),
        "longer_than_ratio_ids": long,
        "at_length_limit": None if at_limit is None else len(at_limit),
        "at_length_limit_ids": at_limit,
    }


def length_limits(source_tokens: Sequence[int], max_len_a: float, max_len_b: int) -> List[int]:
    """Decoding limits in subwords before EOS: int(max_len_a × source tokens (EOS included) + max_len_b).

    fairseq's SequenceGenerator takes the source length of the padded *batch*
    (its longest source), so with ``max_len_a`` > 0 a sentence's real limit
    can be higher than this own-length value: counts against it are an upper
    bound on the hypotheses stopped by the limit. With ``max_len_a`` 0 (the
    default) they are exact.
    """
    return [int(max_len_a * n + max_len_b) for n in source_tokens]


def check_test_set(data_bin: PathLike, subset: str) -> Tuple[str, str]:
    """(source, target) of ``subset``, after checking its dictionaries and both sides exist.

    A subset binarized without its target side has no references to score against.
    """
    try:
        source_lang, target_lang = infer_language_pair(data_bin, subset)
    except DataBinError as e:
        raise ScoringError(f"{e}; pass --target-lang") from None
    data_bin = Path(data_bin)
    for lang in (source_lang, target_lang):
        if not (data_bin / f"dict.{lang}.txt").is_file():
            raise ScoringError(f"{data_bin / f'dict.{lang}.txt'}: no such file; is {data_bin} "
                               "a complete fairseq-preprocess output?")
    for lang, side in ((source_lang, "source"), (target_lang, "reference")):
        prefix = data_bin / f"{subset}.{source_lang}-{target_lang}.{lang}"
        missing = [p.name for p in (Path(f"{prefix}.bin"), Path(f"{prefix}.idx")) if not p.is_file()]
        if missing:
            hint = (" (test set without references? binarize it with its target side, e.g. "
                    f"fairseq-preprocess --testpref PREFIX with PREFIX.{target_lang})"
                    if side == "reference" else "")
            raise ScoringError(f"{subset} has no {side} side in {data_bin}: "
                               f"{', '.join(missing)} missing{hint}")
    return source_lang, target_lang


def check_raw_reference(path: PathLike, expected: int) -> List[str]:
    """The lines of a raw reference file, which must be UTF-8 with one line per test sentence."""
    lines = read_lines(path)
    if len(lines) != expected:
        raise ScoringError(
            f"raw reference file {path} has {len(lines)} lines but the test set has {expected} "
            "sentences; pass the untokenized references of this test set with --raw-ref"
        )
    return lines


def subset_size(data_bin: PathLike, subset: str, source_lang: str, target_lang: str) -> int:
    """Number of sentences of a binarized subset (read with fairseq's own loader)."""
    return len(subword_lengths(data_bin, subset, source_lang, target_lang, target_lang))


def subword_lengths(data_bin: PathLike, subset: str, source_lang: str, target_lang: str,
                    side: str) -> List[int]:
    """Tokens (subwords and EOS) of each sentence of one side of a binarized subset."""
    from fairseq.data import data_utils

    prefix = Path(data_bin) / f"{subset}.{source_lang}-{target_lang}.{side}"
    dataset = data_utils.load_indexed_dataset(str(prefix))
    if dataset is None:
        raise ScoringError(f"no binarized dataset {prefix}.{{bin,idx}}")
    # Copy before the dataset (and the mmap its sizes view) goes away.
    lengths = [int(n) for n in dataset.sizes]
    del dataset
    return lengths


def check_complete(translations: Sequence[Translation], expected: int) -> None:
    """Every sentence of the test set translated exactly once (ids 0..expected-1).

    fairseq's batching drops the last batch when its size is not a multiple of
    ``--required-batch-size-multiple`` (default 8; facebookresearch/fairseq#5036),
    silently losing the longest test sentences unless that is set to 1.
    """
    ids = {t.id for t in translations}
    missing = sorted(set(range(expected)) - ids)
    unknown = sorted(ids - set(range(expected)))
    if missing or unknown:
        problems = [
            f"{what} ids {_some(bad)}" for what, bad in (("missing", missing), ("unknown", unknown)) if bad
        ]
        raise ScoringError(
            f"{len(translations)} sentences translated, but the test set has {expected} "
            f"({'; '.join(problems)}); run fairseq-generate with --required-batch-size-multiple 1"
        )


def _some(ids: Sequence[int], limit: int = 10) -> str:
    return ", ".join(map(str, ids[:limit])) + (", ..." if len(ids) > limit else "")


def default_raw_reference(data_bin: PathLike, subset: str, target_lang: str) -> Path:
    """Where the untokenized references are expected: ``DATA_BIN/../raw/<subset>.<tgt>``."""
    return Path(data_bin).resolve().parent / "raw" / f"{subset}.{target_lang}"


def evaluate_translations(
    translations: Sequence[Translation],
    out_dir: PathLike,
    target_lang: str,
    raw_reference: Optional[PathLike] = None,
    detok_lang: Optional[str] = None,
    metadata: Optional[Dict[str, Any]] = None,
    expected_sentences: Optional[int] = None,
    limits: Optional[Sequence[int]] = None,
) -> Dict[str, Any]:
    """Score under both conventions; write hypotheses, references and ``results.json`` to ``out_dir``.

    ``raw_reference`` (untokenized references, one per line in test-set order)
    enables the sacreBLEU score; a path that does not exist makes it unavailable.
    ``expected_sentences`` (the test set size) makes an incomplete translation an error.
    ``limits``: each sentence's decoding length limit in subwords (see :func:`runaways`).
    """
    if expected_sentences is not None:
        check_complete(translations, expected_sentences)
    if any(t.reference is None for t in translations):
        missing = next(t.id for t in translations if t.reference is None)
        raise ScoringError(f"no reference (T-{missing} line) for hypothesis H-{missing}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    detok_lang = detok_lang or target_lang
    hyps = [t.hypothesis for t in translations]
    refs = [t.reference for t in translations]
    detok_hyps = detokenize(hyps, detok_lang)
    base.write_lines(out / f"hyps.tok.{target_lang}", hyps)
    base.write_lines(out / f"refs.tok.{target_lang}", refs)
    base.write_lines(out / f"hyps.detok.{target_lang}", detok_hyps)

    tok_score, tok_signature = tokenized_bleu(hyps, refs)
    results: Dict[str, Any] = {
        "bleu_tokenized": tok_score.score,
        "bleu_tokenized_details": str(tok_score),
        "bleu_tokenized_signature": tok_signature,
        "bleu_tokenized_convention": TOKENIZED_CONVENTION,
        "sacrebleu": None,
        "sacrebleu_signature": None,
        "chrf": None,
        "chrf_signature": None,
        "runaways": runaways(translations, limits),
    }
    raw_refs, unavailable = _raw_references(raw_reference, translations)
    if raw_refs is None:
        results["sacrebleu_unavailable"] = unavailable
    else:
        score, signature = sacrebleu_score(detok_hyps, raw_refs)
        chrf, chrf_signature = chrf_score(detok_hyps, raw_refs)
        results.update(
            sacrebleu=score.score, sacrebleu_details=str(score), sacrebleu_signature=signature,
            chrf=chrf, chrf_signature=chrf_signature,
        )
    results.update(
        num_sentences=len(translations),
        target_lang=target_lang,
        detok_lang=detok_lang,
        raw_reference=str(raw_reference) if raw_reference is not None else None,
        **(metadata or {}),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    base.write_json(out / "results.json", results)  # last: its presence marks a finished evaluation
    return results


def _raw_references(
    path: Optional[PathLike], translations: Sequence[Translation]
) -> Tuple[Optional[List[str]], Optional[str]]:
    """(references in translation order, None) or (None, why they are unavailable)."""
    if path is None:
        return None, "no raw (untokenized) reference file given"
    if not Path(path).is_file():
        return None, f"raw (untokenized) reference file {path} not found"
    lines = read_lines(path)
    ids = [t.id for t in translations]
    if ids != list(range(len(lines))):
        raise ScoringError(
            f"{path} has {len(lines)} lines but the generate output has {len(ids)} sentences "
            f"(ids {ids[0]}..{ids[-1]}); every test sentence must be translated exactly once"
        )
    return lines, None


def summary(results: Dict[str, Any]) -> str:
    """Two lines: tokenized compound-split BLEU, then sacreBLEU with its signature."""
    lines = [f"BLEU (tokenized, compound-split): {results['bleu_tokenized']:.2f}"]
    if results.get("sacrebleu") is None:
        lines.append(f"sacreBLEU (detokenized): unavailable ({results.get('sacrebleu_unavailable')})")
    else:
        lines.append(
            f"sacreBLEU (detokenized): {results['sacrebleu']:.2f}  {results['sacrebleu_signature']}"
        )
        lines.append(f"chrF (detokenized): {results['chrf']:.2f}  {results['chrf_signature']}")
    run = results.get("runaways")
    if run:
        limit = "" if run["at_length_limit"] is None else f", {run['at_length_limit']} at the length limit"
        lines.append(f"runaways: {run['longer_than_ratio']} longer than {run['ratio']}x the reference{limit}")
    return "\n".join(lines)


def decoding_settings(command: Sequence[str]) -> Dict[str, Any]:
    """The decoding options of a fairseq-generate command line (argparse: last occurrence wins)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--beam", type=int, default=5)  # fairseq's defaults
    parser.add_argument("--lenpen", type=float, default=1.0)
    parser.add_argument("--nbest", type=int, default=1)
    parser.add_argument("--remove-bpe", nargs="?", const="@@ ", default=None)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--max-len-a", type=float, default=0.0)
    parser.add_argument("--max-len-b", type=int, default=200)
    parser.add_argument("--gen-subset", default="test")
    known, _ = parser.parse_known_args(list(command))
    return {**vars(known), "command": list(command)}


def _absolute(path: Optional[str]) -> Optional[str]:
    return str(Path(path).resolve()) if path is not None else None



def main(argv: Optional[Sequence[str]] = None) -> int:
    own, command = split_passthrough(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_rope.evaluation.scoring",
        description="Score fairseq-generate output: tokenized compound-split BLEU and sacreBLEU.",
        epilog="Arguments after '--' are the fairseq-generate command that produced the "
        "output; its decoding settings are recorded in results.json.",
    )
    parser.add_argument("generate_output", nargs="?", help="fairseq-generate output (generate-<subset>.txt)")
    parser.add_argument("--out-dir", help="where hyps.*, refs.* and results.json go")
    parser.add_argument("--check", action="store_true",
                        help="only check --data-bin's subset (references included) and --raw-ref, then exit")
    parser.add_argument("--data-bin", help="fairseq-preprocess directory (target language, raw refs)")
    parser.add_argument("--subset", default="test", help="generated subset (default: test)")
    parser.add_argument("--target-lang", help="default: inferred from --data-bin")
    parser.add_argument("--raw-ref", help="untokenized references (default: DATA_BIN/../raw/SUBSET.TGT)")
    parser.add_argument("--detok-lang", help="Moses detokenizer language (default: target language)")
    parser.add_argument("--checkpoint", help="checkpoint that was decoded (recorded)")
    parser.add_argument("--averaged-checkpoints", nargs="*", default=[],
                        help="checkpoints averaged into --checkpoint (recorded)")
    parser.add_argument("--engine", default="fairseq",
                        help="what decoded: fairseq (fairseq-generate, default) or ctranslate2 (recorded)")
    parser.add_argument("--engine-info", action="append", default=[], metavar="KEY=VALUE",
                        help="more about the engine (version, quantization, ...; recorded)")
    args = parser.parse_args(own)

    if args.check and args.data_bin is None:
        parser.error("--check needs --data-bin")
    if not args.check and (args.generate_output is None or args.out_dir is None):
        parser.error("GENERATE_OUTPUT and --out-dir are required")
    try:
        if args.target_lang is None and args.data_bin is None:
            parser.error("--target-lang or --data-bin is required")
        expected = None
        target_lang = args.target_lang
        limits = None
        if args.data_bin is not None:
            source_lang, inferred = check_test_set(args.data_bin, args.subset)
            target_lang = target_lang or inferred
            expected = subset_size(args.data_bin, args.subset, source_lang, inferred)
            if command:
                decoding = decoding_settings(command)
                sources = subword_lengths(args.data_bin, args.subset, source_lang, inferred, source_lang)
                limits = length_limits(sources, decoding["max_len_a"], decoding["max_len_b"])
        raw_ref = args.raw_ref
        if raw_ref is not None and not Path(raw_ref).is_file():
            raise ScoringError(f"--raw-ref {raw_ref}: no such file")
        if raw_ref is None and args.data_bin is not None:
            raw_ref = default_raw_reference(args.data_bin, args.subset, target_lang)
        if args.check:
            if raw_ref is not None and Path(raw_ref).is_file() and expected is not None:
                check_raw_reference(raw_ref, expected)
            return 0
        metadata = {
            "subset": args.subset,
            "data": _absolute(args.data_bin),
            "checkpoint": _absolute(args.checkpoint),
            "averaged_checkpoints": [_absolute(p) for p in args.averaged_checkpoints],
            "generate_output": _absolute(args.generate_output),
            "decoding": decoding_settings(command) if command else None,
            "engine": {"name": args.engine, **dict(item.partition("=")[::2] for item in args.engine_info)},
        }
        results = evaluate_translations(
            read_generate_output(args.generate_output),
            args.out_dir,
            target_lang,
            raw_reference=raw_ref,
            detok_lang=args.detok_lang,
            metadata=metadata,
            expected_sentences=expected,
            limits=limits,
        )
    except (FairseqRopeError, OSError) as e:
        return report_error(e)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
