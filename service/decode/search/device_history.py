"""The device search's history: its buffers on the device, a row per sentence of a pool and a
column per step (`History`), and finished hypotheses back-traced from them (`backtrace`, `Paths`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.decode.runtime.search_variant import (
    CODE,
)
from service.decode.search.beam_sentences import trace_slots
from service.decode.search.search_memory import SearchMemory


class History:
    """The history buffers on the device, one row per sentence of the pool, one column per step:
    `fields` (P, L, 2, K) float32 (codes and log-probs) and, while a sentence of the batch returns
    its alignment, `attention` (P, L, K, S) float32 on the batch's source axis S: `shape`
    (P, L, K, S) is read over the leading elements of buffers that may be larger. They grow (larger
    buffers, the live entries copied) when a sentence needs a row or a step beyond them, follow S
    when it changes (cut columns are padding: every sentence left has a shorter source); with no
    live entry (an emptied batch: under churn at small batches, at every step) a new shape is read
    over the same buffers, nothing copied. `memory`: where they live (service/decode/search/search_memory.py:
    numpy where the device's memory is the host's, graph runs elsewhere)."""

    MIN_ROWS, MIN_STEPS = 16, 32
    KEEP_BYTES = 16 << 20  # an emptied batch keeps history buffers up to this size

    def __init__(self, memory: SearchMemory, K: int) -> None:
        self.memory = memory
        self.K = K
        self.fields: ort.OrtValue | None = None
        self.attention: ort.OrtValue | None = None
        self.shape: tuple[int, int, int, int] = (0, 0, K, 0)  # (P, L, K, S)
        self.with_attention = False  # the attention buffer follows the shape
        self.live = False  # entries of sentences still decoding are in the buffers
        self.free: list[int] = []
        self.used = 0  # rows handed out so far (free rows are reused first)

    @property
    def fields_shape(self) -> tuple[int, int, int, int]:
        """(P, L, 2, K)."""
        P, L, K, _ = self.shape
        return (P, L, 2, K)

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.used += 1
        return self.used - 1

    def give_back(self, rows: Sequence[int]) -> None:
        self.free.extend(rows)

    def fit(self, steps: int, source_len: int, attention: bool) -> bool:
        """Room for `used` rows and `steps` steps (and, with `attention`, the attention rows on a
        source axis of `source_len`); True when the buffers or their shape changed (a binding to
        the old ones is stale)."""
        P, L, K, S = self.shape
        S_new = source_len if attention else S
        if (
            self.fields is not None
            and self.used <= P
            and steps <= L
            and S_new == S
            and attention == self.with_attention
        ):
            return False
        shape = (
            P if self.used <= P else max(2 * P, self.used, self.MIN_ROWS),
            L if steps <= L else max(2 * L, steps, self.MIN_STEPS),
            K,
            S_new,
        )
        fields_shape = (shape[0], shape[1], 2, K)
        if self.live:  # entries to keep: new buffers, the entries copied
            if fields_shape != self.fields_shape:
                self.fields = self._refit(self.fields, self.fields_shape, fields_shape)
            if attention and self.with_attention:
                self.attention = self._refit(self.attention, self.shape, shape)
            elif attention:  # nobody decoding asked for its rows before: they start now
                self.attention = self._empty(shape)
        else:
            if not fits(self.fields, fields_shape):
                self.fields = self._empty(fields_shape)
            if attention and not fits(self.attention, shape):
                self.attention = self._empty(shape)
        self.with_attention = attention
        self.shape = shape
        return True

    def _empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return self.memory.empty(shape)

    def _refit(
        self, old: ort.OrtValue | None, have: tuple[int, ...], shape: tuple[int, ...]
    ) -> ort.OrtValue:
        """A buffer of `shape` holding old's entries (read as `have`; cut to its last axis where
        shorter)."""
        return self._empty(shape) if old is None else self.memory.refit(old, have, shape)

    def reset(self) -> None:
        """No sentence holds a row any more: the buffers stay (the large ones go), with no live
        entry."""
        self.free = []
        self.used = 0
        self.live = False
        P, L, K, S = self.shape
        if P * L * K * (2 + S) * 4 > self.KEEP_BYTES:
            self.fields = self.attention = None
            self.with_attention = False
            self.shape = (0, 0, self.K, 0)


def fits(buffer: ort.OrtValue | None, shape: tuple[int, ...]) -> bool:
    """Whether a buffer holds at least the elements of `shape`."""
    return buffer is not None and math.prod(buffer.shape()) >= math.prod(shape)


@dataclass(frozen=True)
class Paths:
    """Finished hypotheses back-traced: for entry e, its tokens, back-pointers and slots at each
    step t < steps[e] (E, T) int64 each, and its tokens' log-probs (E, T) float32."""

    tokens: np.ndarray
    parents: np.ndarray
    slots: np.ndarray
    steps: np.ndarray  # (E,)
    by_eos: np.ndarray  # (E,) bool
    log_probs: np.ndarray


def backtrace(history: np.ndarray, rows: np.ndarray, codes: np.ndarray) -> Paths:
    """The paths of E finished hypotheses from the histories (·, T, 2, K) at rows (E,) and their
    n-best codes (slot + CODE·(2·steps + by_eos)): a few paths each chased in Python over its own
    back-pointers (a list index a step), many all at once, a step back for every entry per numpy
    call (each entry's block read once: a gather of whole rows, then flat takes).

    Step t's column holds each new slot's code (token · CODE + parent) and that token's log-prob;
    the attention row that produced a slot's token is its parent's (beam.py's
    beam_sentences.History.backtrace)."""
    code = np.asarray(codes, np.int64)  # (E,)
    slot, rest = code % CODE, code // CODE
    steps, by_eos = rest // 2, (rest % 2).astype(bool)
    E, T = len(code), int(steps.max(initial=0))
    if E < VECTOR_ENTRIES:
        return _backtrace_each(history, rows, slot, steps, by_eos, T)
    K = history.shape[-1]
    blocks = np.take(history, rows, axis=0)[:, :T]  # (E, T, 2, K) float32
    table = blocks[:, :, 0].astype(np.int64)  # (E, T, K) codes
    slots = np.zeros((E, T), np.int64)
    flat = table.reshape(-1)
    base = np.arange(E) * (T * K)  # (E,) each entry's block in `flat`
    same = bool((steps == T).all())  # a static batch's: no entry waits for its last step
    for t in range(T - 1, -1, -1):
        slots[:, t] = slot
        back = flat.take(base + t * K + slot) % CODE
        slot = back if same else np.where(t < steps, back, slot)
    at = base[:, None] + np.arange(T) * K + slots  # (E, T) into (E, T, K)
    tokens, parents = np.divmod(flat.take(at), CODE)  # (E, T) each
    log_probs = np.ascontiguousarray(blocks[:, :, 1]).reshape(-1).take(at)  # (E, T) float32
    return Paths(tokens, parents, slots, steps, by_eos, log_probs)


def _backtrace_each(
    history: np.ndarray,
    rows: np.ndarray,
    slot: np.ndarray,
    steps: np.ndarray,
    by_eos: np.ndarray,
    T: int,
) -> Paths:
    """`backtrace` of a few entries, each over its own block (a view): its slots chased in Python
    over its back-pointers, its codes and log-probs then read at them."""
    E = len(rows)
    tokens = np.zeros((E, T), np.int64)
    parents = np.zeros((E, T), np.int64)
    slots = np.zeros((E, T), np.int64)
    log_probs = np.zeros((E, T), np.float32)
    entries = zip(rows.tolist(), steps.tolist(), slot.tolist(), strict=True)
    for e, (row, n, last) in enumerate(entries):
        block = history[row, :n]  # (n, 2, K)
        codes = block[:, 0].astype(np.int64)  # (n, K)
        path = slots[e, :n]
        trace_slots(codes % CODE, last, path)
        at = np.arange(n)
        tokens[e, :n], parents[e, :n] = np.divmod(codes[at, path], CODE)
        log_probs[e, :n] = block[at, 1, path]
    return Paths(tokens, parents, slots, steps, by_eos, log_probs)


VECTOR_ENTRIES = 48  # from this many finished hypotheses on, `backtrace` goes step by step
