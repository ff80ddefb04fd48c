"""Answers from a model's memory (service/model/memory.py), consulted before the model.

A text whose source the memory knows is answered with the memory's targets, in the memory's order.
Each keeps everything an answer has: the model's forced pass over the target (what `Align`
computes: service/decode/align/aligner.py) gives its token log-probabilities, its confidence and its
attention matrices, so clients and the explorer see the same shapes whatever the origin. An n_best
beyond the memory's targets is filled by the model's own hypotheses (those not already given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from service.decode.align.forced import AlignedPair, AlignOptions
from service.decode.align.pair_answers import prepare_pair
from service.decode.engine.text_side import TextSide
from service.decode.shared.alignment import Alignment
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import normalized_score
from service.decode.text.preparation import Prepared
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation, TranslationHypothesis
from service.model import languages

FORCED = AlignOptions(links="argmax", matrices="both")  # the pass behind a memory's answer


def consulted(engine: TextSide, options: SearchOptions) -> bool:
    return bool(
        len(engine.memory)
        and options.use_memory
        and not options.target_prefix
        and not options.return_alternatives
        and not options.glossary
    )


def keyed(text: str, language: str) -> str:
    """A source as a multilingual model's memory holds it: its target language's >>xxx<< token
    first (service/model/languages.py), so each language has its own entries; as is where the
    text already begins with it, or no language is asked for."""
    if not language or languages.leading(text) is not None:
        return text
    return f"{languages.token(language)} {text}"


def remembered(engine: TextSide, text: str, keep: int) -> list[tuple[str, PreparedPair]]:
    """The memory's first `keep` targets for text, each with the pair its forced pass reads. A
    memory's entries are checked at load (TextSide.read_memory); a target whose pair would still be
    refused is left to the model: a memory never turns a valid request into an error."""
    out = []
    for target in engine.recall(text)[:keep]:
        try:
            out.append((target, prepare_pair(engine, text, target)))
        except InvalidInput:
            continue
    return out


def memory_hypothesis(
    engine: TextSide,
    aligned: AlignedPair,
    pair: PreparedPair,
    options: SearchOptions,
    alignment: AlignmentMode,
    target: str,
) -> TranslationHypothesis:
    """A memory target as a hypothesis: the model's log-probabilities and matrices for it. The
    target is the memory's as written; what the vocabulary cannot spell is marked (the tokens'
    unknown_tokens, the matrix's unknown_target_tokens), as Align marks it."""
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
        unknown_tokens=tuple(aligned.unknown_target_tokens),
        origin="memory",
        surfaces=pair.tgt.written_surfaces(),
    )


def answer(
    source: str,
    source_tokens: list[str],
    remembered: list[TranslationHypothesis],
    decoded: Translation | None,
    n_best: int,
) -> Translation:
    """The memory's hypotheses first, then the model's (those not already given), n_best in all;
    the model's answer as it is where the memory has nothing."""
    if not remembered and decoded is not None:
        return decoded
    given = {h.text for h in remembered}
    model = [h for h in (decoded.hypotheses if decoded else []) if h.text not in given]
    hypotheses = (remembered + model)[: max(n_best, 1)] if remembered else model[:n_best]
    return Translation(source=source, source_tokens=source_tokens, hypotheses=hypotheses)


# --- a request's plan: what the model decodes, what the memory answers ----------------------------


@dataclass(frozen=True)
class Forced:
    """One memory target to score: text `text`'s segment `segment` (-1: the whole text)."""

    text: int
    segment: int
    target: str
    pair: PreparedPair


@dataclass
class Plan:
    """What a request needs: texts the model decodes whole, segments it decodes alone (a segmented
    input some of whose segments the memory knows: each segment is looked up), and memory targets
    the forced pass scores."""

    whole: list[int] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)  # (text, segment)
    forced: list[Forced] = field(default_factory=list)
    segmented: set[int] = field(default_factory=set)  # texts answered segment by segment

    def segment_sentences(self, prepared: Sequence[Prepared]) -> list[Prepared]:
        return [prepared[t].segments[k] for t, k in self.segments]


def plan(
    engine: TextSide, texts: Sequence[str], prepared: Sequence[Prepared], options: SearchOptions
) -> Plan:
    keep = max(options.n_best, 1)
    out = Plan()
    use = consulted(engine, options)
    for i, text in enumerate(texts):
        # a text the standing glossary has terms for is the model's: it keeps them
        targets = (
            remembered(engine, keyed(text, prepared[i].language), keep)
            if use
            and not any(
                prepared[i].constraints or engine.terms.part_constraints(prepared[i], options)
            )
            else []
        )
        out.forced += [Forced(i, -1, t, p) for t, p in targets]
        if len(targets) < keep:
            parts = prepared[i].segments
            found = (
                [remembered(engine, keyed(seg.text, seg.language), keep) for seg in parts]
                if use and parts
                else []
            )
            if not targets and any(found):
                out.segmented.add(i)
                for k, seg_targets in enumerate(found):
                    if len(seg_targets) < keep:
                        out.segments.append((i, k))
                    out.forced += [Forced(i, k, t, p) for t, p in seg_targets]
            else:
                out.whole.append(i)
    return out


def raw(alignment: AlignmentMode) -> AlignmentMode:
    """The alignment segments are decoded with: raw subword matrices, joined afterwards."""
    return "none" if alignment == "none" else "subword"


def assemble(
    engine: TextSide,
    the_plan: Plan,
    texts: Sequence[str],
    prepared: Sequence[Prepared],
    whole: Sequence[Translation],
    segments: Sequence[Translation],
    aligned: Sequence[AlignedPair],
    options: SearchOptions,
    alignment: AlignmentMode,
) -> list[Translation]:
    """The request's translations from the model's and the memory's results, in text order."""
    by_text = dict(zip(the_plan.whole, whole, strict=True))
    by_segment = dict(zip(the_plan.segments, segments, strict=True))
    remembered: dict[tuple[int, int], list[TranslationHypothesis]] = {}
    for f, a in zip(the_plan.forced, aligned, strict=True):
        mode = raw(alignment) if f.segment >= 0 else alignment
        hyp = memory_hypothesis(engine, a, f.pair, options, mode, f.target)
        remembered.setdefault((f.text, f.segment), []).append(hyp)
    out = []
    for i, text in enumerate(texts):
        sentence = prepared[i]
        if i not in the_plan.segmented:
            out.append(
                answer(
                    text,
                    sentence.pieces,
                    remembered.get((i, -1), []),
                    by_text.get(i),
                    options.n_best,
                )
            )
            continue
        parts = [
            answer(seg.text, seg.pieces, remembered.get((i, k), []), by_segment.get((i, k)), options.n_best).hypotheses
            for k, seg in enumerate(sentence.segments)
        ]  # fmt: skip
        out.append(join_segments(engine, sentence, parts, alignment, options.n_best))
    return out


def join_segments(
    engine: TextSide,
    sentence: Prepared,
    parts: list[list[TranslationHypothesis]],
    alignment: AlignmentMode,
    n_best: int,
) -> Translation:
    """Each segment's hypotheses (raw subword matrices) joined into the input's, as the engine
    joins a segmented input; origin "mixed" where the memory gave some segments only."""
    mode = engine.alignment_mode_for(alignment)
    count = min(max(len(p) for p in parts), max(n_best, 1))
    hypotheses = []
    for i in range(count):
        chosen = [p[min(i, len(p) - 1)] for p in parts]
        origins = {h.origin for h in chosen}
        joined = engine.results.join_hypotheses(chosen, sentence, mode)
        hypotheses.append(replace(joined, origin=origins.pop() if len(origins) == 1 else "mixed"))
    return Translation(source=sentence.text, source_tokens=sentence.pieces, hypotheses=hypotheses)
