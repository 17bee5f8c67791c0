"""An exported model with its text processing: raw source lines in, detokenized lines out.

Each line goes through what the project's data preparation and evaluation do to text, with
the settings and BPE codes saved in the model directory by ``fairseq-rope-export-ct2``:

1. Moses punctuation normalization, non-printing characters removed, Moses tokenization
   (:func:`fairseq_rope_serve.text.preprocess_line`, as ``fairseq-rope-prepare``);
2. subword-nmt BPE with the model's codes (:func:`fairseq_rope_serve.bpe.apply_subword_nmt`);
3. CTranslate2 beam search decoding as fairseq-generate does (:mod:`fairseq_rope_serve.decoding`;
   beam 4, length penalty 0.6 and the length limit of the tables unless told otherwise);
4. BPE removed as fairseq's ``--remove-bpe`` does, then Moses detokenization for the target
   language (:func:`fairseq_rope_serve.text.detokenize`, as the sacreBLEU score).

An empty (or blank) line gives an empty line. Each sentence is translated on its own (its
own length limit, its own search): a translation does not depend on the other lines of the
call, which is what lets the server batch concurrent requests together. A line of more
subwords than the model's bound (:func:`fairseq_rope_serve.decoding.max_source_subwords`:
the export's ``max_source_positions`` less one, else 1,023) is cut there, and
:meth:`TextTranslator.translate_full` says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from itertools import islice
from types import ModuleType
from typing import Iterable, Iterator, List, Optional, Sequence

from fairseq_rope_serve.bpe import apply_subword_nmt, remove_bpe
from fairseq_rope_serve.common import DeployError, PathLike
from fairseq_rope_serve.decoding import Decoding
from fairseq_rope_serve.decoding import Hypothesis, translate_nbest
from fairseq_rope_serve.model_dir import ModelDirectory
from fairseq_rope_serve.text import detokenize, preprocess_line

#: The range with rotary embeddings in encoders (rotary_dim on TransformerEncoderSpec).
CTRANSLATE2_REQUIREMENT = "ctranslate2>=4.6.3,<5"
#: Lines read, translated and written at a time (CTranslate2 sorts each chunk by length).
CHUNK_LINES = 2000


@dataclass(frozen=True)
class Translation:
    """A line's translation, the others of its beam asked for (best first, each distinct from
    ``text`` and from each other) and whether its source was cut to the model's bound."""

    text: str
    alternatives: List[str] = field(default_factory=list)
    truncated: bool = False


def require_ctranslate2() -> ModuleType:
    """The ``ctranslate2`` module, or a :class:`DeployError` saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise DeployError(
            f"CTranslate2 is not installed: pip install '{CTRANSLATE2_REQUIREMENT}' "
            "(a dependency of fairseq-rope-serve, which fairseq-rope installs)"
        ) from None
    return ctranslate2


def load_translator(model_dir: PathLike, threads: int = 1, device: str = "cpu", compute_type: str = "default",
                    inter_threads: int = 1):
    """A CTranslate2 translator of ``model_dir`` on ``device``: ``inter_threads`` batches at once,
    each on ``threads`` CPU threads."""
    ctranslate2 = require_ctranslate2()
    try:
        return ctranslate2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                      intra_threads=threads, inter_threads=inter_threads)
    except (RuntimeError, ValueError) as e:
        raise DeployError(f"cannot load {model_dir} with CTranslate2 on {device} ({compute_type}): {e}") from None


class TextTranslator:
    """An exported model with its text processing: raw source lines in, detokenized lines out.

    :meth:`translate` may be called from several threads at once (``inter_threads`` of them
    decode in parallel)."""

    def __init__(self, model_dir: PathLike, threads: int = 0, device: str = "cpu",
                 compute_type: str = "default", beam: Optional[int] = None, lenpen: Optional[float] = None,
                 max_batch_size: int = 64, inter_threads: int = 1) -> None:
        self.settings = ModelDirectory.read(model_dir)
        self.codes = str(self.settings.codes_path(model_dir))
        decoding = Decoding.from_settings(self.settings.decoding)
        self.decoding = Decoding(beam or decoding.beam, decoding.lenpen if lenpen is None else lenpen,
                                 decoding.max_len_a, decoding.max_len_b)
        self.translator = load_translator(model_dir, threads, device, compute_type, inter_threads)
        self.max_batch_size = max_batch_size
        #: Lines translated cut to the model's bound so far (the translate command warns of them).
        self.lines_cut = 0
        self._lock = threading.Lock()

    def subwords(self, lines: Sequence[str]) -> List[List[str]]:
        """Normalized, tokenized and BPE-segmented source lines, as subword lists."""
        tokenized = [preprocess_line(line, self.settings.source_lang) for line in lines]
        return [line.split() for line in apply_subword_nmt(tokenized, self.codes)]

    def translate(self, lines: Sequence[str]) -> List[str]:
        """Translations of raw source ``lines``, one per line."""
        return [t.text for t in self.translate_full(lines)]

    def translate_full(self, lines: Sequence[str], alternatives: Sequence[int] = ()) -> List[Translation]:
        """:class:`Translation` of each raw source line, with up to ``alternatives[i]`` other
        translations of line ``i`` (default none; at most ``beam - 1``: the beam's hypotheses)."""
        sources = self.subwords(lines)
        todo = [i for i, s in enumerate(sources) if s]
        nbest = translate_nbest(self.translator, [sources[i] for i in todo], self.decoding, self.settings,
                                max_batch_size=self.max_batch_size)
        wanted = [alternatives[i] if i < len(alternatives) else 0 for i in todo]
        # Detokenized at once (one Moses call): the best, then the alternatives asked for.
        chosen: List[Hypothesis] = [hypotheses[0] for hypotheses in nbest]
        for hypotheses, n in zip(nbest, wanted):
            chosen.extend(hypotheses[1:1 + max(0, n)])
        texts = detokenize([remove_bpe(h.tokens, self.settings.bpe_separator) for h in chosen],
                           self.settings.target_lang)
        out = [Translation("") for _ in lines]
        others = iter(texts[len(todo):])
        for i, text, hypotheses, n in zip(todo, texts, nbest, wanted):
            rest = [next(others) for _ in hypotheses[1:1 + max(0, n)]]
            distinct = [t for k, t in enumerate(rest) if t != text and t not in rest[:k]]
            out[i] = Translation(text, distinct, hypotheses[0].source_truncated)
        with self._lock:
            self.lines_cut += sum(t.truncated for t in out)
        return out

    def translate_chunks(self, lines: Iterable[str], chunk_lines: Optional[int] = None) -> Iterator[List[str]]:
        """:meth:`translate` over an iterable of any length, ``chunk_lines`` (default
        :data:`CHUNK_LINES`) at a time: the translations of each chunk."""
        lines = iter(lines)
        while True:
            chunk = list(islice(lines, chunk_lines or CHUNK_LINES))
            if not chunk:
                return
            yield self.translate(chunk)
