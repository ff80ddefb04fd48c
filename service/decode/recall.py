"""Answers from a model's memory (service/model/memory.py), consulted before the model.

A text whose source the memory knows is answered with the memory's targets, in the memory's order.
Each keeps everything an answer has: the model's forced pass over the target (what `Align`
computes: service/decode/aligner.py) gives its token log-probabilities, its confidence and its
attention matrices, so clients and the explorer see the same shapes whatever the origin. An n_best
beyond the memory's targets is filled by the model's own hypotheses (those not already given).
"""

from __future__ import annotations

from collections.abc import Sequence

from service.decode.aligner import PreparedPair, align_prepared, prepare_pair
from service.decode.alignment import Alignment
from service.decode.beam import normalized_score
from service.decode.engine import AlignmentMode, Engine, Translation, TranslationHypothesis
from service.decode.forced import AlignedPair, AlignOptions
from service.decode.options import SearchOptions

FORCED = AlignOptions(links="argmax", matrices="both")  # the pass behind a memory's answer


def lookups(engine: Engine, texts: Sequence[str], options: SearchOptions) -> list[tuple[str, ...]]:
    """Each text's targets in the model's memory (() for none, or when the request turns the
    memory off or constrains the answer with a prefix or alternatives)."""
    if not options.use_memory or options.target_prefix or options.return_alternatives:
        return [() for _ in texts]
    return [engine.recall(text) for text in texts]


def memory_pairs(engine: Engine, text: str, targets: Sequence[str]) -> list[PreparedPair]:
    return [prepare_pair(engine, text, target) for target in targets]


def memory_hypothesis(
    engine: Engine,
    aligned: AlignedPair,
    pair: PreparedPair,
    options: SearchOptions,
    alignment: AlignmentMode,
    target: str,
) -> TranslationHypothesis:
    """A memory target as a hypothesis: the model's log-probabilities and matrices for it."""
    mode = engine.alignment_mode_for(alignment)
    matrix: Alignment | None = {"subword": aligned.subword, "word": aligned.word}.get(mode)
    steps = len(pair.tgt.ids) + 1  # the end of sentence included
    return TranslationHypothesis(
        text=target,
        tokens=list(aligned.target_tokens),
        token_ids=list(pair.tgt.ids),
        score=normalized_score(aligned.log_prob, steps, options),
        log_prob=aligned.log_prob,
        alignment=matrix,
        finished=True,
        confidence=aligned.confidence,
        low_confidence=aligned.confidence < engine.min_confidence,
        token_log_probs=tuple(aligned.token_log_probs),
        origin="memory",
    )


def answer(
    source: str,
    source_tokens: list[str],
    remembered: list[TranslationHypothesis],
    decoded: Translation | None,
    n_best: int,
) -> Translation:
    """The memory's hypotheses first, then the model's (those not already given), n_best in all."""
    given = {h.text for h in remembered}
    model = [h for h in (decoded.hypotheses if decoded else []) if h.text not in given]
    hypotheses = (remembered + model)[: max(n_best, 1)] if remembered else model[:n_best]
    return Translation(source=source, source_tokens=source_tokens, hypotheses=hypotheses)


def translate(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> list[Translation]:
    """`Engine.translate` with the memory consulted first (s2s-translate; the server does the same
    through its worker: service/serve/translator.py)."""
    found = lookups(engine, texts, options)
    keep = max(options.n_best, 1)
    need_model = [i for i, targets in enumerate(found) if len(targets[:keep]) < keep]
    decoded: dict[int, Translation] = {}
    if need_model:
        # (a memory is not consulted under a prefix: then every text is here, with its own)
        got = engine.translate([texts[i] for i in need_model], options, alignment)
        decoded = dict(zip(need_model, got, strict=True))
    out = []
    for i, text in enumerate(texts):
        targets = found[i][:keep]
        remembered: list[TranslationHypothesis] = []
        if targets:
            pairs = memory_pairs(engine, text, targets)
            aligned = align_prepared(engine, pairs, FORCED)
            remembered = [
                memory_hypothesis(engine, a, p, options, alignment, t)
                for a, p, t in zip(aligned, pairs, targets, strict=True)
            ]
        source_tokens = decoded[i].source_tokens if i in decoded else engine.prepare(text).pieces
        out.append(answer(text, source_tokens, remembered, decoded.get(i), options.n_best))
    return out
