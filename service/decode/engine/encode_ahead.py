"""Encoding queued sentences on a thread of their own, while the decode loop steps the running batch.

Without it, every admission stalls the running batch for one encoder call: under iteration-level
batching, where sentences join before almost every step, the encoder took ~20 % of the decode loop.
ONNX Runtime releases the GIL, so on two cores this thread's encoder call overlaps the loop's decoder
step. The scheduler admits into a running batch only the sentences whose encoding is ready; a loop
with nothing running admits at once and encodes what is not ready itself (`take` + the caller's own
encoder call), so an idle server adds no latency.

Memory stays bounded: at most `max_ready` encoded sentences per model wait here, and a sentence that
leaves the queue (admitted, cancelled, expired) is forgotten, so its encoding is dropped or never stored.

Several models: each sentence is submitted with its model (any hashable; the worker's: a
ModelVersion) and encoded with it; one encoder call holds one model's sentences, the models take
turns, and each has its own room, so a flood of one model's sentences never keeps another's waiting
for its encoding.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

SentenceT = TypeVar("SentenceT")  # what is encoded (the worker's: an engine's Prepared)
EncodedT = TypeVar("EncodedT")  # what comes out (the worker's: each segment's EncodedSentence)


class EncodeAhead(Generic[SentenceT, EncodedT]):
    """Sentences in (arrival order), encoder rows out, keyed by the queue's sentence keys.

    encode(model, sentences) → one result per sentence, in order."""

    def __init__(
        self,
        encode: Callable[[Hashable, list[SentenceT]], list[EncodedT]],
        max_batch: int,
        max_ready: int,
    ) -> None:
        if max_batch < 1 or max_ready < 1:
            raise ValueError("max_batch and max_ready must be >= 1")
        self.encode = encode
        self.max_batch = max_batch
        self.max_ready = max_ready
        self.cond = threading.Condition()
        self.pending: dict[Hashable, tuple[Hashable, SentenceT]] = {}  # key → (model, sentence)
        self.in_flight: set[Hashable] = set()  # inside the current encoder call
        self.ready: dict[Hashable, EncodedT | None] = {}  # None: failed, encode at admission
        self.model_of: dict[Hashable, Hashable] = {}  # in_flight and ready keys → model
        self.last_model: Hashable = None  # the model of the latest encoder call
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="encode-ahead", daemon=True)

    # --- the decode loop's side ---------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, items: Sequence[tuple[Hashable, SentenceT]], model: Hashable = None) -> None:
        """Queue sentences (key, sentence) of `model` for encoding, after the ones already queued."""
        if not items:
            return
        with self.cond:
            self.pending.update((key, (model, ids)) for key, ids in items)
            self.cond.notify()

    def ready_keys(self) -> frozenset[Hashable]:
        """The sentences that can join a running batch without an encoder call."""
        with self.cond:
            return frozenset(self.ready)

    def take(self, keys: Collection[Hashable]) -> dict[Hashable, EncodedT]:
        """The ready encodings of these keys; every one of the keys is forgotten here."""
        taken: dict[Hashable, EncodedT] = {}
        with self.cond:
            for key in keys:
                encoded = self.ready.pop(key, None)
                if encoded is not None:
                    taken[key] = encoded
                self.pending.pop(key, None)
                self.model_of.pop(key, None)
                self.in_flight.discard(key)  # its result, when it comes, is not stored
            self.cond.notify()  # room for more
        return taken

    def discard(self, keys: Collection[Hashable]) -> None:
        """Forget these sentences (cancelled, expired, failed)."""
        self.take(keys)

    def stop(self, timeout: float | None = None) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def __len__(self) -> int:
        with self.cond:
            return len(self.pending) + len(self.in_flight) + len(self.ready)

    # --- the encoder thread -------------------------------------------------------------------

    def run(self) -> None:
        while True:
            taken = self.next_batch()
            if taken is None:
                return
            model, batch = taken
            keys = [key for key, _ in batch]
            try:
                encoded: list[EncodedT | None] = list(self.encode(model, [s for _, s in batch]))
            except Exception:  # the decode loop encodes them again at admission and reports it
                log.exception("encoding ahead failed for %d sentences", len(batch))
                encoded = [None] * len(batch)
            with self.cond:
                for key, enc in zip(keys, encoded, strict=True):
                    if key in self.in_flight:
                        self.in_flight.discard(key)
                        self.ready[key] = enc

    def next_batch(self) -> tuple[Hashable, list[tuple[Hashable, SentenceT]]] | None:
        """Wait for pending sentences of a model with room to keep their encodings; returns that
        model and its oldest pending sentences; None when stopping."""
        with self.cond:
            while not self.stopping and not (models := self.next_models()):
                self.cond.wait()
            if self.stopping:
                return None
            model = models[0]
            room = self.max_ready - self.held(model)
            keys = [k for k, (m, _) in self.pending.items() if m == model][
                : min(self.max_batch, room)
            ]
            batch = [(key, self.pending.pop(key)[1]) for key in keys]
            self.in_flight.update(keys)
            self.model_of.update((key, model) for key in keys)
            self.last_model = model
            return model, batch

    def next_models(self) -> list[Hashable]:
        """The models to encode, first the next: those with pending sentences and room, in order of
        their oldest pending sentence, the one encoded last going after the others."""
        models = [m for m in dict.fromkeys(m for m, _ in self.pending.values()) if self.has_room(m)]
        if len(models) > 1 and models[0] == self.last_model:
            models.append(models.pop(0))
        return models

    def held(self, model: Hashable) -> int:
        """The encodings of `model` kept or being made here."""
        return sum(1 for m in self.model_of.values() if m == model)

    def has_room(self, model: Hashable = None) -> bool:
        return self.held(model) < self.max_ready
