"""CTranslate2's beam search set up to decode as fairseq-generate does.

fairseq's ``SequenceGenerator`` with ``--beam B --lenpen P --max-len-a A --max-len-b L``
(the tables': :data:`TABLE_DECODING`) and CTranslate2's
``translate_batch`` share the algorithm: 2B candidates per step, finished (EOS) ones among
the best B kept aside, the search of a sentence over once B hypotheses are finished, the best
one by score / length^P (EOS counted in the length). The options below close the gaps:

* ``return_end_token=True``: CTranslate2 then counts the EOS in the length penalty, as fairseq
  does (without it, a hypothesis of n tokens is divided by n^P, fairseq's by (n+1)^P); the
  EOS is stripped from the tokens here;
* the length limit: fairseq stops at ``int(A * source length + L)`` tokens, the source length
  counting its EOS (fairseq takes the longest source of its batch; here each sentence its own,
  so with A > 0 this is the lower of the two), capped by a position table; sentences are
  decoded in groups of one limit (one group with A = 0). At the limit fairseq forces an EOS
  and scores it, CTranslate2 just stops: hypotheses that reach the limit get the EOS's
  log-probability added and their score recomputed here (:func:`_best_at_limit`: the
  sentences at the limit decoded again in one call, their open hypotheses scored in one);
* ``suppress_sequences=[[pad]]``: fairseq never emits ``<pad>``;
* the source bound: a sentence's source is cut here to :func:`max_source_subwords` subwords
  (the export's ``max_source_positions`` less its EOS, else :data:`DEFAULT_MAX_SOURCE_POSITIONS`
  less one), and CTranslate2 gets ``max_input_length=0``, so that the search and the re-scoring
  at the limit see the same source; the hypothesis says so (``source_truncated``). Without a
  bound, one "word" of thousands of subwords costs quadratically more than text of its size;
* ``min_decoding_length=1``: no empty translation, as fairseq's ``--min-len 1``.

What remains: CTranslate2 masks tokens *before* its softmax, fairseq after, so its
probabilities are renormalised without ``<pad>`` at every step and without EOS at the first
one. Both change a hypothesis' score by a tiny amount (log(1 − p(pad)), log(1 − p(EOS)) at
step 0), not its tokens; docs/deploy.md gives the agreement measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fairseq_rope_serve.model_dir import ModelDirectory

#: The paper's decoding (fairseq's default length limit: 0 x source + 200 subwords): what the
#: tables decode with (fairseq-rope imports it from here) and what an export is served with.
TABLE_DECODING: Dict[str, Any] = {"beam": 4, "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200}


@dataclass(frozen=True)
class Decoding:
    """fairseq-generate's decoding options (``--beam``, ``--lenpen``, ``--max-len-a/-b``)."""

    beam: int = TABLE_DECODING["beam"]
    lenpen: float = TABLE_DECODING["lenpen"]
    max_len_a: float = TABLE_DECODING["max_len_a"]
    max_len_b: int = TABLE_DECODING["max_len_b"]

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "Decoding":
        return cls(**{k: settings[k] for k in ("beam", "lenpen", "max_len_a", "max_len_b") if k in settings})


@dataclass(frozen=True)
class Hypothesis:
    """A sentence's hypothesis: subword tokens (no EOS) and fairseq's score
    (Σ log p over the tokens and EOS, divided by (tokens + 1)^lenpen; natural log).
    ``source_truncated``: its source was longer than :func:`max_source_subwords` and cut."""

    tokens: List[str]
    score: float
    source_truncated: bool = False


#: The source bound of a model without a position table (positions counted with the EOS, as
#: fairseq's ``max_source_positions``): fairseq's default, near what the models are trained on.
DEFAULT_MAX_SOURCE_POSITIONS = 1024


def max_source_subwords(model: ModelDirectory) -> int:
    """Subwords of one source sentence the model is given (more are cut): its position
    table's size (or :data:`DEFAULT_MAX_SOURCE_POSITIONS`) less the EOS."""
    return max((model.max_source_positions or DEFAULT_MAX_SOURCE_POSITIONS) - 1, 1)


def length_limit(source_tokens: int, decoding: Decoding, max_target_positions: Optional[int]) -> int:
    """Most tokens before EOS, fairseq's ``int(max_len_a * source length + max_len_b)``, for a
    source of ``source_tokens`` subwords (its EOS is added here, as fairseq counts it)."""
    limit = int(decoding.max_len_a * (source_tokens + 1) + decoding.max_len_b)
    if max_target_positions is not None:  # fairseq: min(…, model.max_decoder_positions() - 1)
        limit = min(limit, max_target_positions - 1)
    return max(limit, 1)


def translate_options(decoding: Decoding, model: ModelDirectory) -> Dict[str, Any]:
    """``translate_batch`` keyword arguments (all but the length limit) for fairseq's decoding."""
    return {
        "beam_size": decoding.beam,
        "length_penalty": decoding.lenpen,
        "num_hypotheses": decoding.beam,
        "return_scores": True,
        "return_end_token": True,  # tells the hypotheses stopped by the limit (no EOS)
        "min_decoding_length": 1,
        "suppress_sequences": [[model.pad_token]],
        "max_input_length": 0,  # the sources come cut to max_source_subwords (translate_nbest)
        "patience": 1.0,
    }


def translate(translator, sources: Sequence[List[str]], decoding: Decoding, model: ModelDirectory,
              max_batch_size: int = 0, batch_type: str = "examples",
              limit_lengths: Optional[Sequence[int]] = None) -> List[Hypothesis]:
    """Best hypothesis of each subword-token source (without EOS), in input order.

    ``limit_lengths``: the source length (subwords, EOS not included) each sentence's length
    limit is computed from; default its own. fairseq-generate takes the longest source of the
    sentence's batch: fairseq-rope's ``fairseq_rope.deploy.generate`` passes that, batching as it does.
    """
    return [hypotheses[0] for hypotheses in translate_nbest(translator, sources, decoding, model, max_batch_size,
                                                            batch_type, limit_lengths)]


def translate_nbest(translator, sources: Sequence[List[str]], decoding: Decoding, model: ModelDirectory,
                    max_batch_size: int = 0, batch_type: str = "examples",
                    limit_lengths: Optional[Sequence[int]] = None) -> List[List[Hypothesis]]:
    """The hypotheses of each source, best first (the best is :func:`translate`'s; up to
    ``beam`` of them), in input order. Sources are cut to :func:`max_source_subwords`."""
    options = translate_options(decoding, model)
    bound = max_source_subwords(model)
    cut = [list(s[:bound]) for s in sources]
    lengths = [len(s) for s in cut] if limit_lengths is None else [min(n, bound) for n in limit_lengths]
    groups: Dict[int, List[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(length_limit(n, decoding, model.max_target_positions), []).append(i)
    nbest: List[List[Hypothesis]] = [[] for _ in sources]
    for limit, indices in sorted(groups.items()):
        batch = [cut[i] for i in indices]
        results = translator.translate_batch(batch, max_decoding_length=limit, max_batch_size=max_batch_size,
                                             batch_type=batch_type, **options)
        at_limit = []
        for i, result in zip(indices, results):
            if all(tokens[-1:] == [model.eos_token] for tokens in result.hypotheses):
                nbest[i] = [Hypothesis(tokens[:-1], score) for tokens, score in zip(result.hypotheses, result.scores)]
            else:
                at_limit.append(i)
        if at_limit:
            for i, hypotheses in zip(at_limit, _best_at_limit(translator, [cut[i] for i in at_limit], limit, options,
                                                              decoding, model.eos_token, max_batch_size, batch_type)):
                nbest[i] = hypotheses
    return [[replace(h, source_truncated=len(source) > bound) for h in hypotheses]
            for source, hypotheses in zip(sources, nbest)]


def _best_at_limit(translator, sources: List[List[str]], limit: int, options: Mapping[str, Any],
                   decoding: Decoding, eos: str, max_batch_size: int = 0,
                   batch_type: str = "examples") -> List[List[Hypothesis]]:
    """fairseq's choice for sentences whose search reached the length limit: their
    hypotheses, best first.

    fairseq forces an EOS at the limit and scores it; CTranslate2 registers the hypotheses as
    they are, and may return them instead of better-scoring finished ones. So the sentences are
    decoded again with every finished hypothesis kept (patience 2: the beams move as before,
    the search just goes on), and fairseq's finished list rebuilt from them: by the step
    they finished at, then by fairseq's candidate score (Σ log p), the first ``beam`` ones;
    those at the limit get their EOS's log-probability. The best of those by score / (tokens +
    1)^lenpen is fairseq's. (fairseq's hypotheses at the limit come from its 2B candidates of
    the step before, these from the best B of them: a difference only where a lower candidate
    would win once its EOS is scored.) One ``translate_batch`` call for all the sentences and
    one ``score_batch`` call for all their open hypotheses: each encodes a source once per
    example, so a call per hypothesis cost a whole encoding each (most of the time of a long
    source, measured).
    """
    lenpen = decoding.lenpen
    results = translator.translate_batch(
        sources, max_decoding_length=limit, max_batch_size=max_batch_size, batch_type=batch_type,
        **{**options, "patience": 2.0, "num_hypotheses": 2 * decoding.beam})
    open_ = [(s, tokens) for s, result in enumerate(results) for tokens in result.hypotheses if tokens[-1:] != [eos]]
    scored = translator.score_batch([sources[s] for s, _ in open_], [tokens for _, tokens in open_],
                                    max_input_length=0, max_batch_size=max_batch_size,
                                    batch_type=batch_type) if open_ else []
    eos_log_probs = {(s, tuple(tokens)): score.log_probs[-1] for (s, tokens), score in zip(open_, scored)}
    out = []
    for s, result in enumerate(results):
        finished = []  # (finishing step, -candidate score, hypothesis)
        for tokens, score in zip(result.hypotheses, result.scores):
            if tokens[-1:] == [eos]:
                raw = score * len(tokens) ** lenpen  # CTranslate2 counts the EOS in the length, as fairseq
                finished.append((len(tokens) - 1, -raw, Hypothesis(tokens[:-1], score)))
            else:
                raw = score * len(tokens) ** lenpen + eos_log_probs[s, tuple(tokens)]
                finished.append((len(tokens), -raw, Hypothesis(list(tokens), raw / (len(tokens) + 1) ** lenpen)))
        kept = [h for *_, h in sorted(finished, key=lambda f: f[:2])][:decoding.beam]
        # sorted() is stable: of equal scores the first kept stays first, as max() chose before.
        out.append(sorted(kept, key=lambda h: -h.score))
    return out


def to_base2(score: float) -> float:
    """fairseq-generate prints scores in base 2."""
    return score / math.log(2)
