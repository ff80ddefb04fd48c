"""What a decoded text comes back as: its hypotheses, each with its alignment at the level asked
for (service/decode/shared/alignment.py), and the report of its glossary's terms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.decode.shared import alignment as align
from service.decode.shared.alignment import Alignment
from service.model import glossary as gl

AlignmentMode = Literal["none", "subword", "word"]
ALIGNMENT_MODES: tuple[str, ...] = ("none", "subword", "word")


@dataclass(frozen=True)
class TranslationHypothesis:
    text: str
    tokens: list[str]  # target subword pieces
    token_ids: list[int]
    score: float  # normalized (length/coverage penalties applied); ranks the n-best list
    log_prob: float
    alignment: Alignment | None
    finished: bool  # False when cut at the maximum length
    # exp(log_prob / tokens, EOS included): the geometric-mean token probability in [0, 1]; for a
    # segmented input over every segment's tokens (service/model/segment.py). Users threshold it.
    confidence: float = 0.0
    low_confidence: bool = False  # confidence below the threshold in use (Engine.min_confidence)
    segment_confidences: tuple[float, ...] = ()  # a segmented input's, each segment's own
    token_log_probs: tuple[float, ...] = ()  # log P of each token (EOS not listed)
    alternative: Alternative | None = (
        None  # with return_alternatives: its first word after the prefix
    )
    replaced_unknowns: tuple[int, ...] = ()  # token indices of unknowns replaced by a source word
    # a memory's target served as written: the tokens the vocabulary cannot spell (the forced pass
    # read its unknown token), by index into tokens
    unknown_tokens: tuple[int, ...] = ()
    # "memory": the model's memory gave it (service/decode/requests/recall.py); "mixed": a segmented input
    # some of whose segments the memory gave
    origin: str = "model"
    # with markup or protected spans (service/decode/requests/marked.py): the translation of the plain text,
    # which tokens and alignment describe; `text` is then it with the markup put back
    plain_text: str = ""
    # each token's text as `text` writes it, where the tokenizer's own would not (a memory's
    # target as written: a letter the vocabulary cannot spell is no " ⁇ "); () for the tokenizer's
    surfaces: tuple[str, ...] = ()
    # a text cut into sentences (service/decode/requests/documents.py): each sentence's place in
    # `plain_text` where that is set, else in `text`, its score and confidence; () for a text
    # decoded whole
    sentence_spans: tuple[tuple[int, int], ...] = ()
    sentence_scores: tuple[float, ...] = ()
    sentence_confidences: tuple[float, ...] = ()


@dataclass(frozen=True)
class Alternative:
    """The word a hypothesis puts first after the prefix, and its probability there."""

    word: str
    probability: float
    position: int  # the token index where the word starts


@dataclass(frozen=True)
class Translation:
    source: str
    source_tokens: list[str]
    hypotheses: list[TranslationHypothesis]  # best first
    # the glossary terms that apply to the text and what became of each (Engine.glossary_report)
    glossary: tuple[gl.TermUse, ...] = ()
    # a text cut into sentences: each sentence's place in `source`; () for a text decoded whole
    sentence_spans: tuple[tuple[int, int], ...] = ()


def make_alignment(
    matrix: np.ndarray | None,
    src_pieces: list[str],
    tgt_pieces: list[str],
    mode: AlignmentMode,
    tgt_surfaces: list[str] | None = None,
    source_text: str | None = None,
    unknown: Sequence[int] = (),
) -> Alignment | None:
    """tgt_surfaces: each target piece's text as the answer writes it (the tokenizer's
    `surfaces`), so that word mode's target words are the answer text's words. At word level the
    source words are the client's whitespace words of `source_text` (as sent: not lower-cased by
    the input rule, no <unk> for unknown letters) whenever the pieces group into as many words.
    unknown: the target pieces the vocabulary cannot spell (a memory's target as written), marked
    on the rows that hold them."""
    if mode == "none" or matrix is None:
        return None
    rows = tuple(unknown)
    if mode == "word":
        rows = align.words_holding(tgt_pieces, unknown, tgt_surfaces)
        matrix, src_pieces, tgt_pieces = align.merge_subwords(
            matrix, src_pieces, tgt_pieces, tgt_surfaces=tgt_surfaces
        )
        sent = source_text.split() if source_text is not None else []
        if len(sent) == len(src_pieces):
            src_pieces = sent
    return Alignment(
        matrix=matrix,
        source_tokens=src_pieces,
        target_tokens=tgt_pieces,
        pharaoh=align.pharaoh(matrix),
        unknown_target_tokens=rows,
    )
