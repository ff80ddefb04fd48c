"""The worker's running batches behind one protocol: Translate's beam searches and Align's
teacher-forced passes, stepped, filled and emptied alike, so the decode loop (service/serve/worker.py)
branches on neither.

Each class wraps the decode core's batch (service/decode/engine/engine.py's RunningBatch,
service/decode/align/aligner.py's ForcedBatch) under the worker's keys: it makes the engine's
request for a queued sentence and turns what a step finished into a job's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from service.decode.align.aligner import ForcedBatch
from service.decode.align.pair_answers import ForcedRequest, aligned_of
from service.decode.engine.engine import Engine, RunningBatch
from service.decode.runtime.encoded import EncodedSentence
from service.decode.shared.errors import DecodeFailed
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import DecodeRequest
from service.serve.jobs import RawResult, Result, SentenceKey
from service.serve.scheduler import BatchKey

log = logging.getLogger("service.serve.worker")  # the decode loop's log, as before the split

Finished = tuple[SentenceKey, Result | RawResult | DecodeFailed]  # a sentence that left a step


class Batch(Protocol):
    """What the worker does with a running batch, whichever kind it is."""

    def __len__(self) -> int:
        """Sentences (or pairs) in the batch."""
        ...

    @property
    def num_hypotheses(self) -> int:
        """Rows of the next step."""
        ...

    def sentences(self) -> list[SentenceKey]:
        """The sentences in the batch."""
        ...

    def add(self, keys: Sequence[SentenceKey], rows: Sequence[list[EncodedSentence]]) -> None:
        """Join these sentences, rows[i] the encoder's rows of keys[i]'s parts."""
        ...

    def step(self) -> list[Finished]:
        """One decoder call: the sentences that finished, with their results (raw for a raw job's);
        a sentence whose result could not be made has its DecodeFailed in place of the result."""
        ...

    def take_failed(self) -> list[tuple[SentenceKey, Exception]]:
        """The sentences that failed on their own since the last call (their controls)."""
        ...

    def remove(self, keys: Collection[SentenceKey]) -> None:
        """Drop these sentences mid-decode (their job was cancelled or failed)."""
        ...

    def progress(self) -> list[tuple[SentenceKey, Hypothesis]]:
        """After a step: the sentences of streamed jobs whose settled prefix grew, with it."""
        ...


class Shared:
    """What both kinds do alike over the decode core's batch, which holds its requests under the
    worker's keys."""

    batch: RunningBatch[SentenceKey] | ForcedBatch[SentenceKey]

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def num_hypotheses(self) -> int:
        return self.batch.num_hypotheses

    def sentences(self) -> list[SentenceKey]:
        return [r.key for r in self.batch.requests.values()]

    def take_failed(self) -> list[tuple[SentenceKey, Exception]]:
        return [(r.key, error) for r, error in self.batch.take_failed()]

    def remove(self, keys: Collection[SentenceKey]) -> None:
        self.batch.remove(keys)


class TranslateBatch(Shared):
    """Translate's running batch: the beam searches of one model version and beam size."""

    def __init__(self, batch: RunningBatch[SentenceKey]) -> None:
        self.batch: RunningBatch[SentenceKey] = batch

    def add(self, keys: Sequence[SentenceKey], rows: Sequence[list[EncodedSentence]]) -> None:
        self.batch.add([sentence_request(k) for k in keys], rows)
        self.batch.watch([k for k in keys if k.job.on_progress is not None])

    def step(self) -> list[Finished]:
        engine = self.batch.engine
        return [
            (r.key, parts if r.key.job.raw else alone(engine.translation_of, r, parts))
            for r, parts in self.batch.step_raw()
        ]

    def progress(self) -> list[tuple[SentenceKey, Hypothesis]]:
        return [(r.key, prefix) for r, prefix in self.batch.settled()]


class AlignBatch(Shared):
    """Align's forced batch: one model version's pairs, teacher-forced one row each."""

    def __init__(self, batch: ForcedBatch[SentenceKey]) -> None:
        self.batch: ForcedBatch[SentenceKey] = batch

    def add(self, keys: Sequence[SentenceKey], rows: Sequence[list[EncodedSentence]]) -> None:
        self.batch.add([forced_request(k) for k in keys], rows)

    def progress(self) -> list[tuple[SentenceKey, Hypothesis]]:
        return []  # a forced pass has nothing to settle

    def step(self) -> list[Finished]:
        engine = self.batch.engine
        return [
            (
                r.key,
                (forced, logits) if r.key.job.raw else alone(aligned_of, engine, r, forced, logits),
            )
            for r, forced, logits in self.batch.step_raw()
        ]


def new_batch(engine: Engine, key: BatchKey) -> Batch:
    """A running batch for `key`: a beam search of its beam size, or Align's forced pass."""
    if key.forced:
        return AlignBatch(ForcedBatch(engine, key.attention))  # type: ignore[arg-type]
    return TranslateBatch(engine.new_batch(key.beam))


def sentence_request(key: SentenceKey) -> DecodeRequest[SentenceKey]:
    """The engine's request for one queued sentence of a job."""
    job = key.job
    options = job.options.for_text(key.index)  # its own target prefix
    controls = None if job.controls is None else job.controls[key.index]
    return DecodeRequest(key, job.sentences[key.index], options, job.alignment, controls)


def forced_request(key: SentenceKey) -> ForcedRequest[SentenceKey]:
    """The engine's request for one queued pair of an Align job."""
    job = key.job
    assert job.align_options is not None
    return ForcedRequest(key, job.pairs[key.index], job.align_options)


def alone(make: Callable[..., Result], *args: Any) -> Result | DecodeFailed:
    """make(*args), or the DecodeFailed that fails this one sentence (the cause logged)."""
    try:
        return make(*args)
    except Exception as err:
        log.exception("a finished sentence's answer could not be made")
        return DecodeFailed(f"this text's answer could not be made ({type(err).__name__}); logged")
