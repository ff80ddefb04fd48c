"""Align's pairs before and after the forced pass, on a model's text side (a front's as well as an
engine's: no ONNX Runtime): a pair read and checked (`prepare_pair`, its markup), the options
checked against the model (`check_aligner`), and a pair's answer from its forced pass's rows and
its link head's scores (`aligned_of`). The forced pass itself is aligner.py's.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np

from service.decode.align import links as link_modes
from service.decode.align.forced import (
    AlignedPair,
    AlignOptions,
    Forced,
    default_links,
)
from service.decode.align.projection import head_weights, link_weights, project
from service.decode.engine.text_side import TextSide
from service.decode.shared.alignment import Alignment, merge_by_index, word_spans
from service.decode.shared.alignment import pharaoh as argmax_pharaoh
from service.decode.shared.errors import InvalidInput
from service.decode.text.preparation import Prepared
from service.decode.text.sides import PreparedPair, tokenize_pair
from service.model import markup
from service.model.markup import Marked, MarkupError

KeyT = TypeVar("KeyT", bound=Hashable)


@dataclass(frozen=True)
class ForcedRequest(Generic[KeyT]):
    """One pair for a forced batch, under its caller's key (the worker's: a SentenceKey)."""

    key: KeyT
    pair: PreparedPair
    options: AlignOptions

    @property
    def sentence(self) -> Prepared:
        return self.pair.source


# --- preparation -------------------------------------------------------------------------------


def read_markup(source: str, options: AlignOptions | None) -> Marked | None:
    """The source's markup as options ask (None for none); InvalidInput naming the position."""
    if options is None or options.markup == "none":
        return None
    try:
        marked = markup.parse(source, options.markup, (markup.NO_PROTECT,), options.invalid_markup)  # type: ignore[arg-type]
    except MarkupError as err:
        raise InvalidInput(f"source: {err}") from err
    if not marked.plain.strip():
        raise InvalidInput("source has no words outside its markup")
    return marked


def prepare_pair(
    engine: TextSide, source: str, target: str, options: AlignOptions | None = None
) -> PreparedPair:
    """Validate and tokenize one pair (InvalidInput says which side and what to change). The
    source goes through the bundle's input rule as Translate's does; it is never segmented (the
    target cannot be cut to match). With options.markup the source's markup is taken out first
    (`PreparedPair.marked`)."""
    marked = None
    if isinstance(source, str) and source.strip():  # a missing side: tokenize_pair says so
        marked = read_markup(source, options)
    if marked is not None:
        source = marked.plain
    src, tgt = tokenize_pair(engine.pair_reader, source, target)
    return PreparedPair(
        Prepared(text=source, ids=src.ids, pieces=src.pieces), src, tgt, target, marked
    )


def check_aligner(engine: TextSide, options: AlignOptions) -> None:
    """The model can align (it has attention) and the options are valid; InvalidInput otherwise."""
    if not engine.supports_alignment:
        raise InvalidInput(
            f"model {engine.bundle.name} has no attention (architecture 'none'): it cannot align; "
            "ask a model with attention"
        )
    found = options.problems()
    if options.links == link_modes.HEAD and engine.link_head is None:
        others = [m for m in link_modes.LINK_MODES if m != link_modes.HEAD]
        found.append(
            f"model {engine.bundle.name} has no link head (links 'head'): use one of {others}, "
            "or add a head with `python -m export.link_head`"
        )
    found += attention_problems(engine, options)
    if found:
        raise InvalidInput("; ".join(found))


def attention_problems(engine: TextSide, options: AlignOptions) -> list[str]:
    """What the model cannot give of the asked cross-attention (a layer and head of a
    Transformer's decoder)."""
    if options.attention is None:
        return []
    shape = engine.bundle.architecture.transformer
    if shape is None:
        return [
            f"model {engine.bundle.name} is an RNN with one attention: attention_layer and "
            "attention_head choose among a Transformer's layers and heads; leave them unset"
        ]
    found = []
    layer, head = options.attention
    if layer is not None and layer >= shape.dec_layers:
        found.append(
            f"attention_layer {layer} is not one of model {engine.bundle.name}'s "
            f"{shape.dec_layers} decoder layers (0 to {shape.dec_layers - 1})"
        )
    if head is not None and head >= shape.heads:
        found.append(
            f"attention_head {head} is not one of model {engine.bundle.name}'s {shape.heads} "
            f"heads (0 to {shape.heads - 1})"
        )
    return found


def resolve_links(engine: TextSide, options: AlignOptions) -> AlignOptions:
    """The options with the model's default link mode filled in where none was asked."""
    if options.links:
        return options
    return replace(options, links=default_links(engine.link_head is not None))


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadReading:
    """The link head's scores of a pair and the links its thresholds read from them."""

    logits: np.ndarray  # (T_w, S_w)
    links: set[link_modes.Link]


def aligned_pair(
    pair: PreparedPair,
    forced: Forced,
    options: AlignOptions,
    head: HeadReading | None = None,
) -> AlignedPair:
    """The forced pass's rows → subword and word matrices, links and scores. Links are read from
    the attention's word matrix, or with links "head" are the link head's. A source with markup
    gets it back on the target, projected by those links (service/decode/align/projection.py)."""
    src, tgt = pair.src, pair.tgt
    T = len(tgt.ids)
    matrix = forced.attention[:T]  # (T, S): the EOS step's row is not a target token's
    word_matrix = merge_by_index(matrix, src.word_of, tgt.word_of, len(src.words), len(tgt.words))
    if options.links == link_modes.HEAD:
        if head is None:
            raise ValueError("links 'head' needs the link head's links")
        links = head.links
    else:
        links = link_modes.extract_links(word_matrix, options.links, options.threshold)
    pharaoh = link_modes.to_pharaoh(links)
    tagged = ""
    if pair.marked is not None:
        T_w, S_w = len(word_spans(pair.target)), len(word_spans(pair.marked.plain))
        weights = head_weights(head.logits) if head else link_weights(links, T_w, S_w)
        tagged = project(pair.marked, pair.target, weights)
    subword = word = None
    if options.matrices in ("both", "subword"):
        subword = Alignment(
            matrix, src.pieces, tgt.pieces, argmax_pharaoh(matrix), tuple(tgt.unknown)
        )
    if options.matrices in ("both", "word"):
        word = Alignment(word_matrix, src.words, tgt.words, pharaoh, tuple(tgt.unknown_words))
    log_prob = forced.log_prob
    return AlignedPair(
        source_tokens=src.pieces,
        target_tokens=tgt.pieces,
        source_words=src.words,
        target_words=tgt.words,
        subword=subword,
        word=word,
        pharaoh=pharaoh,
        token_log_probs=forced.token_log_probs[:T].tolist(),
        eos_log_prob=float(forced.token_log_probs[T]),
        log_prob=log_prob,
        confidence=math.exp(log_prob / (T + 1)),
        unknown_source_tokens=src.unknown,
        unknown_target_tokens=tgt.unknown,
        unknown_source_words=src.unknown_words,
        unknown_target_words=tgt.unknown_words,
        tagged_target=tagged,
    )


# --- decoding ----------------------------------------------------------------------------------


def aligned_of(
    engine: TextSide, request: ForcedRequest[KeyT], forced: Forced, logits: np.ndarray | None
) -> AlignedPair:
    """One pair's answer from its forced pass and its link head scores (`ForcedBatch.step_raw`);
    `engine` may be the text side alone (the head's thresholds read the links)."""
    head = None
    if logits is not None:
        assert engine.link_head is not None
        head = HeadReading(logits, engine.link_head.links(logits))
    options = resolve_links(engine, request.options)
    return aligned_pair(request.pair, forced, options, head)
