"""Encoder outputs: a group's tensors (Encoded), one sentence's rows (EncodedSentence), and how
sentences are padded and grouped by length for the encoder's calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.decode.runtime.device import Device, host_view
from service.model.architecture import PAD_ID


@dataclass(eq=False)
class Encoded:
    """Encoder outputs for a group of sentences, as OrtValues on the session's device."""

    values: ort.OrtValue  # (B, S, D)
    keys: ort.OrtValue  # (B, S, Dk), or (B, 1, D) for attention "none"
    mask: ort.OrtValue  # (B, S) bool
    state: ort.OrtValue  # (B, D_state) initial decoder states
    device: Device

    @property
    def tensors(self) -> tuple[ort.OrtValue, ort.OrtValue, ort.OrtValue, ort.OrtValue]:
        """values, keys, mask, state: what `RowOps.gather_append` reads rows of."""
        return self.values, self.keys, self.mask, self.state

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape()[0])


class EncodedSentence:
    """One sentence's encoder outputs: the unit that waits between an encoder call and the sentence
    joining a running batch (on another thread, the encode-ahead's, maybe).

    Either its row of an encoder call's outputs, left on the device where the encoder wrote them
    (`EncodedSentence.row_of`: the running batch copies the row device to device when the sentence
    joins, `RowOps.gather_append`; nothing crosses to the host), or host arrays cut to its own
    length, values (S_i, D), keys (S_i, Dk) or (1, D) for attention "none", state (D_state,) (as
    tests and host references build them). `values`, `keys` and `state` read a device row to the
    host (a copy, counted): the decode loop never does."""

    __slots__ = ("_arrays", "batch", "keys_follow_source", "length", "row")

    def __init__(self, values: np.ndarray, keys: np.ndarray, state: np.ndarray) -> None:
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = (values, keys, state)
        self.batch: Encoded | None = None
        self.row = 0
        self.length = int(values.shape[0])
        self.keys_follow_source = True

    @classmethod
    def row_of(
        cls, batch: Encoded, row: int, length: int, keys_follow_source: bool
    ) -> EncodedSentence:
        """Row `row` (of `length` positions) of an encoder call's outputs, left on the device."""
        sentence = cls.__new__(cls)
        sentence._arrays = None
        sentence.batch, sentence.row, sentence.length = batch, row, length
        sentence.keys_follow_source = keys_follow_source
        return sentence

    @property
    def on_device(self) -> bool:
        return self.batch is not None

    @property
    def state_width(self) -> int:
        """D_state: its initial decoder state's width."""
        if self.batch is not None:
            return int(self.batch.state.shape()[1])
        return len(self.state)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, keys, state) on the host: a device row is downloaded (once, counted)."""
        if self._arrays is None:
            batch = self.batch
            assert batch is not None
            n, b = self.length, self.row
            values = batch.device.download(batch.values, "encoder_rows")[b, :n]
            keys = batch.device.download(batch.keys, "encoder_rows")[b]
            keys = keys[:n] if self.keys_follow_source else keys
            state = batch.device.download(batch.state, "state")[b]
            self._arrays = (values.copy(), keys.copy(), state.copy())
        return self._arrays

    @property
    def values(self) -> np.ndarray:
        return self.arrays()[0]

    def own_values(self) -> np.ndarray:
        """Its values (S_i, D) as a host array of its own. Where the device's memory is the host's,
        its row is read in place and copied alone (`values` copies the whole batch's outputs to
        cut its row: a cost per sentence that grows with the batch)."""
        batch = self.batch
        if self._arrays is not None or batch is None or batch.device.type != "cpu":
            return self.values
        B, S, D = batch.values.shape()
        return host_view(batch.values, (B, S, D))[self.row, : self.length].copy()

    @property
    def keys(self) -> np.ndarray:
        return self.arrays()[1]

    @property
    def state(self) -> np.ndarray:
        return self.arrays()[2]


def split_sentences(
    encoded: Encoded, lengths: np.ndarray, keys_follow_source: bool
) -> list[EncodedSentence]:
    """A batch's encoder outputs → one EncodedSentence per sentence, each its row of them, left on
    the device until it joins a running batch (the rows hold the batch's tensors alive)."""
    return [
        EncodedSentence.row_of(encoded, b, n, keys_follow_source)
        for b, n in enumerate(lengths.tolist())
    ]


def first_widths(sentence: EncodedSentence) -> tuple[int, int, int]:
    """(D, Dk, key_len) of a sentence's encoder outputs: the running batch's buffers' widths."""
    if sentence.batch is not None:
        values, keys = sentence.batch.values.shape(), sentence.batch.keys.shape()
        return int(values[2]), int(keys[2]), sentence.length if sentence.keys_follow_source else 1
    return sentence.values.shape[1], sentence.keys.shape[1], sentence.keys.shape[0]


def pad_ids(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists → src (B, S) int64 padded with PAD, lengths (B,) int64."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
    src = np.full((len(rows), int(lengths.max())), PAD_ID, dtype=np.int64)  # (B, S)
    for i, r in enumerate(rows):
        src[i, : len(r)] = r
    return src, lengths


CALL_COST_SENTENCES = 2.0  # one encoder call costs about as much as two more sentences in it


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """Indices grouped into encoder calls by length, shortest first, minimizing the modelled cost
    Σ over calls of (sentences + CALL_COST_SENTENCES) × longest source.

    The encoder's work follows batch × longest source, so one 70-token sentence among 15-token ones
    makes the whole call ~4× the work; each extra call costs a fixed overhead instead (measured on the
    default model, one thread: 0.32 ms for one 20-token sentence, +0.15 ms per sentence more). The
    optimal split of the sorted lengths into contiguous groups is a small dynamic programme (n ≤ the
    batch limit).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the first j sorted sentences
    cut = [0] * (n + 1)  # cut[j]: where the last group of that best split starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):
            cost = best[i] + (j - i + CALL_COST_SENTENCES) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets: list[list[int]] = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]
