"""Documents: a request's texts cut into sentences (`split_sentences`), each sentence decoded as a
sentence of its own in the running batch, and each text's answer joined back.

A text of 40 sentences is 40 sentences of the batch, not one sequence 40 sentences long: a model
trained on sentences answers each as it would alone (the same text, scores and matrices). The
join, for one text of sentences 1..n (service/model/sentences.py cuts them):
- hypothesis k is every sentence's k-th best (its last where it has fewer), as a segmented input's
  (service/model/segment.py);
- its text is the sentences' translations with the source's own whitespace between them, and
  before the first and after the last: newlines and indentation round-trip exactly;
- tokens, ids and token log-probabilities follow one another; score and log_prob are summed;
  confidence is the geometric-mean token probability over every sentence's tokens; finished when
  every sentence finished; low_confidence when any sentence is;
- the alignment is one matrix over the whole text, each sentence's block on the diagonal (links
  only within a sentence), its source tokens every sentence's;
- each sentence's place in the source (Translation.sentence_spans) and in the hypothesis's text,
  its score and confidence (TranslationHypothesis.sentence_*) let a client map one to the other.
A text the splitter leaves whole (or `split_sentences` off) is decoded as before, untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from service.decode.shared import alignment as align
from service.decode.shared.alignment import Alignment
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import Translation, TranslationHypothesis
from service.model.segment import geometric_mean_probability
from service.model.sentences import split_sentences

Span = tuple[int, int]


@dataclass(frozen=True)
class Cut:
    """A request's texts cut into sentences: `sentences[j]` is of text `owners[j]`, at
    `spans[owners[j]][k]` in it. A text decoded whole has spans None (its one sentence the text
    as sent)."""

    texts: list[str]
    sentences: list[str]
    owners: list[int]
    spans: list[list[Span] | None]

    @property
    def split(self) -> bool:
        """Whether any text was cut (or trimmed): else the sentences are the texts."""
        return any(s is not None for s in self.spans)

    def where(self, j: int) -> str:
        """How an error names sentence j: its text, and its place there where the text was cut."""
        text = self.owners[j]
        spans = self.spans[text]
        if spans is None:
            return f"texts[{text}]"
        k = self.first_sentence(text)
        start, end = spans[j - k]
        return f"texts[{text}] sentence {j - k} (characters {start}-{end})"

    def first_sentence(self, text: int) -> int:
        """The index in `sentences` of text `text`'s first sentence."""
        return self.owners.index(text)

    def sentences_of(self, text: int) -> range:
        first = self.first_sentence(text)
        return range(first, first + self.owners.count(text))


def cut(texts: Sequence[str], mode: str, language: str, max_sentences: int | None) -> Cut:
    """Each text cut as `mode` says (off: whole); InvalidInput when the request holds more than
    `max_sentences` sentences, naming the limit."""
    sentences: list[str] = []
    owners: list[int] = []
    spans: list[list[Span] | None] = []
    for i, text in enumerate(texts):
        found = split_sentences(text, mode, language) if mode != "off" else []
        if not found:  # off, or a text with no sentence (its markup alone): decoded as it is
            sentences.append(text)
            owners.append(i)
            spans.append(None)
            continue
        sentences.extend(text[a:b] for a, b in found)
        owners.extend([i] * len(found))
        spans.append(found)
    if max_sentences is not None and len(sentences) > max_sentences:
        raise InvalidInput(
            f"the request's texts hold {len(sentences)} sentences, over the limit of "
            f"{max_sentences} (Limits.max_sentences): send the document in parts"
        )
    return Cut(list(texts), sentences, owners, spans)


def sentence_options(options: SearchOptions, the_cut: Cut) -> SearchOptions:
    """The options of each sentence: a text's target_prefix is its first sentence's (the start of
    its translation), its other sentences have none."""
    if not options.target_prefix or not the_cut.split:
        return options.for_texts(the_cut.owners)
    prefixes = [
        options.target_prefix[text] if j == 0 or the_cut.owners[j - 1] != text else ""
        for j, text in enumerate(the_cut.owners)
    ]
    return replace(options, target_prefix=tuple(prefixes))


def join(the_cut: Cut, results: Sequence[Translation]) -> list[Translation]:
    """Each text's translation: its sentences' joined (the module docstring), or as decoded."""
    if not the_cut.split:
        return list(results)
    out = []
    for i, text in enumerate(the_cut.texts):
        parts = [results[j] for j in the_cut.sentences_of(i)]
        spans = the_cut.spans[i]
        out.append(parts[0] if spans is None else join_translation(text, spans, parts))
    return out


def gaps(text: str, spans: Sequence[Span]) -> list[str]:
    """The source's whitespace before each sentence, and after the last: len(spans) + 1."""
    ends = [0, *(b for _, b in spans)]
    starts = [*(a for a, _ in spans), len(text)]
    return [text[e:s] for e, s in zip(ends, starts, strict=True)]


def join_translation(text: str, spans: list[Span], parts: Sequence[Translation]) -> Translation:
    """One text's sentences' translations as the text's (the module docstring)."""
    between = gaps(text, spans)
    ranks = max(len(p.hypotheses) for p in parts)
    hypotheses = [
        join_hypotheses([p.hypotheses[min(k, len(p.hypotheses) - 1)] for p in parts], between)
        for k in range(ranks)
    ]
    return Translation(
        source=text,
        source_tokens=[t for p in parts for t in p.source_tokens],
        hypotheses=hypotheses,
        glossary=tuple(u for p in parts for u in p.glossary),
        sentence_spans=tuple(spans),
    )


def join_hypotheses(
    hyps: Sequence[TranslationHypothesis], between: Sequence[str]
) -> TranslationHypothesis:
    """Sentences' hypotheses (one each, in order) as one, the source's whitespace `between`."""
    pieces, spans, at = [between[0]], [], len(between[0])
    for hyp, after in zip(hyps, between[1:], strict=True):
        spans.append((at, at + len(hyp.text)))
        pieces += [hyp.text, after]
        at += len(hyp.text) + len(after)
    sizes = [len(h.tokens) for h in hyps]
    log_prob = sum(h.log_prob for h in hyps)
    finished = all(h.finished for h in hyps)
    scored = sum(len(h.token_ids) + (1 if h.finished else 0) for h in hyps)
    origins = {h.origin for h in hyps}
    return TranslationHypothesis(
        text="".join(pieces),
        tokens=[t for h in hyps for t in h.tokens],
        token_ids=[t for h in hyps for t in h.token_ids],
        score=sum(h.score for h in hyps),
        log_prob=log_prob,
        alignment=join_alignments([h.alignment for h in hyps]),
        finished=finished,
        confidence=geometric_mean_probability(log_prob, scored, False),
        low_confidence=any(h.low_confidence for h in hyps),
        segment_confidences=tuple(c for h in hyps for c in h.segment_confidences),
        token_log_probs=tuple(p for h in hyps for p in h.token_log_probs),
        alternative=hyps[0].alternative,
        replaced_unknowns=align.offset_indices([h.replaced_unknowns for h in hyps], sizes),
        unknown_tokens=align.offset_indices([h.unknown_tokens for h in hyps], sizes),
        origin=origins.pop() if len(origins) == 1 else "mixed",
        surfaces=tuple(s for h in hyps for s in h.surfaces)
        if all(h.surfaces for h in hyps)
        else (),
        sentence_spans=tuple(spans),
        sentence_scores=tuple(h.score for h in hyps),
        sentence_confidences=tuple(h.confidence for h in hyps),
    )


def join_alignments(parts: Sequence[Alignment | None]) -> Alignment | None:
    """The sentences' matrices on the diagonal of one (links only within a sentence)."""
    found = [a for a in parts if a is not None]
    return align.block_join(found) if len(found) == len(parts) else None
