"""fairseq-generate for an exported model: a binarized subset decoded with CTranslate2.

``python -m fairseq_rope.deploy.generate MODEL_DIR DATA_BIN [--gen-subset test] [--beam 4]
[--lenpen 0.6] [--max-len-a 0] [--max-len-b 200] [--max-tokens 8192] [--threads N]
[--device cpu] [--compute-type default] > generate-test.txt``

The output has fairseq-generate's format (``S-``, ``T-``, ``H-``, ``D-``, ``P-`` lines, BPE
removed, scores in base 2, ``<<unk>>`` in references), so that
:mod:`fairseq_rope.evaluation.scoring` scores it as it scores fairseq-generate's, and the
option names are fairseq-generate's, so that the command line records the decoding the same
way. ``P-`` lines are the hypotheses' forced-decoding log-probabilities (EOS included), by
CTranslate2. Sentences are batched as fairseq-generate batches them (``--max-tokens``, its
default ``--seed`` 1), which matters for the length limit only: with ``--max-len-a`` > 0,
fairseq takes the longest source of a batch.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, TextIO

from fairseq_rope_serve.decoding import TABLE_DECODING, Decoding, Hypothesis, max_source_subwords, to_base2, translate
from fairseq_rope_serve.model_dir import ModelDirectory
from fairseq_rope_serve.translator import load_translator

from fairseq_rope.base import FairseqRopeError, PathLike, report_error
from fairseq_rope.deploy import DeployError

#: Target tokens per forced-decoding batch of the ``P-`` scores. Its logits are (tokens ×
#: vocabulary) floats: at --max-tokens 8192 and 9,656 types the scoring pass peaked at
#: 2.6 GiB, 2.7× the beam search's own peak (measured on multi30k). The scores do not depend
#: on the batch.
SCORE_BATCH_TOKENS = 1024
#: fairseq-generate's ``--seed`` default, which orders sentences of equal lengths in batches.
FAIRSEQ_SEED = 1


@dataclass
class Subset:
    """A binarized subset as subword strings, and what fairseq's batching makes of it."""

    source_dictionary: object
    target_dictionary: object
    sources: List[List[str]]  # subwords, no EOS
    targets: List[List[int]]  # token ids, no EOS
    #: Source length (no EOS) each sentence's length limit is computed from: its batch's longest.
    limit_lengths: List[int]

    def __len__(self) -> int:
        return len(self.sources)

    def target_tokens(self, hypotheses: Sequence[Hypothesis]) -> int:
        """Subwords of the hypotheses, EOS included (what tokens/s counts)."""
        return sum(len(h.tokens) + 1 for h in hypotheses)


def read_subset(model_dir: PathLike, data_bin: PathLike, subset: str = "test", max_tokens: int = 8192) -> Subset:
    """``subset`` of ``data_bin`` for the model in ``model_dir``, whose dictionaries it must have."""
    from fairseq.data import Dictionary, LanguagePairDataset, data_utils

    settings = ModelDirectory.read(model_dir)
    src, tgt = settings.source_lang, settings.target_lang
    dictionaries = []
    for lang in (src, tgt):
        ours, theirs = Path(model_dir) / f"dict.{lang}.txt", Path(data_bin) / f"dict.{lang}.txt"
        if not theirs.is_file():
            raise DeployError(f"{theirs}: no such dictionary (is {data_bin} a fairseq-preprocess directory?)")
        if ours.read_bytes() != theirs.read_bytes():
            raise DeployError(f"{theirs} differs from the model's {ours}: {data_bin} was binarized with "
                              "another vocabulary than the model was trained on")
        dictionaries.append(Dictionary.load(str(ours)))
    sides = []
    for lang, dictionary in zip((src, tgt), dictionaries):
        prefix = Path(data_bin) / f"{subset}.{src}-{tgt}.{lang}"
        dataset = data_utils.load_indexed_dataset(str(prefix), dictionary)
        if dataset is None:
            raise DeployError(f"no binarized {subset} subset {prefix}.{{bin,idx}}")
        sides.append(dataset)
    pairs = LanguagePairDataset(sides[0], sides[0].sizes, dictionaries[0], sides[1], sides[1].sizes,
                                dictionaries[1], left_pad_source=True, shuffle=True)
    with data_utils.numpy_seed(FAIRSEQ_SEED):  # as fairseq's get_batch_iterator orders them
        indices = pairs.ordered_indices()
    limit_lengths = [0] * len(pairs)
    for batch in data_utils.batch_by_size(indices, pairs.num_tokens, max_tokens=max_tokens):
        longest = max(int(sides[0].sizes[i]) for i in batch)
        for i in batch:
            limit_lengths[i] = longest - 1  # sizes count the EOS
    source_dict, target_dict = dictionaries
    return Subset(
        source_dictionary=source_dict, target_dictionary=target_dict,
        sources=[[source_dict[t] for t in sides[0][i][:-1].tolist()] for i in range(len(pairs))],
        targets=[sides[1][i][:-1].tolist() for i in range(len(pairs))],
        limit_lengths=limit_lengths,
    )


def decode(translator, subset: Subset, decoding: Decoding, settings: ModelDirectory,
           max_tokens: int = 8192) -> List[Hypothesis]:
    """The best hypothesis of every sentence, as fairseq-generate decodes (the timed part), in
    batches of at most ``max_tokens`` source tokens, as fairseq-generate's ``--max-tokens``
    (CTranslate2 sorts the sentences by length and splits them)."""
    return translate(translator, subset.sources, decoding, settings, max_batch_size=max_tokens,
                     batch_type="tokens", limit_lengths=subset.limit_lengths)


def write_generate_output(out: TextIO, translator, subset: Subset, hypotheses: Sequence[Hypothesis],
                          settings: ModelDirectory, lenpen: float, remove_bpe: Optional[str] = "@@ ") -> None:
    """fairseq-generate's lines for each sentence, in id order. The scores are the model's own:
    Σ log p of the forced-decoded hypothesis (``P-``, EOS included) / (tokens + 1)^lenpen,
    without the renormalisation of CTranslate2's masked softmax (see
    ``fairseq_rope_serve.decoding``), given the source the search was given (cut to
    :func:`~fairseq_rope_serve.decoding.max_source_subwords`); ``S-`` is the whole source."""
    import torch

    source_dict, target_dict = subset.source_dictionary, subset.target_dictionary
    bound = max_source_subwords(settings)
    scored = translator.score_batch([s[:bound] for s in subset.sources], [h.tokens for h in hypotheses],
                                    max_input_length=0, max_batch_size=SCORE_BATCH_TOKENS, batch_type="tokens")
    for i, (hypothesis, positional) in enumerate(zip(hypotheses, scored)):
        source = source_dict.string(torch.tensor([source_dict.index(t) for t in subset.sources[i]]), remove_bpe)
        target = target_dict.string(torch.tensor(subset.targets[i]), remove_bpe, escape_unk=True)
        text = target_dict.string(torch.tensor([target_dict.index(t) for t in hypothesis.tokens]), remove_bpe)
        score = to_base2(sum(positional.log_probs) / len(positional.log_probs) ** lenpen)
        print(f"S-{i}\t{source}", file=out)
        print(f"T-{i}\t{target}", file=out)
        print(f"H-{i}\t{score}\t{text}", file=out)
        print(f"D-{i}\t{score}\t{text}", file=out)
        print(f"P-{i}\t{' '.join(f'{to_base2(p):.4f}' for p in positional.log_probs)}", file=out)


def generate(model_dir: PathLike, data_bin: PathLike, out: TextIO, subset: str = "test",
             decoding: Decoding = Decoding(), max_tokens: int = 8192, threads: int = 1,
             device: str = "cpu", compute_type: str = "default") -> List[Hypothesis]:
    """Decode ``subset`` of ``data_bin`` with the exported model into ``out`` (fairseq-generate's format)."""
    settings = ModelDirectory.read(model_dir)
    data = read_subset(model_dir, data_bin, subset, max_tokens)
    translator = load_translator(model_dir, threads, device, compute_type)
    start = time.perf_counter()
    hypotheses = decode(translator, data, decoding, settings, max_tokens)
    seconds = time.perf_counter() - start
    write_generate_output(out, translator, data, hypotheses, settings, decoding.lenpen)
    # fairseq-generate's summary line, word for word (the benchmark reads both the same way).
    tokens = data.target_tokens(hypotheses)
    print(f"Translated {len(data):,} sentences ({tokens:,} tokens) in {seconds:.1f}s "
          f"({len(data) / seconds:.2f} sentences/s, {tokens / seconds:.2f} tokens/s)", file=sys.stderr)
    return hypotheses


def generate_command(model_dir: PathLike, data_bin: PathLike, subset: str = "test",
                     settings=TABLE_DECODING, max_tokens: int = 8192, threads: int = 1,
                     compute_type: str = "default") -> List[str]:
    """This module's command line (as :func:`fairseq_rope.evaluation.decoding.generate_command`)."""
    return [sys.executable, "-m", "fairseq_rope.deploy.generate", str(model_dir), str(data_bin),
            "--gen-subset", subset, "--beam", str(settings["beam"]), "--lenpen", str(settings["lenpen"]),
            "--max-len-a", str(settings["max_len_a"]), "--max-len-b", str(settings["max_len_b"]),
            "--max-tokens", str(max_tokens), "--threads", str(threads), "--compute-type", compute_type]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_rope.deploy.generate",
        description="Decode a binarized subset with an exported CTranslate2 model, as fairseq-generate "
        "decodes, into fairseq-generate's output format (stdout).")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("--gen-subset", default="test")
    parser.add_argument("--beam", type=int, default=TABLE_DECODING["beam"])
    parser.add_argument("--lenpen", type=float, default=TABLE_DECODING["lenpen"])
    parser.add_argument("--max-len-a", type=float, default=TABLE_DECODING["max_len_a"])
    parser.add_argument("--max-len-b", type=int, default=TABLE_DECODING["max_len_b"])
    parser.add_argument("--max-tokens", type=int, default=8192, help="batching as fairseq-generate's")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default: 1)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--compute-type", default="default",
                        help="CTranslate2 compute type (default: the model's own; e.g. int8, float32)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    decoding = Decoding(args.beam, args.lenpen, args.max_len_a, args.max_len_b)
    try:
        generate(args.model_dir, args.data_bin, out, args.gen_subset, decoding, args.max_tokens,
                 args.threads, args.device, args.compute_type)
    except FairseqRopeError as e:
        return report_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
