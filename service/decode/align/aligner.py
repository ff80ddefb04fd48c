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

from collections.abc import Collection, Hashable, Sequence
from dataclasses import replace
from typing import Generic

import numpy as np

from service.decode.align import links as link_modes
from service.decode.align.forced import (
    AlignedPair,
    AlignOptions,
    Attention,
    Forced,
    ForcedSearch,
)
from service.decode.align.pair_answers import (
    ForcedRequest,
    KeyT,
    aligned_of,
    check_aligner,
    prepare_pair,
    resolve_links,
)
from service.decode.align.projection import head_weights
from service.decode.engine.engine import Engine
from service.decode.engine.kept_rows import KeptRows, SourceRows
from service.decode.runtime.attention_choice import AttentionChoice
from service.decode.runtime.encoded import EncodedSentence
from service.decode.shared.alignment import word_spans
from service.decode.shared.errors import DecodeFailed, InvalidInput
from service.decode.text.preparation import Prepared
from service.decode.text.sides import PreparedPair


def attention_choice(engine: Engine, attention: Attention) -> AttentionChoice | None:
    """An AlignOptions.attention as the graph takes it (an unset layer: the bundle's alignment
    layer); None for the bundle's own alignment."""
    if attention is None:
        return None
    shape = engine.bundle.architecture.transformer
    assert shape is not None, "attention_problems refuses a choice on an RNN"
    layer, head = attention
    return AttentionChoice(shape.align_layer % shape.dec_layers if layer is None else layer, head)


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
