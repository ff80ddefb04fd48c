"""Translate and Align with markup: each text read for its tags and protected spans
(service/model/markup.py), its plain text decoded (or aligned) like any other, and the markup put
back into every hypothesis by that hypothesis's own word links (service/decode/align/projection.py).

The links: the bundle's link head over (plain source, hypothesis) where it has one, else the
hypothesis's attention read in the model's default link mode (grow-diag-final-and), the links
`Align` gives by default. A text without markup is answered as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from service.decode.align import links as link_modes
from service.decode.align.forced import DEFAULT_LINKS
from service.decode.align.projection import link_weights, project
from service.decode.engine.text_side import TextSide
from service.decode.shared.alignment import merge_subwords, word_spans
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import AlignmentMode, Translation, TranslationHypothesis
from service.model import markup
from service.model.markup import Marked, MarkupError


def read_text(text: str, mode: str, protect: Sequence[str], invalid: str, where: str) -> Marked:
    """One text's markup and protected spans; InvalidInput naming `where` and the position."""
    try:
        marked = markup.parse(text, mode, protect, invalid)  # type: ignore[arg-type]
    except MarkupError as err:
        raise InvalidInput(f"{where}: {err}") from err
    if not marked.plain.strip():
        raise InvalidInput(
            f"{where} has no text to translate outside its markup and protected spans"
        )
    return marked


def read_texts(texts: Sequence[str], options: SearchOptions) -> list[Marked]:
    """Every text's markup as options say (texts as they are when they ask for none)."""
    if not options.marked:
        return [markup.plain(t) for t in texts]
    return [
        read_text(t, options.markup, options.protect, options.invalid_markup, f"texts[{i}]")
        for i, t in enumerate(texts)
    ]


def decode_alignment(engine: TextSide, options: SearchOptions, alignment: str) -> AlignmentMode:
    """The alignment to decode with: with markup on a model without a link head, the attention
    the links are read from (word level, where the request asks none)."""
    if not options.marked or engine.link_head is not None or not engine.supports_alignment:
        return alignment  # type: ignore[return-value]
    return "word" if alignment == "none" else alignment  # type: ignore[return-value]


# --- links ----------------------------------------------------------------------------------------


def positional_weights(T: int, S: int) -> np.ndarray:
    """(T, S) links by relative position only: what a hypothesis with no readable alignment gets."""
    weights = np.zeros((T, S), np.float64)
    if T and S:
        weights[np.arange(T), np.minimum(np.arange(T) * S // T, S - 1)] = 1.0
    return weights


def attention_weights(engine: TextSide, plain: str, hyp: TranslationHypothesis) -> np.ndarray:
    """(T, S) weights from the hypothesis's attention, read as the model's default link mode."""
    T, S = len(word_spans(hyp.text)), len(word_spans(plain))
    alignment = hyp.alignment
    if alignment is None:
        return positional_weights(T, S)
    matrix = alignment.matrix  # (rows, cols)
    if matrix.shape != (T, S) or alignment.target_tokens != hyp.text.split():
        surfaces = None
        if len(hyp.token_ids) == len(alignment.target_tokens):
            surfaces = engine.tgt_tok.surfaces(hyp.token_ids)
        matrix, _, _ = merge_subwords(
            matrix, alignment.source_tokens, alignment.target_tokens, tgt_surfaces=surfaces
        )
    if matrix.shape != (T, S):  # pieces that do not group into the texts' words
        return positional_weights(T, S)
    return link_weights(link_modes.extract_links(matrix, DEFAULT_LINKS), T, S)


# --- putting the markup back ----------------------------------------------------------------------


HeadTexts = list[tuple[str, list[str]]]  # (plain source, its hypotheses' texts), per text
HeadWeights = list[list[np.ndarray] | None]  # aligner.head_weights_for's answer


def head_texts(marked: Sequence[Marked], translations: Sequence[Translation]) -> HeadTexts:
    """What the link head reads for `restore`: each text with markup, and its hypotheses."""
    return [
        (m.plain, [h.text for h in t.hypotheses])
        for m, t in zip(marked, translations, strict=True)
        if m.nodes
    ]


def restore(
    engine: TextSide,
    marked: Sequence[Marked],
    translations: Sequence[Translation],
    alignment: str,
    found: HeadWeights | None = None,
) -> list[Translation]:
    """Each translation's hypotheses with their text's markup put back (`text`), the translation
    of the plain text kept as `plain_text`; alignments dropped where the request asked none.
    found: the link head's weights of `head_texts` (an engine's: service/decode/align/aligner.py's
    head_weights_for), where the model has a link head; None: the hypotheses' attention is read."""
    heads: list[list[np.ndarray] | None] = [None] * len(marked)
    if engine.link_head is not None and found is not None:
        todo = [i for i, m in enumerate(marked) if m.nodes]
        for i, weights in zip(todo, found, strict=True):
            heads[i] = weights
    out = []
    for m, translation, head in zip(marked, translations, heads, strict=True):
        hyps = translation.hypotheses
        tagged = [m.escape(h.text) for h in hyps]
        if m.nodes:
            weights = head or [attention_weights(engine, m.plain, h) for h in hyps]
            tagged = [project(m, h.text, w) for h, w in zip(hyps, weights, strict=True)]
        out.append(
            replace(
                translation,
                hypotheses=[
                    replace(
                        h,
                        text=text,
                        plain_text=h.text,
                        alignment=h.alignment if alignment != "none" else None,
                    )
                    for h, text in zip(hyps, tagged, strict=True)
                ],
            )
        )
    return out
