"""The device search's sentences as the host keeps them: an entry per sentence (`SentenceEntry`),
its columns of the batch's meta (STEPS..WIDE) and settings, made once per options object
(`KnownOptions`, `joining_columns`), the controls' step inputs (`control_inputs`), and the n-best
lists read from finished rows (`finished_hypotheses`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from service.decode.runtime.search_variant import (
    CODE,
    PARAMS,
    SENTENCE_FIELDS,
    sentence_params,
)
from service.decode.search.device_history import backtrace
from service.decode.shared.controls import NO_CONTROLS, Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import max_length
from service.decode.shared.search_types import Hypothesis

NEG_INF = -math.inf


@dataclass(slots=True)
class SentenceEntry:
    """A sentence of the batch, as the host knows it."""

    id: Hashable
    options: SearchOptions
    src_len: int
    max_len: int
    pool: int  # its row of the history buffers
    controls: Controls = NO_CONTROLS  # a prefix, single suppressed tokens, a minimum length

    @property
    def wanted(self) -> int:
        return self.options.n_best


def device_controls(controls: Controls) -> bool:
    """Whether the device search applies a sentence's controls: a target prefix (forced), single
    suppressed tokens and a minimum length (masks). What reads a hypothesis's own tokens (n-gram
    blocking, a suppressed sequence, a repetition penalty), samples, alternatives, glossary
    constraints and the end forced at the maximum length stay with the numpy search."""
    return (
        all(len(seq) == 1 for seq in controls.suppress)
        and not controls.no_repeat_ngram_size
        and controls.repetition_penalty == 1.0
        and not controls.alternatives
        and not controls.sampling
        and not controls.constraints
        and not controls.force_eos
    )


# per sentence of the batch, the columns of DeviceSearch._meta (B, 7) int64: its steps (as the
# device counts them), history row, hypotheses kept, and what it needs of the graph (SearchVariant's
# coverage, controls, attention, wide: 0 or 1)
STEPS, POOL, WANTED, COVERAGE, CONTROLS, ATTENTION, WIDE = range(7)


@dataclass(slots=True)
class KnownOptions:
    """What the host derives from one options object (a batch's sentences share a few): its
    maximum lengths by source length, its settings rows by maximum length, its needs."""

    options: SearchOptions
    max_lens: dict[int, int]
    rows: dict[int, np.ndarray]  # (len(PARAMS),) float64
    needs: tuple[int, int, int, int, int]  # WANTED, COVERAGE, CONTROLS (0), ATTENTION, WIDE

    @classmethod
    def of(cls, options: SearchOptions) -> KnownOptions:
        needs = (
            options.n_best,
            int(options.coverage_penalty > 0),
            0,
            int(options.return_attention),
            int(options.n_best > 1),
        )
        return cls(options, {}, {}, needs)

    def max_len(self, src_len: int) -> int:
        """rules.max_length for a source of src_len tokens (without a prefix)."""
        max_len = self.max_lens.get(src_len)
        if max_len is None:
            max_len = self.max_lens[src_len] = max_length(self.options, src_len)
        return max_len

    def row(self, max_len: int) -> np.ndarray:
        row = self.rows.get(max_len)
        if row is None:
            row = self.rows[max_len] = np.array(sentence_params(self.options, max_len))
        return row


def finished_hypotheses(
    fields: np.ndarray,
    history: np.ndarray,
    attention: np.ndarray,
    where: np.ndarray,
    wanted: np.ndarray,
    entries: Sequence[SentenceEntry],
    K: int,
) -> list[list[Hypothesis]]:
    """Each finished sentence's n-best list from its fields (D, W), histories and attention rows
    at `where` (D,): its first `wanted` (D,) entries with a score, best first, back-traced
    together."""
    n = SENTENCE_FIELDS
    scores = fields[:, n : n + K]  # (D, K) best first, -inf where none
    valid = (scores > NEG_INF) & (np.arange(K) < wanted[:, None])
    d, j = np.nonzero(valid)  # entries (E,), best first within a sentence
    codes = fields[d, n + 2 * K + j].astype(np.int64)
    paths = backtrace(history, where[d], codes)
    score, log_prob = scores[d, j].tolist(), fields[d, n + K + j].tolist()
    by_eos = paths.by_eos.tolist()
    tokens, lengths = paths.tokens.tolist(), paths.steps.tolist()
    out: list[list[Hypothesis]] = [[] for _ in entries]
    T = paths.tokens.shape[1]
    at = np.arange(T)
    for e, dd in enumerate(d.tolist()):
        entry, length = entries[dd], lengths[e]
        rows_attention = None
        if entry.options.return_attention:
            rows_attention = attention[
                where[dd], at[:length], paths.parents[e, :length], : entry.src_len
            ]  # (T, src_len)
        out[dd].append(
            Hypothesis(
                tokens=tokens[e] if length == T else tokens[e][:length],
                score=score[e],
                log_prob=log_prob[e],
                attention=rows_attention,
                finished_by_eos=by_eos[e],
                token_log_probs=paths.log_probs[e, :length],
            )
        )
    return out


def settled_prefixes(
    fields: np.ndarray,
    history: np.ndarray,
    attention: np.ndarray,
    where: np.ndarray,
    steps: np.ndarray,
    wanted: np.ndarray,
    entries: Sequence[SentenceEntry],
    K: int,
) -> list[Hypothesis | None]:
    """Each decoding sentence's settled prefix (search.Search.settled): what its live slots
    after `steps` (D,) steps and the first `wanted` (D,) finished hypotheses it keeps share,
    back-traced together from its fields (D, W), histories and attention rows at `where` (D,);
    the first path's log-probs and attention rows cut to it (None: a sentence with no path)."""
    n = SENTENCE_FIELDS
    kept = (fields[:, n : n + K] > NEG_INF) & (np.arange(K) < wanted[:, None])  # (D, K)
    live = fields[:, n + 3 * K : n + 4 * K] > NEG_INF  # (D, K)
    d_live, j_live = np.nonzero(live)
    d_kept, j_kept = np.nonzero(kept)
    d = np.concatenate([d_live, d_kept])  # (E,)
    codes = np.concatenate(
        [j_live + CODE * 2 * steps[d_live], fields[d_kept, n + 2 * K + j_kept].astype(np.int64)]
    )
    order = np.argsort(d, kind="stable")  # each sentence's paths together, its live ones first
    d, codes = d[order], codes[order]
    paths = backtrace(history, where[d], codes)
    out: list[Hypothesis | None] = [None] * len(entries)
    starts = np.searchsorted(d, np.arange(len(entries) + 1))
    for dd, entry in enumerate(entries):
        a, b = int(starts[dd]), int(starts[dd + 1])
        if a == b:
            continue
        lengths = paths.steps[a:b]
        size = int(lengths.min())
        tokens = paths.tokens[a:b, :size]  # (E_d, size)
        differ = (tokens != tokens[0]).any(axis=0)
        size = int(np.argmax(differ)) if differ.any() else size
        rows_attention = None
        if entry.options.return_attention:
            rows_attention = attention[
                where[dd], np.arange(size), paths.parents[a, :size], : entry.src_len
            ]  # (size, src_len)
        log_probs = paths.log_probs[a, :size]
        total = float(np.sum(log_probs, dtype=np.float64))
        out[dd] = Hypothesis(
            paths.tokens[a, :size].tolist(), total, total, rows_attention, False, log_probs
        )
    return out


def control_inputs(
    entries: Sequence[SentenceEntry], meta: np.ndarray, K: int, eos_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """The controlled sentences' step inputs: each row's forced token (N,) (-1: none) and the
    (row, token) pairs blocked (P, 2), from each sentence's own steps."""
    forced = np.full(len(entries) * K, -1, np.int64)  # (N,)
    pairs: list[np.ndarray] = []
    for b in np.flatnonzero(meta[:, CONTROLS]).tolist():
        controls, step = entries[b].controls, int(meta[b, STEPS])
        if step < len(controls.prefix):  # forced: nothing else applies
            forced[b * K : (b + 1) * K] = controls.prefix[step]
            continue
        tokens = [seq[0] for seq in controls.suppress]
        if step < controls.min_length:
            tokens.append(eos_id)
        if tokens:
            rows = np.repeat(np.arange(b * K, (b + 1) * K), len(tokens))
            pairs.append(np.stack([rows, np.tile(tokens, K)], axis=1))
    blocked = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)  # (P, 2)
    return forced, blocked


def joining_columns(
    entries: Sequence[SentenceEntry], known_of: Callable[[SearchOptions], KnownOptions]
) -> tuple[np.ndarray, np.ndarray]:
    """The joining sentences' columns: their meta (n, 7) (STEPS..WIDE) and settings (P, n), made
    once per options object and maximum length."""
    n = len(entries)
    groups: dict[tuple[int, int], tuple[SearchOptions, list[int]]] = {}
    controlled = []
    for i, e in enumerate(entries):
        groups.setdefault((id(e.options), e.max_len), (e.options, []))[1].append(i)
        if e.controls is not NO_CONTROLS and e.controls.active:
            controlled.append(i)
    meta = np.zeros((n, 7), np.int64)
    meta[:, POOL] = np.fromiter((e.pool for e in entries), np.int64, n)
    settings = np.empty((len(PARAMS), n))  # (P, n)
    for (_, max_len), (options, at) in groups.items():
        known = known_of(options)
        settings[:, at] = known.row(max_len)[:, None]
        meta[at, WANTED:] = known.needs
    meta[controlled, CONTROLS] = 1
    settings[PARAMS.index("pool")] = meta[:, POOL]
    return meta, settings
