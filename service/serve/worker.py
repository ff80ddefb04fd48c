"""The decode loop: one thread that owns the running batches and applies the scheduler's decisions.

The gRPC server submits a `Job` (service/serve/jobs.py: one request's sentences, for one model
version) and gets its translations back through the job's callback, called from this thread. Submitting never waits: a
full queue is refused at once. The running batches are keyed by (model version, beam size), so one
decoder call only ever holds one model version's hypotheses; the scheduler takes turns between
models (service/serve/scheduler.py). Translate's and Align's batches are stepped alike
(service/serve/batches.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple, cast

from service.decode.engine.encode_ahead import EncodeAhead
from service.decode.engine.engine import Engine
from service.decode.runtime.encoded import EncodedSentence
from service.decode.shared.errors import (
    Cancelled,
    DeadlineExceeded,
    DecodeFailed,
    InvalidInput,
    QueueFull,
    ShuttingDown,
)
from service.decode.text.preparation import Prepared
from service.decode.text.translation import Translation
from service.serve.batches import Batch, new_batch
from service.serve.jobs import Job, RawResult, Result, SentenceKey
from service.serve.metrics import Metrics
from service.serve.repository import ModelVersion, single
from service.serve.scheduler import BatchingConfig, BatchKey, Decision, Waiting, decide

log = logging.getLogger(__name__)

Clock = Callable[[], float]


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
        self.batches: dict[BatchKey, Batch] = {}
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
                self.held(),
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
                        job.request_id,
                    )
                )
            if self.ahead is not None:
                self.ahead.submit(
                    list(zip(keys, job.sentences, strict=True)), model, job.request_id
                )
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

    def held(self) -> Counter[Hashable]:
        """The running sentences of each request (by its id: a stream's sentence jobs share it),
        for the scheduler's turns between requests."""
        return Counter(
            k.job.request_id for batch in self.batches.values() for k in batch.sentences()
        )

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
            batch = self.batches.get(key) or new_batch(engine_of(model), key)
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
                    engine_of(model).kept_rows.keep(k.job.sentences[k.index], parts[0])
            batch.add(keys, rows)
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
        encoded = engine_of(model).encode(sentences)
        self.metrics.observe_encoder(time.perf_counter() - started)
        return encoded

    def step(self, key: BatchKey) -> None:
        batch = self.batches[key]
        model: ModelVersion = key.model  # type: ignore[assignment]
        self.last_stepped = key
        sentences, hypotheses = len(batch), batch.num_hypotheses
        traced = {k.job.trace for k in batch.sentences() if k.job.trace.recording}
        started = time.perf_counter()
        try:
            finished = batch.step()
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
        self.report_progress(batch)
        self.fail_alone(batch)
        if not len(batch):
            del self.batches[key]
        self.set_running()

    def report_progress(self, batch: Batch) -> None:
        """Each streamed sentence whose settled prefix grew at this step, told to its job (a
        report that fails is logged: the batch decodes on)."""
        for key, prefix in batch.progress():
            report = key.job.on_progress
            if report is None or key.job.finished:
                continue
            try:
                report(key.index, prefix)
            except Exception:
                log.exception("a streamed sentence's progress could not be reported")

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

    def fail_alone(self, batch: Batch) -> None:
        """The jobs of the sentences that failed on their own (their controls): the batch's others
        decode on."""
        for key, error in batch.take_failed():
            log.error("a sentence failed alone: %s", error)
            self.fail_jobs({key.job}, error)

    def fail_batch(self, key: BatchKey, extra_jobs: set[Job]) -> None:
        batch = self.batches.pop(key, None)
        jobs = set(extra_jobs)
        if batch is not None:
            jobs |= {k.job for k in batch.sentences()}
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
            batch.remove([k for k in batch.sentences() if k.job in jobs])
            if not len(batch):
                del self.batches[key]
        if notify:
            for job in jobs:
                job.complete(Cancelled("the request was cancelled"))
        self.set_running()


def jobs_of(entries: Sequence[Queued]) -> set[Job]:
    return {w.request for w in entries}


def engine_of(model: ModelVersion) -> Engine:
    """A version's engine, as an engine process holds it (a front's versions hold their text side
    alone: service/serve/mirror.py)."""
    return cast(Engine, model.engine)
