"""A decoded sentence's answer: its search results (service/decode/search/beam.py's Hypothesis, per part)
as the Translation a client gets: texts, tokens, scores, confidences, alignment matrices at the
level asked for, unknown words replaced where asked, a segmented input's segments joined, the
alternatives after a prefix, the glossary's report."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from service.decode.shared import alignment as align
from service.decode.shared.controls import Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import DecodeRequest, Prepared, RawParts
from service.decode.text.terms import Terms
from service.decode.text.translation import (
    AlignmentMode,
    Alternative,
    Translation,
    TranslationHypothesis,
    make_alignment,
)
from service.model import segment
from service.model.architecture import ModelConfig
from service.model.vocab import TextTokenizer, is_word_level


class Results:
    """The answers of one model's decoded sentences."""

    def __init__(
        self,
        src_tok: TextTokenizer,
        tgt_tok: TextTokenizer,
        cfg: ModelConfig,
        terms: Terms,
        controls: Callable[[SearchOptions], Controls],
        min_confidence: float,
    ) -> None:
        """controls: a text's decoding controls (Engine.controls: the prefix that alternatives
        follow); min_confidence: below it, a hypothesis is low_confidence."""
        self.src_tok, self.tgt_tok, self.cfg = src_tok, tgt_tok, cfg
        self.word_level = is_word_level(src_tok) and is_word_level(tgt_tok)
        self.terms = terms
        self.controls = controls
        self.min_confidence = min_confidence

    def translation_of(self, request: DecodeRequest[Any], parts: RawParts) -> Translation:
        """A sentence's search results (`RunningBatch.step_raw`) as its Translation: one part's
        hypotheses converted, a segmented sentence's segments joined."""
        if request.sentence.segments:
            return self.join_translation(request, parts)
        return self.to_translation(request, parts[0])

    def to_translation(self, request: DecodeRequest[Any], hyps: list[Hypothesis]) -> Translation:
        hypotheses = [self.to_hypothesis(request, h) for h in hyps]
        if request.options.return_alternatives:
            hypotheses = self.alternatives(request, hypotheses)
        return Translation(
            source=request.sentence.text,
            source_tokens=request.sentence.pieces,
            hypotheses=hypotheses,
            glossary=self.terms.glossary_report(
                request.sentence.text, request.options, hypotheses[0] if hypotheses else None
            ),
        )

    def alternatives(
        self, request: DecodeRequest[Any], hyps: list[TranslationHypothesis]
    ) -> list[TranslationHypothesis]:
        """The hypotheses of return_alternatives → one per distinct first word after the prefix,
        by that word's probability (summed over the hypotheses that spell it), the best
        continuation of each kept, return_alternatives of them."""
        start = len(self.controls(request.options).prefix)
        best: dict[str, TranslationHypothesis] = {}
        mass: dict[str, float] = {}
        for hyp in hyps:
            found = self.first_word(hyp, start)
            if found is None:
                continue
            word, log_prob = found
            mass[word] = mass.get(word, 0.0) + math.exp(log_prob)
            if word not in best or hyp.score > best[word].score:
                best[word] = hyp
        ranked = sorted(best, key=lambda w: -mass[w])[: request.options.return_alternatives]
        return [
            replace(best[w], alternative=Alternative(w, min(1.0, mass[w]), start)) for w in ranked
        ]

    def first_word(self, hyp: TranslationHypothesis, start: int) -> tuple[str, float] | None:
        """The word that starts at token `start` of hyp, and its pieces' summed log-prob (None
        when the hypothesis ends there)."""
        ids = hyp.token_ids
        if start >= len(ids):
            return None
        end = start + 1
        if not self.word_level:  # a word's later pieces carry no "▁"
            pieces = self.tgt_tok.pieces(ids)
            marks = align.word_index(pieces)  # (P,)
            while end < len(ids) and marks[end] == marks[start]:
                end += 1
        word = self.tgt_tok.decode(ids[start:end]).strip()
        return word, float(sum(hyp.token_log_probs[start:end]))

    def alignment_mode(self, request: DecodeRequest[Any]) -> AlignmentMode:
        return self.alignment_mode_for(request.alignment)

    def alignment_mode_for(self, alignment: AlignmentMode) -> AlignmentMode:
        """The matrix an alignment mode gives on this model (word level: its tokens are words)."""
        return "subword" if self.word_level and alignment == "word" else alignment

    def to_hypothesis(
        self, request: DecodeRequest[Any], hyp: Hypothesis, mode: AlignmentMode | None = None
    ) -> TranslationHypothesis:
        """mode: the alignment's (default: the request's); "subword" keeps the raw matrix."""
        mode = mode or self.alignment_mode(request)
        pieces = self.tgt_tok.pieces(hyp.tokens)
        confidence = segment.geometric_mean_probability(
            float(hyp.log_prob), len(hyp.tokens), hyp.finished_by_eos
        )
        text, replaced = self.tgt_tok.decode(hyp.tokens), tuple[int, ...]()
        if request.options.replace_unknowns and hyp.attention is not None:
            text, replaced = self.replace_unknowns(request.sentence, hyp)
        if request.alignment == "none":
            hyp = replace(hyp, attention=None)  # kept only for replace_unknowns
        elif hyp.attention is not None and (request.options.glossary or len(self.terms.glossary)):
            attention = self.terms.term_rows(request.sentence, request.options, hyp)
            hyp = replace(hyp, attention=attention)
        token_log_probs = () if hyp.token_log_probs is None else tuple(hyp.token_log_probs.tolist())
        return TranslationHypothesis(
            text=text,
            tokens=pieces,
            token_ids=list(hyp.tokens),
            score=float(hyp.score),
            log_prob=float(hyp.log_prob),
            alignment=make_alignment(
                hyp.attention,
                request.sentence.pieces,
                pieces,
                mode,
                self.tgt_tok.surfaces(hyp.tokens) if mode == "word" else None,
                source_text=request.sentence.text,
            ),
            finished=hyp.finished_by_eos,
            confidence=confidence,
            low_confidence=confidence < self.min_confidence,
            token_log_probs=token_log_probs,
            replaced_unknowns=replaced,
        )

    def replace_unknowns(self, sentence: Prepared, hyp: Hypothesis) -> tuple[str, tuple[int, ...]]:
        """The hypothesis's text with each unknown target token replaced by the source word its
        attention row weighs most (Luong et al., 2015; OpenNMT-py's -replace_unk), and the indices
        of the tokens replaced. Source words are the client's whitespace words where the pieces
        group into as many, else the pieces themselves."""
        unknown = [i for i, t in enumerate(hyp.tokens) if t == self.cfg.unk_id]
        if not unknown or hyp.attention is None:
            return self.tgt_tok.decode(hyp.tokens), ()
        words = sentence.text.split()
        if is_word_level(self.src_tok):  # a piece per word (then the toolkit's source EOS, if any)
            marks = np.arange(len(sentence.pieces))  # (S,)
        else:
            marks = align.word_index(sentence.pieces)  # (S,) each source piece's word
            if len(marks) and int(marks.max()) + 1 != len(words):  # not the client's words
                words = []
        surfaces = self.tgt_tok.surfaces(hyp.tokens)
        for i in unknown:
            j = int(np.argmax(hyp.attention[i]))
            w = int(marks[j])
            word = words[w] if w < len(words) else sentence.pieces[j].replace(align.WORD_START, "")
            surfaces[i] = (" " if i > 0 else "") + word
        return "".join(surfaces).strip(), tuple(unknown)

    def join_translation(
        self, request: DecodeRequest[Any], parts: list[list[Hypothesis]]
    ) -> Translation:
        """A segmented input's translation from its segments' n-best lists (service/model/segment.py
        says how they join)."""
        sentence = request.sentence
        mode = self.alignment_mode(request)
        raw: AlignmentMode = "none" if mode == "none" else "subword"
        converted = [
            [self.to_hypothesis(replace(request, sentence=seg), h, raw) for h in hyps]
            for seg, hyps in zip(sentence.segments, parts, strict=True)
        ]
        n = max(len(hyps) for hyps in converted)
        hypotheses = [
            self.join_hypotheses(
                [hyps[min(i, len(hyps) - 1)] for hyps in converted], sentence, mode
            )
            for i in range(n)
        ]
        return Translation(
            source=sentence.text,
            source_tokens=sentence.pieces,
            hypotheses=hypotheses,
            glossary=self.terms.glossary_report(sentence.text, request.options, hypotheses[0]),
        )

    def joined_surfaces(self, parts: list[TranslationHypothesis], sentence: Prepared) -> list[str]:
        """The joined hypothesis's target surfaces: they join to its text (segments' and
        separators' text in order)."""
        blocks = [(self.written_surfaces(parts[0]), parts[0].text)]
        for separator, part in zip(sentence.separators, parts[1:], strict=True):
            blocks.append((separator.target_surfaces, separator.target_text))
            blocks.append((self.written_surfaces(part), part.text))
        return segment.join_surfaces(blocks)

    def written_surfaces(self, hyp: TranslationHypothesis) -> list[str]:
        """Each of hyp's tokens' text as its answer writes it."""
        return list(hyp.surfaces) if hyp.surfaces else self.tgt_tok.surfaces(hyp.token_ids)

    def join_hypotheses(
        self, parts: list[TranslationHypothesis], sentence: Prepared, mode: AlignmentMode
    ) -> TranslationHypothesis:
        """One hypothesis per segment (raw subword alignments) → the input's hypothesis."""
        first = parts[0]
        text, tokens, ids = first.text, list(first.tokens), list(first.token_ids)
        token_log_probs = list(first.token_log_probs)
        unknown = list(first.unknown_tokens)
        for separator, part in zip(sentence.separators, parts[1:], strict=True):
            text += separator.target_text + part.text
            start = len(tokens) + len(separator.target_pieces)
            unknown += [start + i for i in part.unknown_tokens]
            tokens += separator.target_pieces + part.tokens
            ids += separator.target_ids + part.token_ids
            # a separator's tokens are written, not decoded: probability 1
            token_log_probs += [0.0] * len(separator.target_ids) + list(part.token_log_probs)
        alignment = None
        matrices = [p.alignment.matrix for p in parts if p.alignment is not None]
        if mode != "none" and len(matrices) == len(parts):
            matrix = segment.block_diagonal(
                matrices,
                [(len(s.target_pieces), len(s.source_pieces)) for s in sentence.separators],
            )  # (T, S)
            alignment = make_alignment(
                matrix,
                sentence.pieces,
                tokens,
                mode,
                self.joined_surfaces(parts, sentence),
                source_text=sentence.text,
                unknown=unknown,
            )
        scored = sum(len(p.token_ids) + (1 if p.finished else 0) for p in parts)
        log_prob = sum(p.log_prob for p in parts)
        confidence = math.exp(log_prob / scored) if scored else 0.0
        return TranslationHypothesis(
            text=text,
            tokens=tokens,
            token_ids=ids,
            score=sum(p.score for p in parts),
            log_prob=log_prob,
            alignment=alignment,
            finished=all(p.finished for p in parts),
            confidence=confidence,
            low_confidence=confidence < self.min_confidence,
            segment_confidences=tuple(p.confidence for p in parts),
            token_log_probs=tuple(token_log_probs),
            unknown_tokens=tuple(unknown),
        )
