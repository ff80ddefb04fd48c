"""Encoding queued sentences on a thread of their own, while the decode loop steps the running batch.

Without it, every admission stalls the running batch for one encoder call: under iteration-level
batching, where sentences join before almost every step, the encoder took ~20 % of the decode loop.
ONNX Runtime releases the GIL, so on two cores this thread's encoder call overlaps the loop's decoder
step. The scheduler admits into a running batch only the sentences whose encoding is ready; a loop
with nothing running admits at once and encodes what is not ready itself (`take` + the caller's own
encoder call), so an idle server adds no latency.

Memory stays bounded: at most `max_ready` encoded sentences per model wait here, and a sentence that
leaves the queue (admitted, cancelled, expired) is forgotten, so its encoding is dropped or never stored.

Turns between requests: each sentence is submitted with its owner (the worker: its request id), and
the thread encodes in turns between owners, as the scheduler admits (service/serve/scheduler.py's
`fair_share`): every owner's next sentence before any owner's one after, counting the encodings an
owner already holds here; while an owner holds several, a sentence whose owner holds none is
encoded even when the room is full.
A document of 200 sentences queued first then neither fills the room nor keeps the one-sentence
requests behind it from joining (a running batch admits only encoded sentences).

Several models: each sentence is submitted with its model (any hashable; the worker's: a
ModelVersion) and encoded with it; one encoder call holds one model's sentences, the models take
turns, and each has its own room, so a flood of one model's sentences never keeps another's waiting
for its encoding.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
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
        self.owner_of: dict[Hashable, Hashable] = {}  # pending, in_flight and ready keys → owner
        self.in_flight: set[Hashable] = set()  # inside the current encoder call
        self.ready: dict[Hashable, EncodedT | None] = {}  # None: failed, encode at admission
        self.model_of: dict[Hashable, Hashable] = {}  # in_flight and ready keys → model
        self.last_model: Hashable = None  # the model of the latest encoder call
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="encode-ahead", daemon=True)

    # --- the decode loop's side ---------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(
        self,
        items: Sequence[tuple[Hashable, SentenceT]],
        model: Hashable = None,
        owner: Hashable = None,
    ) -> None:
        """Queue sentences (key, sentence) of `model` for encoding, after the ones already queued;
        `owner`: whose they are, for the turns (None: each sentence its own)."""
        if not items:
            return
        with self.cond:
            self.pending.update((key, (model, ids)) for key, ids in items)
            self.owner_of.update((key, key if owner is None else owner) for key, _ in items)
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
                self.owner_of.pop(key, None)
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
        """Wait for pending sentences of a model to encode (`encodable`); returns that model and
        those sentences; None when stopping."""
        with self.cond:
            while not self.stopping and not (models := self.next_models()):
                self.cond.wait()
            if self.stopping:
                return None
            model = models[0]
            keys = self.encodable(model)
            batch = [(key, self.pending.pop(key)[1]) for key in keys]
            self.in_flight.update(keys)
            self.model_of.update((key, model) for key in keys)
            self.last_model = model
            return model, batch

    def next_models(self) -> list[Hashable]:
        """The models to encode, first the next: those with sentences to encode (`encodable`), in
        order of their oldest pending sentence, the one encoded last going after the others."""
        models = [
            m for m in dict.fromkeys(m for m, _ in self.pending.values()) if self.encodable(m)
        ]
        if len(models) > 1 and models[0] == self.last_model:
            models.append(models.pop(0))
        return models

    def encodable(self, model: Hashable) -> list[Hashable]:
        """The model's pending sentences to encode next (at most max_batch): in turns between
        their owners (an owner's turn: its encodings held here, then its sentences ahead in the
        queue; arrival order within a turn), within the model's room, and beyond it, while an
        owner holds several, a sentence whose owner holds none."""
        held = Counter(self.owner_of.get(k) for k, m in self.model_of.items() if m == model)
        seen: Counter[Hashable] = Counter()
        turns: list[tuple[int, int, Hashable]] = []
        for key, (m, _) in self.pending.items():
            if m == model:
                owner = self.owner_of.get(key, key)
                turns.append((held[owner] + seen[owner], len(turns), key))
                seen[owner] += 1
        turns.sort()
        room = self.max_ready - self.held(model)
        hoarded = any(n > 1 for n in held.values())  # one owner's several fill the room
        chosen = [
            key for n, (turn, _, key) in enumerate(turns) if n < room or (hoarded and turn == 0)
        ]
        return chosen[: self.max_batch]

    def held(self, model: Hashable) -> int:
        """The encodings of `model` kept or being made here."""
        return sum(1 for m in self.model_of.values() if m == model)

    def has_room(self, model: Hashable = None) -> bool:
        return self.held(model) < self.max_ready
