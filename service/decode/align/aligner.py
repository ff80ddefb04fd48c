"""Forced alignment (`Align`): the engine's teacher-forced pass over given (source, target) pairs.

The same encoder and decoder step as `Translate`, the target's tokens fed instead of the search's
choices (service/decode/align/forced.py). `ForcedBatch` is the running batch the worker drives beside the
beam-search ones (same admission, limits, deadlines and turns; one decoder row per pair); `align`
is the same path for a static batch.

Words are the client's: each side is split on whitespace and every word tokenized on its own, so each
subword piece belongs to exactly one of the words sent, and word-level matrices and Pharaoh links
are indexed over those words whatever the tokenizer does inside a word. A word or piece the
vocabulary does not know is fed as the unknown token and listed in `unknown_*`, never refused.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np

from service.decode.align import links as link_modes
from service.decode.align.forced import (
    AlignedPair,
    AlignOptions,
    Attention,
    Forced,
    ForcedSearch,
    default_links,
)
from service.decode.align.projection import head_weights, link_weights, project
from service.decode.engine.engine import Engine
from service.decode.engine.kept_rows import KeptRows, SourceRows
from service.decode.runtime.attention_choice import AttentionChoice
from service.decode.runtime.encoded import EncodedSentence
from service.decode.shared.alignment import Alignment, merge_by_index, word_spans
from service.decode.shared.alignment import pharaoh as argmax_pharaoh
from service.decode.shared.errors import DecodeFailed, InvalidInput
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
    engine: Engine, source: str, target: str, options: AlignOptions | None = None
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


def check_aligner(engine: Engine, options: AlignOptions) -> None:
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


def attention_problems(engine: Engine, options: AlignOptions) -> list[str]:
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


def attention_choice(engine: Engine, attention: Attention) -> AttentionChoice | None:
    """An AlignOptions.attention as the graph takes it (an unset layer: the bundle's alignment
    layer); None for the bundle's own alignment."""
    if attention is None:
        return None
    shape = engine.bundle.architecture.transformer
    assert shape is not None, "attention_problems refuses a choice on an RNN"
    layer, head = attention
    return AttentionChoice(shape.align_layer % shape.dec_layers if layer is None else layer, head)


def resolve_links(engine: Engine, options: AlignOptions) -> AlignOptions:
    """The options with the model's default link mode filled in where none was asked."""
    if options.links:
        return options
    return replace(options, links=default_links(engine.link_head is not None))


# --- results -----------------------------------------------------------------------------------


def head_logits(engine: Engine, pair: PreparedPair, states: np.ndarray) -> np.ndarray:
    """The link head's (T_w, S_w) scores for a pair whose source the encoder gave `states` (P_s, D)."""
    assert engine.link_head is not None
    src, tgt = pair.src, pair.tgt
    return engine.link_head.logits(
        states, src.words, src.ids, src.word_of, tgt.words, tgt.ids, tgt.word_of
    )


def head_weights_for(
    engine: Engine, texts: Sequence[tuple[str, Sequence[str]]], kept: KeptRows | None = None
) -> list[list[np.ndarray] | None]:
    """For each (plain source, its targets): (T, S) projection weights (service/decode/align/projection.py)
    of every target from the link head; None for a text whose pairs cannot be read as Align reads
    them (the caller reads the attention instead). encoded: encoder rows already computed (the
    decode's, in the same process), by the ids they read; the sources not among them are encoded
    here, in one call. kept: the decode's encoder rows (service/decode/engine/kept_rows.py), taken where
    they hold a source; the others are encoded here, in one call."""
    prepared: list[dict[int, PreparedPair] | None] = []
    for plain, targets in texts:
        try:
            prepared.append(
                {i: prepare_pair(engine, plain, t) for i, t in enumerate(targets) if t.strip()}
            )
        except InvalidInput:
            prepared.append(None)
    rows = source_rows(engine, [next(iter(p.values())).source for p in prepared if p], kept)
    out: list[list[np.ndarray] | None] = []
    for (plain, targets), pairs in zip(texts, prepared, strict=True):
        if pairs is None:
            out.append(None)
            continue
        S = len(word_spans(plain))
        weights = [np.zeros((0, S)) for _ in targets]
        if pairs:
            states = rows[tuple(next(iter(pairs.values())).source.ids)]  # (P_s, D)
            for i, pair in pairs.items():
                weights[i] = head_weights(head_logits(engine, pair, states))
        out.append(weights)
    return out


def source_rows(engine: Engine, sources: Sequence[Prepared], kept: KeptRows | None) -> SourceRows:
    """Every source's encoder values (S, D) by its ids: those `kept` holds for the same ids (the
    same encoder input), the rest encoded in one call."""
    rows = kept.find(tuple(s.ids) for s in sources) if kept is not None else {}
    missing = list({tuple(s.ids): s for s in sources if tuple(s.ids) not in rows}.values())
    fresh = engine.encode(missing) if missing else []
    rows.update((tuple(s.ids), r[0].values) for s, r in zip(missing, fresh, strict=True))
    return rows


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


class ForcedBatch(Generic[KeyT]):
    """Pairs teacher-forced together, one decoder row each; pairs join and leave between steps.
    The worker drives it as it drives a beam search's RunningBatch (add, step, remove)."""

    beam_size = 1

    def __init__(self, engine: Engine, attention: Attention = None) -> None:
        """`attention`: the pairs' AlignOptions.attention; every pair of the batch is aligned by
        that layer and head."""
        self.engine = engine
        choice = attention_choice(engine, attention)
        self.decoder = engine.model.new_decoder(forced=True, choice=choice)
        cfg = engine.cfg
        self.search = ForcedSearch(self.decoder, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size)
        self.requests: dict[Hashable, ForcedRequest[KeyT]] = {}
        self.states: dict[Hashable, np.ndarray] = {}  # encoder states of pairs linked by the head
        self.failed: list[tuple[ForcedRequest[KeyT], Exception]] = []  # for `take_failed`

    def __len__(self) -> int:
        return len(self.search)

    @property
    def num_hypotheses(self) -> int:
        return len(self.search)

    def add(
        self,
        requests: Sequence[ForcedRequest[KeyT]],
        encoded: Sequence[Sequence[EncodedSentence]] | None = None,
    ) -> None:
        """Append the joining pairs; encoded[i] holds requests[i]'s source rows (Engine.encode;
        None: encode them now, in one encoder call)."""
        if not requests:
            return
        if encoded is None:
            encoded = self.engine.encode([r.sentence for r in requests])
        if len(encoded) != len(requests) or any(len(rows) != 1 for rows in encoded):
            raise ValueError("one encoded source per pair expected")
        V = self.engine.cfg.tgt_vocab_size
        usable = [not any(not 0 <= t < V for t in r.pair.tgt.ids) for r in requests]
        self.failed += [
            (r, DecodeFailed(f"the target's token ids are outside the vocabulary of {V}"))
            for r, ok in zip(requests, usable, strict=True)
            if not ok
        ]  # a pair tokenized for another model fails alone
        requests = [r for r, ok in zip(requests, usable, strict=True) if ok]
        encoded = [e for e, ok in zip(encoded, usable, strict=True) if ok]
        if not requests:
            return
        row = self.decoder.add_sentences([rows[0] for rows in encoded])
        for request, rows in zip(requests, encoded, strict=True):
            pair = request.pair
            request = replace(request, options=resolve_links(self.engine, request.options))
            self.search.add(request.key, len(pair.src.ids), pair.tgt.ids, state_row=row)
            self.requests[request.key] = request
            if request.options.links == link_modes.HEAD:
                self.states[request.key] = rows[0].values
            row += 1

    def take_failed(self) -> list[tuple[ForcedRequest[KeyT], Exception]]:
        """The pairs that failed on their own since the last call (RunningBatch.take_failed)."""
        failed, self.failed = self.failed, []
        return failed

    def remove(self, keys: Collection[KeyT]) -> list[KeyT]:
        """Drop pairs mid-pass (their client went away); returns the keys that were here."""
        present = [key for key in keys if key in self.requests]
        self.search.remove(present)
        for key in present:
            self.states.pop(key, None)
        return [self.requests.pop(key).key for key in present]

    def step(self) -> list[tuple[KeyT, AlignedPair]]:
        """One decoder call for every pair; returns the pairs that finished at this step."""
        return [
            (request.key, aligned_of(self.engine, request, forced, logits))
            for request, forced, logits in self.step_raw()
        ]

    def step_raw(self) -> list[tuple[ForcedRequest[KeyT], Forced, np.ndarray | None]]:
        """As `step`, each finished pair's forced pass and link head scores (T_w, S_w) (None
        without links "head") left as they are: a front process reads them (`aligned_of`). Each
        request's options have the model's link mode filled in."""
        out = []
        for key, forced in self.search.step():
            request = self.requests.pop(key)
            states = self.states.pop(key, None)
            logits = None if states is None else head_logits(self.engine, request.pair, states)
            out.append((request, forced, logits))
        return out


def aligned_of(
    engine: Engine, request: ForcedRequest[KeyT], forced: Forced, logits: np.ndarray | None
) -> AlignedPair:
    """One pair's answer from its forced pass and its link head scores (`ForcedBatch.step_raw`);
    `engine` may be the text side alone (the head's thresholds read the links)."""
    head = None
    if logits is not None:
        assert engine.link_head is not None
        head = HeadReading(logits, engine.link_head.links(logits))
    options = resolve_links(engine, request.options)
    return aligned_pair(request.pair, forced, options, head)


def align(
    engine: Engine,
    pairs: Sequence[tuple[str, str]],
    options: AlignOptions | None = None,
) -> list[AlignedPair]:
    """Align a static batch of (source, target) pairs in one forced batch; results in input order."""
    options = options or AlignOptions()
    if not pairs:
        raise InvalidInput("no pairs to align")
    check_aligner(engine, options)
    prepared = []
    for i, (source, target) in enumerate(pairs):
        try:
            prepared.append(prepare_pair(engine, source, target, options))
        except InvalidInput as err:
            raise InvalidInput(f"pairs[{i}]: {err}") from err
    return align_prepared(engine, prepared, options)


def align_prepared(
    engine: Engine, prepared: Sequence[PreparedPair], options: AlignOptions
) -> list[AlignedPair]:
    """Pairs already prepared (`prepare_pair`) in one forced batch; results in input order."""
    batch: ForcedBatch[int] = ForcedBatch(engine, options.attention)
    batch.add([ForcedRequest(i, p, options) for i, p in enumerate(prepared)])
    results: dict[int, AlignedPair] = {}
    while len(batch):
        results.update(batch.step())
    return [results[i] for i in range(len(prepared))]
