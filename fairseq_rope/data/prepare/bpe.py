"""Joint subword models learned: subword-nmt BPE (default) or SentencePiece BPE.

Both are learned on the concatenated source and target training text, so one
joined fairseq dictionary covers both languages. Subword-nmt output marks
word-internal units with ``@@`` (undo with fairseq's ``--remove-bpe``),
SentencePiece output is pieces with ``▁`` word-start marks (``--remove-bpe
sentencepiece``). Applying them is the runtime's (``fairseq_rope_serve.bpe``), which
segments raw text for an exported model as the data were segmented.
"""

from __future__ import annotations

import io
import os
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Callable, List, Sequence

import sentencepiece as spm
from fairseq_rope_serve.bpe import apply_sentencepiece, apply_subword_nmt
from subword_nmt.learn_bpe import learn_bpe

from fairseq_rope.base import PathLike
from fairseq_rope.data.prepare.files import PrepareError, open_text
from fairseq_rope.data.prepare.multiproc import DEFAULT_CHUNK_LINES, imap_chunks

SUBWORD_NMT = "subword-nmt"
SENTENCEPIECE = "sentencepiece"
METHODS = (SUBWORD_NMT, SENTENCEPIECE)


def count_words(lines: Sequence[str]) -> Counter:
    """Whitespace-token frequencies of a chunk of lines."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(line.split())
    return counts


def learn_subword_nmt(
    train_files: Sequence[PathLike],
    codes: PathLike,
    vocab_size: int,
    *,
    workers: int = 1,
    chunk_lines: int = DEFAULT_CHUNK_LINES,
) -> int:
    """Learn joint BPE codes on ``train_files``; return the number of merges.

    ``total_symbols=True`` makes subword-nmt subtract the number of distinct
    (word-internal and word-final) characters from ``vocab_size``, so
    characters + merges ≈ ``vocab_size`` — the size of the joined dictionary.
    Learning stops earlier when no pair occurs twice (small corpora).
    """
    counts: Counter = Counter()
    for path in train_files:  # counting is the parallel part; merging is sequential
        for chunk_counts in imap_chunks(count_words, path, workers=workers, chunk_lines=chunk_lines,
                                        desc=f"count words {Path(path).name}"):
            counts.update(chunk_counts)
    # A "word count" dictionary sorted by (-count, word): learn_bpe breaks
    # frequency ties by input order, so this keeps it independent of chunking.
    vocab = io.StringIO("".join(f"{w} {c}\n" for w, c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))))
    with open_text(codes, "w") as out:
        if any(len(word) > 1 for word in counts):  # learn_bpe fails on an empty pair table
            learn_bpe(vocab, out, vocab_size, min_frequency=2, is_dict=True, total_symbols=True)
        else:
            out.write("#version: 0.2\n")
    with open_text(codes) as f:
        merges = sum(1 for line in f if not line.startswith("#version"))
    if not merges:
        # subword-nmt cannot even load a codes file without merges (it exits).
        symbols = {w[-1] for w in counts} | {c for w in counts for c in w[:-1]}
        raise PrepareError(
            f"subword-nmt learned no BPE merges for --vocab-size {vocab_size}: the training "
            f"text has {len(symbols)} distinct characters (word-internal and word-final), which "
            f"the vocabulary counts too, and no pair occurring twice beyond them; choose a "
            f"--vocab-size above {len(symbols)} (or --bpe sentencepiece)"
        )
    return merges


def learn_sentencepiece(
    train_files: Sequence[PathLike],
    model: PathLike,
    vocab: PathLike,
    vocab_size: int,
    *,
    workers: int = 1,
) -> int:
    """Train a joint SentencePiece BPE model on ``train_files``; return its number of pieces.

    ``hard_vocab_limit=False`` lets a small corpus end up with fewer pieces
    than asked instead of failing. Character coverage is 1.0 (two alphabetic
    languages), no BOS/EOS pieces (fairseq adds its own ``</s>``), and the
    whole training text is used (no sampling: deterministic).
    """
    prefix = Path(model).with_name(Path(model).name + "-train")
    spm.SentencePieceTrainer.train(
        input=[str(p) for p in train_files],
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        num_threads=max(1, workers),
    )
    os.replace(f"{prefix}.model", model)
    os.replace(f"{prefix}.vocab", vocab)
    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


def segmenter(method: str, model_file: PathLike) -> Callable[[Sequence[str]], List[str]]:
    """A picklable chunk function applying the learned model ``model_file`` of ``method``."""
    if method == SUBWORD_NMT:
        return partial(apply_subword_nmt, codes=str(model_file))
    return partial(apply_sentencepiece, model=str(model_file))
