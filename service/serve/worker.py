"""The decode loop: one thread that owns the running batches and applies the scheduler's decisions.

The gRPC server submits a `Job` (one request's sentences, for one model version) and gets its
translations back through the job's callback, called from this thread. Submitting never waits: a
full queue is refused at once. The running batches are keyed by (model version, beam size), so one
decoder call only ever holds one model version's hypotheses; the scheduler takes turns between
models (service/serve/scheduler.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from service.decode.align.aligner import ForcedBatch, ForcedRequest, aligned_of
from service.decode.align.forced import AlignedPair, AlignOptions, Forced
from service.decode.engine.encode_ahead import EncodeAhead
from service.decode.engine.engine import Engine, RunningBatch
from service.decode.runtime.encoded import EncodedSentence
from service.decode.search.beam import SearchOptions
from service.decode.shared.controls import Controls
from service.decode.shared.errors import (
    Cancelled,
    DeadlineExceeded,
    DecodeFailed,
    InvalidInput,
    QueueFull,
    ShuttingDown,
)
from service.decode.text.preparation import DecodeRequest, Prepared, RawParts
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation
from service.serve.metrics import Metrics
from service.serve.repository import ModelVersion, single
from service.serve.request_trace import NO_TRACE, RequestTrace
from service.serve.scheduler import BatchingConfig, BatchKey, Decision, Waiting, decide

log = logging.getLogger(__name__)

Clock = Callable[[], float]


Result = Translation | AlignedPair  # a Translate sentence's, an Align pair's
RawResult = RawParts | tuple[Forced, np.ndarray | None]  # a raw job's result per sentence or pair


@dataclass(eq=False)
class Job:
    """One request's sentences; `on_done(results, error)` is called once, from the worker thread.
    An Align job (`Job.align`) holds its pairs, and their sources as its sentences (what is encoded)."""

    request_id: str
    sentences: Sequence[Prepared]
    options: SearchOptions
    alignment: AlignmentMode
    on_done: Callable[[list[Any] | None, Exception | None], None]
    deadline: float | None = None  # clock reading
    model: ModelVersion | None = None  # None: the worker's default model
    results: dict[int, Result | RawResult] = field(default_factory=dict)
    finished: bool = False
    trace: RequestTrace = NO_TRACE  # the request's spans (service/serve/tracing.py)
    pairs: Sequence[PreparedPair] = ()  # Align: teacher-forced, one result per pair
    align_options: AlignOptions | None = None  # set for an Align job
    # results left as the search gives them (an engine process's: its front converts them):
    # a sentence's RawParts, a pair's (Forced, link head scores or None)
    raw: bool = False
    # each sentence's parts' controls, computed by the front (None: the batch computes them)
    controls: Sequence[tuple[Controls, ...]] | None = None
    # the link head reads its sources next (markup): their encoder rows are kept for it
    # (Engine.kept_rows) instead of encoded again
    keep_rows: bool = False

    @classmethod
    def align(
        cls,
        request_id: str,
        pairs: Sequence[PreparedPair],
        options: AlignOptions,
        on_done: Callable[[list[Any] | None, Exception | None], None],
        deadline: float | None = None,
        model: ModelVersion | None = None,
    ) -> Job:
        """An Align request's job: its pairs decode in the forced batches, one row each."""
        sources = [p.source for p in pairs]
        single_row = SearchOptions(beam_size=1, n_best=1)
        return cls(
            request_id, sources, single_row, "none", on_done, deadline, model,
            pairs=pairs, align_options=options,
        )  # fmt: skip

    @property
    def forced(self) -> bool:
        return self.align_options is not None

    def complete(self, error: Exception | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.trace.decoded(error)
        if error is not None:
            self.on_done(None, error)
        else:
            self.on_done([self.results[i] for i in range(len(self.sentences))], None)


@dataclass(frozen=True)
class SentenceKey:
    """Sentence `index` of a job: the key of a queued or decoding sentence."""

    job: Job
    index: int


Queued = Waiting[SentenceKey, Job]  # a queued sentence and the job it belongs to


class Load(NamedTuple):
    waiting: int  # sentences queued (submitted, not yet decoding)
    decoding: int  # sentences in the running batches


class Worker:
    def __init__(
        self,
        engine: Engine,
        config: BatchingConfig,
        metrics: Metrics,
        clock: Clock = time.monotonic,
    ) -> None:
        self.engine = engine
        self.default = single(engine)  # the model of jobs that name none
        self.config = config
        self.metrics = metrics
        metrics.watch_transfers(engine.model.transfers)
        self.clock = clock
        self.cond = threading.Condition()
        self.inbox: list[Job] = []  # submitted, not yet seen by the loop (guarded by cond)
        self.cancelled: set[Job] = set()  # guarded by cond
        self.queued_sentences = 0  # waiting + inbox, for the bound (guarded by cond)
        self.accepting = True
        self.stopping = False
        self.waiting: list[Queued] = []  # loop thread only
        # (model, beam, forced) → batch: beam searches, and Align's teacher-forced batches
        self.batches: dict[BatchKey, RunningBatch[SentenceKey] | ForcedBatch[SentenceKey]] = {}
        self.last_stepped: BatchKey | None = None
        # liveness, read by an engine process's heartbeat: the clock when the loop last began an
        # iteration, and whether it is waiting for work now (a wait is not a hang)
        self.beat = clock()
        self.idle = False
        self.last_admitted: ModelVersion | None = None
        self.queued_per_model: dict[ModelVersion, int] = {}  # waiting sentences (loop thread)
        self.thread = threading.Thread(target=self.run, name="decode-loop", daemon=True)
        self.ahead = (
            EncodeAhead[Prepared, list[EncodedSentence]](
                self.encode_now,  # type: ignore[arg-type]  # its models are ModelVersions
                config.max_batch_sentences,
                config.max_batch_sentences,
            )
            if config.encode_ahead
            else None
        )

    # --- called from other threads --------------------------------------------------------------

    def start(self) -> None:
        if self.ahead is not None:
            self.ahead.start()
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or raise QueueFull / ShuttingDown at once."""
        with self.cond:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down: retry on another replica")
            if self.queued_sentences + len(job.sentences) > self.config.max_queue_sentences:
                raise QueueFull(
                    f"the queue is full ({self.queued_sentences} sentences waiting, limit "
                    f"{self.config.max_queue_sentences}): retry with backoff"
                )
            self.queued_sentences += len(job.sentences)
            self.inbox.append(job)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        """The client went away or its deadline passed: free the job's places."""
        with self.cond:
            self.cancelled.add(job)
            self.cond.notify()

    def close_intake(self) -> None:
        """Refuse new jobs (ShuttingDown) from now on; accepted ones go on decoding."""
        with self.cond:
            self.accepting = False

    def stop(self, drain_timeout: float | None = None) -> None:
        """Refuse new jobs; finish the accepted ones (up to drain_timeout), then end the loop."""
        with self.cond:
            self.accepting = False
            self.stopping = True
            self.cond.notify()
        self.thread.join(drain_timeout)

    @property
    def load(self) -> Load:
        return Load(self.queued_sentences, sum(len(b) for b in self.batches.values()))

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self.beat = self.clock()
            with self.cond:
                jobs, self.inbox = self.inbox, []
                cancelled, self.cancelled = self.cancelled, set()
                if self.stopping and not jobs and not self.waiting and not self.batches:
                    break
            self.enqueue(jobs)
            self.drop_cancelled(cancelled)
            decision = decide(
                self.config,
                self.clock(),
                self.waiting,
                {key: len(batch) for key, batch in self.batches.items()},
                self.last_stepped,
                None if self.ahead is None else self.ahead.ready_keys(),
                self.last_admitted,
            )
            self.apply(decision)
            if decision.idle:
                self.sleep_until(decision.wake_at)
        if self.ahead is not None:
            self.ahead.stop()

    def enqueue(self, jobs: list[Job]) -> None:
        now = self.clock()
        for job in jobs:
            model = self.model_of(job)
            keys = [SentenceKey(job, i) for i in range(len(job.sentences))]
            attention = job.align_options.attention if job.align_options else None
            for key in keys:
                self.waiting.append(
                    Waiting(
                        key,
                        job,
                        job.options.beam_size,
                        now,
                        job.deadline,
                        model,
                        job.forced,
                        attention,
                    )
                )
            if self.ahead is not None:
                self.ahead.submit(list(zip(keys, job.sentences, strict=True)), model)
            self.count_queued(model, len(keys))
        self.metrics.set_queue_depth(len(self.waiting))

    def model_of(self, job: Job) -> ModelVersion:
        return job.model or self.default

    def count_queued(self, model: ModelVersion, change: int) -> None:
        """Keep the per-model queue gauge; a model's series goes when its queue empties."""
        n = self.queued_per_model.get(model, 0) + change
        if n:
            self.queued_per_model[model] = n
        else:
            self.queued_per_model.pop(model, None)
        self.metrics.set_model_queue_depth(model.name, model.version, n)

    def sleep_until(self, wake_at: float | None) -> None:
        with self.cond:
            if (
                self.inbox
                or self.cancelled
                or (self.stopping and not self.waiting and not self.batches)
            ):
                return
            timeout = None if wake_at is None else max(0.0, wake_at - self.clock())
            self.idle = True
            try:
                self.cond.wait(timeout)
            finally:
                self.idle = False

    def busy_for(self) -> float:
        """Seconds the loop has been in one iteration (0 while it waits for work): a decode loop
        stuck in a model call shows here while the process lives on."""
        return 0.0 if self.idle else max(0.0, self.clock() - self.beat)

    def apply(self, decision: Decision) -> None:
        if decision.expire:
            self.fail_waiting(
                set(decision.expire),
                DeadlineExceeded("the deadline passed while the request was queued"),
            )
        if decision.admit and decision.admit_batch is not None:
            self.admit(decision.admit, decision.admit_batch)
        # admit() may have failed the batch
        if decision.step_batch is not None and decision.step_batch in self.batches:
            self.step(decision.step_batch)

    def take_waiting(self, keys: set[SentenceKey]) -> list[Queued]:
        """Remove these sentences from the queue; returns their entries (key, arrival time, ...)."""
        taken = [w for w in self.waiting if w.key in keys]
        self.waiting = [w for w in self.waiting if w.key not in keys]
        for w in taken:
            self.count_queued(self.model_of(w.request), -1)
        with self.cond:
            self.queued_sentences -= len(taken)
        self.metrics.set_queue_depth(len(self.waiting))
        return taken

    def admit(self, keys: Sequence[SentenceKey], key: BatchKey) -> None:
        taken = self.take_waiting(set(keys))
        now = self.clock()
        for w in taken:
            self.metrics.observe_queue_wait(now - w.arrived)
        model: ModelVersion = key.model  # type: ignore[assignment]  # the worker's batch keys
        self.last_admitted = model
        try:
            batch = self.batches.get(key) or new_batch(model.engine, key)
        except ValueError as err:  # a decoder graph that cannot give Align's chosen attention
            log.warning("no batch for %s: %s", key, err)
            self.fail_jobs(jobs_of(taken), InvalidInput(f"model {model}: {err}"))
            return
        self.batches[key] = batch
        keys = [w.key for w in taken]
        encoded = {} if self.ahead is None else self.ahead.take(keys)
        for w in taken:
            w.request.trace.admitted(now - w.arrived, len(taken), w.key in encoded)
        missing = [k for k in keys if k not in encoded]
        try:
            if missing:  # nothing was running, or encoding ahead is off: encode here
                start_ns = time.time_ns()
                fresh = self.encode_now(model, [k.job.sentences[k.index] for k in missing])
                for job in {k.job for k in missing}:
                    job.trace.encoded(start_ns, time.time_ns(), len(missing))
                encoded.update(zip(missing, fresh, strict=True))
            rows = [encoded[k] for k in keys]
            for k, parts in zip(keys, rows, strict=True):
                if k.job.keep_rows:
                    model.engine.kept_rows.keep(k.job.sentences[k.index], parts[0])
            if isinstance(batch, ForcedBatch):
                batch.add([forced_request(k) for k in keys], rows)
            else:
                batch.add([sentence_request(k) for k in keys], rows)
        except Exception:  # the model failed: these jobs and the batch's others get INTERNAL
            log.exception("encoder failed; failing the batch of %s beam %d", model, key.beam)
            self.fail_batch(key, jobs_of(taken))
            return
        self.fail_alone(batch)
        if not len(batch):
            del self.batches[key]
        self.set_running()

    def encode_now(
        self, model: ModelVersion, sentences: list[Prepared]
    ) -> list[list[EncodedSentence]]:
        """One encoder call with `model` (from this loop or the encode-ahead thread), timed for the
        metrics: each sentence's parts (a segmented one's segments)."""
        started = time.perf_counter()
        encoded = model.engine.encode(sentences)
        self.metrics.observe_encoder(time.perf_counter() - started)
        return encoded

    def step(self, key: BatchKey) -> None:
        batch = self.batches[key]
        model: ModelVersion = key.model  # type: ignore[assignment]
        self.last_stepped = key
        sentences, hypotheses = len(batch), batch.num_hypotheses
        traced = {r.key.job.trace for r in batch.requests.values() if r.key.job.trace.recording}
        started = time.perf_counter()
        try:
            finished = finished_results(batch)
        except Exception:
            log.exception("decoder step failed; failing the batch of %s beam %d", model, key.beam)
            self.fail_batch(key, set())
            return
        seconds = time.perf_counter() - started
        self.metrics.observe_step(sentences, hypotheses, seconds)
        for trace in traced:
            trace.step(sentences, hypotheses, seconds)
        self.metrics.observe_model_step(model.name, model.version, hypotheses)
        for sentence, translation in finished:
            if isinstance(translation, Exception):
                self.fail_jobs({sentence.job}, translation)
            else:
                self.deliver(sentence, translation)
        self.fail_alone(batch)
        if not len(batch):
            del self.batches[key]
        self.set_running()

    def set_running(self) -> None:
        """The running gauges: in total and per model version (series of idle versions removed)."""
        self.metrics.set_running(self.load.decoding)
        per_model: dict[ModelVersion, int] = {}
        for key, batch in self.batches.items():
            model: ModelVersion = key.model  # type: ignore[assignment]
            per_model[model] = per_model.get(model, 0) + len(batch)
        self.metrics.set_model_running({(m.name, m.version): n for m, n in per_model.items()})

    def deliver(self, key: SentenceKey, result: Result | RawResult) -> None:
        job = key.job
        if isinstance(result, Translation):  # an Align pair's tokens were given, not generated
            best = result.hypotheses[0] if result.hypotheses else None
            self.metrics.add_generated(len(best.token_ids) if best else 0, 1)
        elif isinstance(result, list):  # RawParts: each part's best
            self.metrics.add_generated(sum(len(p[0].tokens) for p in result if p), 1)
        job.results[key.index] = result
        if len(job.results) == len(job.sentences):
            job.complete()

    def fail_alone(self, batch: RunningBatch[SentenceKey] | ForcedBatch[SentenceKey]) -> None:
        """The jobs of the sentences that failed on their own (their controls): the batch's others
        decode on."""
        for request, error in batch.take_failed():
            log.error("a sentence failed alone: %s", error)
            self.fail_jobs({request.key.job}, error)

    def fail_batch(self, key: BatchKey, extra_jobs: set[Job]) -> None:
        batch = self.batches.pop(key, None)
        jobs = set(extra_jobs)
        if batch is not None:
            jobs |= {r.key.job for r in batch.requests.values()}
        self.fail_jobs(
            jobs, DecodeFailed("decoding failed inside the model runtime; the error was logged")
        )

    def fail_waiting(self, keys: set[SentenceKey], error: Exception) -> None:
        if self.ahead is not None:
            self.ahead.discard(keys)
        self.fail_jobs(jobs_of(self.take_waiting(keys)), error)

    def fail_jobs(self, jobs: set[Job], error: Exception) -> None:
        """Answer these jobs with `error` and drop the rest of their sentences, wherever they are."""
        for job in jobs:
            job.complete(error)
            self.drop_cancelled({job}, notify=False)

    def drop_cancelled(self, jobs: set[Job], notify: bool = True) -> None:
        """Remove every sentence of these jobs, waiting or decoding."""
        if not jobs:
            return
        waiting_keys = {w.key for w in self.waiting if w.request in jobs}
        if waiting_keys:
            self.take_waiting(waiting_keys)
            if self.ahead is not None:
                self.ahead.discard(waiting_keys)
        for key, batch in list(self.batches.items()):
            batch.remove([r.key for r in batch.requests.values() if r.key.job in jobs])
            if not len(batch):
                del self.batches[key]
        if notify:
            for job in jobs:
                job.complete(Cancelled("the request was cancelled"))
        self.set_running()


def sentence_request(key: SentenceKey) -> DecodeRequest[SentenceKey]:
    """The engine's request for one queued sentence of a job."""
    job = key.job
    options = job.options.for_text(key.index)  # its own target prefix
    controls = None if job.controls is None else job.controls[key.index]
    return DecodeRequest(key, job.sentences[key.index], options, job.alignment, controls)


def finished_results(
    batch: RunningBatch[SentenceKey] | ForcedBatch[SentenceKey],
) -> list[tuple[SentenceKey, Result | RawResult | DecodeFailed]]:
    """One step of `batch`: its finished sentences' results, raw for a raw job's; a sentence
    whose result could not be made fails alone (its DecodeFailed in place of the result)."""
    engine = batch.engine
    if isinstance(batch, ForcedBatch):
        return [
            (
                r.key,
                (forced, logits) if r.key.job.raw else alone(aligned_of, engine, r, forced, logits),
            )
            for r, forced, logits in batch.step_raw()
        ]
    return [
        (r.key, parts if r.key.job.raw else alone(engine.translation_of, r, parts))
        for r, parts in batch.step_raw()
    ]


def alone(make: Callable[..., Result], *args: Any) -> Result | DecodeFailed:
    """make(*args), or the DecodeFailed that fails this one sentence (the cause logged)."""
    try:
        return make(*args)
    except Exception as err:
        log.exception("a finished sentence's answer could not be made")
        return DecodeFailed(f"this text's answer could not be made ({type(err).__name__}); logged")


def forced_request(key: SentenceKey) -> ForcedRequest[SentenceKey]:
    """The engine's request for one queued pair of an Align job."""
    job = key.job
    assert job.align_options is not None
    return ForcedRequest(key, job.pairs[key.index], job.align_options)


def new_batch(
    engine: Engine, key: BatchKey
) -> RunningBatch[SentenceKey] | ForcedBatch[SentenceKey]:
    """A running batch for `key`: a beam search of its beam size, or Align's forced pass."""
    if key.forced:
        return ForcedBatch(engine, key.attention)  # type: ignore[arg-type]
    return engine.new_batch(key.beam)


def jobs_of(entries: Sequence[Queued]) -> set[Job]:
    return {w.request for w in entries}
