"""The decode's encoder rows, kept for the link head that reads the same sources next.

Translate with markup puts a text's tags back by the link head's links between the source and each
hypothesis (service/decode/requests/marked.py), and the head reads the source's encoder rows. The decode has
just computed them: `KeptRows` keeps the rows (values (S, D), the head's input) of the sentences whose
job asks for it, by the token ids they read, and the head reads them instead of calling the encoder
again: in s2s-translate (one process) and in the server, where the engine that decoded a job keeps
its rows for the front's HEADS message (service/serve/engine_host.py).

Rows stay until newer ones push them out, past `max_bytes` (a head that misses them encodes its
sources, as before): reading does not remove them, since two requests in flight may send the same
text (418 texts at 64 clients share one about every hundred requests), and a job may never ask for
its rows (cancelled, failed, answered from the memory). Thread-safe: the decode loop keeps, the link
head's thread reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import numpy as np

from service.decode.runtime.encoded import EncodedSentence

SourceRows = Mapping[tuple[int, ...], np.ndarray]  # a source's encoder values (S, D), by its ids
MAX_BYTES = 32 * 2**20  # ~270 verses of grc-en-nt (60 pieces x 512 floats each)


class Sentence(Protocol):
    """What the store reads of a prepared sentence (service/decode/engine/engine.py's Prepared)."""

    @property
    def ids(self) -> list[int]: ...

    @property
    def segments(self) -> Sequence[object]: ...


SentenceT = TypeVar("SentenceT", bound=Sentence)


class KeptRows:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, sentence: Sentence, encoded: EncodedSentence) -> None:
        """A sentence's rows, as its encoder call made them (a segmented sentence's rows are its
        segments': the head reads the whole source, so nothing is kept)."""
        if sentence.segments:
            return
        key = tuple(sentence.ids)
        with self._lock:
            if key in self._rows:  # the same ids, the same rows: kept once, as the newest
                self._rows.move_to_end(key)
                return
        values = encoded.own_values()  # (S, D)
        with self._lock:
            old = self._rows.pop(key, None)
            self._bytes += values.nbytes - (old.nbytes if old is not None else 0)
            self._rows[key] = values
            while self._bytes > self.max_bytes and self._rows:
                _, dropped = self._rows.popitem(last=False)
                self._bytes -= dropped.nbytes

    def find(self, keys: Iterable[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
        """The rows kept for these sources (those still here)."""
        with self._lock:
            return {key: self._rows[key] for key in keys if key in self._rows}

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keeping(
        self, encode: Callable[[Sequence[SentenceT]], list[list[EncodedSentence]]]
    ) -> Callable[[Sequence[SentenceT]], list[list[EncodedSentence]]]:
        """An encoder that keeps the rows it makes here (s2s-translate's decode of texts with
        markup: the link head reads them after)."""

        def encode_and_keep(sentences: Sequence[SentenceT]) -> list[list[EncodedSentence]]:
            encoded = encode(sentences)
            for sentence, rows in zip(sentences, encoded, strict=True):
                self.keep(sentence, rows[0])
            return encoded

        return encode_and_keep
