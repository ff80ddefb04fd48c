"""The decode loop on the tiny bundle: results equal `Engine.translate`; queue, cancel, deadline, failure, stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from service.decode.engine.engine import Engine, RunningBatch
from service.decode.runtime.runtime import OnnxDecoder, OnnxModel
from service.decode.search.beam import SearchOptions
from service.decode.search.device_search import DeviceSearch
from service.decode.shared import controls as ctl
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.controls import Controls
from service.decode.shared.errors import (
    Cancelled,
    DeadlineExceeded,
    DecodeFailed,
    QueueFull,
    ShuttingDown,
)
from service.decode.text.translation import AlignmentMode, Translation
from service.serve.jobs import Job, SentenceKey
from service.serve.metrics import Metrics
from service.serve.repository import ModelVersion
from service.serve.scheduler import BatchingConfig
from service.serve.worker import Worker, engine_of
from tests.conftest import TinyModel, wait_for

SCORE_TOL = 1e-4
WAIT_S = 20.0  # generous: a loaded CI machine is slow, a passing test never waits this long


@pytest.fixture(scope="module")
def engine(tiny: TinyModel) -> Engine:
    return Engine.load(
        tiny.bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )


def opts(
    beam: int, n_best: int = 1, max_length_b: int = 5, max_length_a: float = 1.0
) -> SearchOptions:
    return SearchOptions(
        beam_size=beam,
        n_best=n_best,
        max_length_a=max_length_a,
        max_length_b=max_length_b,
        max_length=256,
    )


LONG = SearchOptions(
    beam_size=2, max_length_a=0.0, max_length_b=200, max_length=200
)  # up to 200 steps


@dataclass
class Outcome:
    """What a job's on_done callback received."""

    done: threading.Event = field(default_factory=threading.Event)
    results: list[Translation] | None = None
    error: Exception | None = None
    calls: int = 0

    def __call__(self, results: list[Translation] | None, error: Exception | None) -> None:
        self.results, self.error, self.calls = results, error, self.calls + 1
        self.done.set()

    def wait(self) -> Outcome:
        assert self.done.wait(WAIT_S), "the job's callback was not called in time"
        return self


def make_job(
    engine: Engine,
    texts: Sequence[str],
    options: SearchOptions,
    alignment: AlignmentMode = "subword",
    deadline: float | None = None,
) -> tuple[Job, Outcome]:
    outcome = Outcome()
    job = Job("r", [engine.prepare(t) for t in texts], options, alignment, outcome, deadline)
    return job, outcome


def assert_same(got: list[Translation] | None, want: list[Translation]) -> None:
    assert got is not None
    assert len(got) == len(want)
    for g, r in zip(got, want, strict=True):
        assert g.source == r.source and g.source_tokens == r.source_tokens
        assert [h.token_ids for h in g.hypotheses] == [h.token_ids for h in r.hypotheses]
        assert [h.text for h in g.hypotheses] == [h.text for h in r.hypotheses]
        assert [h.score for h in g.hypotheses] == pytest.approx(
            [h.score for h in r.hypotheses], abs=SCORE_TOL
        )
        for gh, rh in zip(g.hypotheses, r.hypotheses, strict=True):
            assert (gh.alignment is None) == (rh.alignment is None)
            if gh.alignment is not None and rh.alignment is not None:
                np.testing.assert_allclose(gh.alignment.matrix, rh.alignment.matrix, atol=SCORE_TOL)


class StepSpy:
    """Wraps the decoder step (OnnxDecoder.step, and DeviceSearch.step, whose graph holds the
    decoder's: search "device", the default): records each call's hypothesis rows, can raise or
    pause on a chosen call."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        # (rows, k) → True: pause before this call / raise instead of it; each fires once
        self.pause_when: Callable[[int, int], bool] | None = None
        self.fail_when: Callable[[int, int], bool] | None = None
        self.paused = threading.Event()
        self.resume = threading.Event()

    def wrap(self, original: Callable[..., object]) -> Callable[..., object]:
        def step(decoder: OnnxDecoder, tokens: np.ndarray, reorder: np.ndarray, k: int) -> object:
            rows = len(tokens)
            if self.fail_when is not None and self.fail_when(rows, k):
                self.fail_when = None
                raise RuntimeError("injected decoder failure")
            if self.pause_when is not None and self.pause_when(rows, k):
                self.pause_when = None
                self.paused.set()
                assert self.resume.wait(WAIT_S)
            self.rows.append(rows)
            return original(decoder, tokens, reorder, k)

        return step

    def wrap_search(self, original: Callable[..., object]) -> Callable[..., object]:
        """DeviceSearch.step as a decoder call of its B·K rows and k = K + 1."""
        step = self.wrap(lambda search, tokens, reorder, k: original(search))

        def search_step(search: DeviceSearch) -> object:
            rows = len(search) * search.beam_size
            return step(search, np.zeros(rows, np.int64), np.zeros(rows), search.beam_size + 1)

        return search_step


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> StepSpy:
    s = StepSpy()
    monkeypatch.setattr(OnnxDecoder, "step", s.wrap(OnnxDecoder.step))
    monkeypatch.setattr(DeviceSearch, "step", s.wrap_search(DeviceSearch.step))
    return s


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_worker(engine: Engine, spy: StepSpy) -> Iterator[Callable[..., Worker]]:
    """Build (not start) workers on the tiny engine with a fresh Metrics; all are stopped afterwards."""
    workers: list[Worker] = []

    def build(
        config: BatchingConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Worker:
        worker = Worker(engine, config or BatchingConfig(), Metrics(), clock)
        workers.append(worker)
        return worker

    yield build
    spy.resume.set()  # never leave the loop paused
    for worker in workers:
        if worker.thread.is_alive():
            worker.stop(WAIT_S)
            assert not worker.thread.is_alive()


def gauge(worker: Worker, name: str) -> float:
    value = worker.metrics.registry.get_sample_value(name)
    assert value is not None
    return value


# --- results --------------------------------------------------------------------------------


@pytest.mark.parametrize("encode_ahead", [True, False])
@pytest.mark.parametrize("policy", ["iteration", "request", "none"])
def test_jobs_complete_with_the_same_translations_as_engine_translate(
    engine: Engine,
    tiny: TinyModel,
    make_worker: Callable[..., Worker],
    policy: str,
    encode_ahead: bool,
) -> None:
    worker = make_worker(
        BatchingConfig(policy=policy, max_queue_delay_s=0.004, encode_ahead=encode_ahead)  # type: ignore[arg-type]
    )
    worker.start()
    cases: list[tuple[list[str], SearchOptions, AlignmentMode]] = [
        (tiny.sources[0:3], opts(1), "none"),
        (tiny.sources[3:5], opts(3, n_best=2), "subword"),
        (tiny.sources[5:9], opts(3), "word"),
        (tiny.sources[9:10], opts(5, n_best=5), "subword"),
    ]
    submitted = []
    for texts, options, alignment in cases:
        job, outcome = make_job(engine, texts, options, alignment)
        worker.submit(job)
        submitted.append(outcome)
    for (texts, options, alignment), outcome in zip(cases, submitted, strict=True):
        outcome.wait()
        assert outcome.error is None and outcome.calls == 1
        assert_same(outcome.results, engine.translate(texts, options, alignment))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert (worker.ahead is not None) == encode_ahead
    if worker.ahead is not None:  # every encoding was taken by an admission: none left behind
        assert len(worker.ahead) == 0
    sentences = sum(len(texts) for texts, _, _ in cases)
    assert gauge(worker, "s2s_queue_wait_seconds_count") == sentences
    assert gauge(worker, "s2s_translated_sentences_total") == sentences
    tokens = sum(len(t.hypotheses[0].token_ids) for o in submitted for t in o.results or [])
    assert gauge(worker, "s2s_generated_tokens_total") == tokens
    assert (
        gauge(worker, "s2s_queue_depth_sentences") == 0
        and gauge(worker, "s2s_running_sentences") == 0
    )


def test_sentences_of_different_jobs_share_a_batch(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    worker = make_worker()
    first, a = make_job(engine, tiny.sources[:2], opts(2))
    second, b = make_job(engine, tiny.sources[2:5], opts(2))
    worker.submit(first)
    worker.submit(second)
    worker.start()  # both are waiting at the first decision: one batch of 5 sentences × 2 slots
    a.wait()
    b.wait()
    assert spy.rows[0] == 10
    assert_same(a.results, engine.translate(tiny.sources[:2], opts(2)))
    assert_same(b.results, engine.translate(tiny.sources[2:5], opts(2)))


# --- queue bound ----------------------------------------------------------------------------


def test_a_full_queue_refuses_at_once_and_keeps_what_it_accepted(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker]
) -> None:
    # not started: nothing leaves the queue
    worker = make_worker(BatchingConfig(max_queue_sentences=3))
    kept, kept_outcome = make_job(engine, tiny.sources[:2], opts(1))
    worker.submit(kept)
    refused, refused_outcome = make_job(engine, tiny.sources[2:4], opts(1))
    started = time.perf_counter()
    with pytest.raises(QueueFull, match=r"the queue is full \(2 sentences waiting, limit 3\)"):
        worker.submit(refused)
    assert time.perf_counter() - started < 0.5
    last, last_outcome = make_job(engine, tiny.sources[4:5], opts(1))
    worker.submit(last)  # exactly fills the queue
    worker.start()
    assert_same(kept_outcome.wait().results, engine.translate(tiny.sources[:2], opts(1)))
    assert_same(last_outcome.wait().results, engine.translate(tiny.sources[4:5], opts(1)))
    assert not refused_outcome.done.is_set()
    wait_for(lambda: worker.queued_sentences == 0, "the queue to drain")
    worker.submit(refused)  # room again
    assert_same(refused_outcome.wait().results, engine.translate(tiny.sources[2:4], opts(1)))


# --- cancel, deadline -----------------------------------------------------------------------


def test_cancelling_a_running_job_shrinks_the_batch_and_the_others_complete(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    worker = make_worker()
    long_texts, short_texts = tiny.sources[10:13], tiny.sources[13:15]
    short_options = SearchOptions(beam_size=2, max_length_a=1.0, max_length_b=20, max_length=256)
    cancelled, cancelled_outcome = make_job(engine, long_texts, LONG)
    kept, kept_outcome = make_job(engine, short_texts, short_options)
    worker.submit(cancelled)
    worker.submit(kept)
    spy.pause_when = lambda rows, k: rows == 10  # 5 sentences × beam 2 decoding together
    worker.start()
    assert spy.paused.wait(WAIT_S)
    assert worker.load == (0, 5)
    steps_before = len(spy.rows)
    worker.cancel(cancelled)
    spy.resume.set()
    assert isinstance(cancelled_outcome.wait().error, Cancelled)
    kept_outcome.wait()
    after = spy.rows[steps_before + 1 :]  # the paused step itself still had everyone
    assert after and max(after) <= 4  # only the 2 kept sentences × 2 slots
    assert kept_outcome.error is None
    assert_same(kept_outcome.results, engine.translate(short_texts, short_options))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert gauge(worker, "s2s_running_sentences") == 0
    assert cancelled_outcome.calls == 1


def test_cancelling_a_waiting_job_frees_its_queue_places(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    worker = make_worker(BatchingConfig(max_batch_sentences=1, max_queue_sentences=4))
    running, running_outcome = make_job(engine, tiny.sources[:1], opts(2))
    queued, queued_outcome = make_job(engine, tiny.sources[1:4], opts(2))
    worker.submit(running)
    worker.submit(queued)
    spy.pause_when = lambda rows, k: True
    worker.start()
    assert spy.paused.wait(WAIT_S)
    worker.cancel(queued)
    spy.resume.set()
    assert isinstance(queued_outcome.wait().error, Cancelled)
    assert running_outcome.wait().error is None
    wait_for(lambda: worker.queued_sentences == 0, "the queue to be empty")
    assert gauge(worker, "s2s_queue_depth_sentences") == 0
    again, again_outcome = make_job(engine, tiny.sources[1:5], opts(2))
    worker.submit(again)  # the whole queue: QueueFull if the cancelled sentences still counted
    assert_same(again_outcome.wait().results, engine.translate(tiny.sources[1:5], opts(2)))


def test_a_deadline_that_passes_while_queued_fails_the_job(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    clock = FakeClock(100.0)
    worker = make_worker(BatchingConfig(max_batch_sentences=1), clock=clock)
    first, first_outcome = make_job(engine, tiny.sources[:1], opts(2), deadline=200.0)
    late, late_outcome = make_job(engine, tiny.sources[1:3], opts(2), deadline=105.0)
    worker.submit(first)
    worker.submit(late)
    spy.pause_when = lambda rows, k: True  # the first step: `late` waits behind `first`
    worker.start()
    assert spy.paused.wait(WAIT_S)
    clock.now = 105.0
    spy.resume.set()
    error = late_outcome.wait().error
    assert isinstance(error, DeadlineExceeded) and "queued" in str(error)
    assert first_outcome.wait().error is None
    assert_same(first_outcome.results, engine.translate(tiny.sources[:1], opts(2)))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert gauge(worker, "s2s_queue_depth_sentences") == 0
    assert not worker.waiting  # nothing of the expired job is kept
    assert late_outcome.calls == 1


# --- failures -------------------------------------------------------------------------------


def test_a_failing_decoder_step_fails_its_batch_and_the_worker_keeps_serving(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    worker = make_worker()
    spy.fail_when = lambda rows, k: k == 4  # the beam-3 batch (k = beam + 1), once
    failing, failing_outcome = make_job(engine, tiny.sources[:2], opts(3))
    other, other_outcome = make_job(engine, tiny.sources[2:4], opts(1))  # its own batch (beam 1)
    worker.submit(failing)
    worker.submit(other)
    worker.start()
    error = failing_outcome.wait().error
    assert isinstance(error, DecodeFailed) and "model runtime" in str(error)
    assert failing_outcome.results is None
    assert_same(other_outcome.wait().results, engine.translate(tiny.sources[2:4], opts(1)))
    nxt, nxt_outcome = make_job(engine, tiny.sources[:2], opts(3))
    worker.submit(nxt)
    assert_same(nxt_outcome.wait().results, engine.translate(tiny.sources[:2], opts(3)))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert gauge(worker, "s2s_running_sentences") == 0
    assert failing_outcome.calls == 1


def test_a_sentence_whose_controls_cannot_decode_fails_alone(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker]
) -> None:
    """Controls with a token outside the target vocabulary (a front that tokenized for another
    model) fail their job; the job beside it in the same batch gets its answers."""
    worker = make_worker()
    V = engine.cfg.tgt_vocab_size
    bad, bad_outcome = make_job(engine, tiny.sources[:1], opts(2))
    bad.controls = [(Controls(prefix=(V + 3,)),)]
    good, good_outcome = make_job(engine, tiny.sources[1:3], opts(2))
    worker.submit(bad)
    worker.submit(good)
    worker.start()
    error = bad_outcome.wait().error
    assert isinstance(error, DecodeFailed) and "outside the target vocabulary" in str(error)
    assert_same(good_outcome.wait().results, engine.translate(tiny.sources[1:3], opts(2)))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")


def test_controls_that_raise_mid_decode_fail_their_sentence_not_its_batch(
    engine: Engine,
    tiny: TinyModel,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A control that raises at some step (here a repetition penalty, made to fail at step 2)
    fails its own job; the batch's other jobs, with and without controls, get their answers."""
    original = ctl.candidates

    def candidates(rows: ctl.SlotRows, at: ctl.SlotControls, k: int) -> object:
        if at.controls.repetition_penalty == 1.5 and at.step == 2:
            raise RuntimeError("injected control failure")
        return original(rows, at, k)

    monkeypatch.setattr(ctl, "candidates", candidates)
    worker = make_worker()
    failing_options = replace(opts(2, max_length_b=8), repetition_penalty=1.5)
    other_options = replace(opts(2, max_length_b=8), no_repeat_ngram_size=2)
    failing, failing_outcome = make_job(engine, tiny.sources[:2], failing_options)
    plain, plain_outcome = make_job(engine, tiny.sources[2:4], opts(2, max_length_b=8))
    other, other_outcome = make_job(engine, tiny.sources[4:6], other_options)
    for job in (failing, plain, other):
        worker.submit(job)
    worker.start()
    error = failing_outcome.wait().error
    assert isinstance(error, DecodeFailed) and "injected control failure" in str(error)
    assert_same(
        plain_outcome.wait().results, engine.translate(tiny.sources[2:4], opts(2, max_length_b=8))
    )
    assert_same(other_outcome.wait().results, engine.translate(tiny.sources[4:6], other_options))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert failing_outcome.calls == 1


def test_a_failing_encoder_fails_the_joining_jobs_and_the_worker_keeps_serving(
    engine: Engine,
    tiny: TinyModel,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = OnnxModel.encode
    calls = []

    def encode(model: OnnxModel, src: np.ndarray, lengths: np.ndarray) -> object:
        calls.append(len(lengths))
        if len(calls) == 1:
            raise RuntimeError("injected encoder failure")
        return original(model, src, lengths)

    monkeypatch.setattr(OnnxModel, "encode", encode)
    worker = make_worker()
    failing, failing_outcome = make_job(engine, tiny.sources[:2], opts(2))
    worker.submit(failing)
    worker.start()
    assert isinstance(failing_outcome.wait().error, DecodeFailed)
    nxt, nxt_outcome = make_job(engine, tiny.sources[2:4], opts(2))
    worker.submit(nxt)
    assert_same(nxt_outcome.wait().results, engine.translate(tiny.sources[2:4], opts(2)))
    wait_for(lambda: worker.load == (0, 0), "the worker to be empty")
    assert worker.queued_sentences == 0


# --- stop -----------------------------------------------------------------------------------


def test_stop_refuses_new_jobs_and_finishes_the_accepted_ones(
    engine: Engine, tiny: TinyModel, make_worker: Callable[..., Worker], spy: StepSpy
) -> None:
    worker = make_worker(BatchingConfig(max_batch_sentences=2))
    # one job decodes, two wait
    accepted = [make_job(engine, tiny.sources[i : i + 2], opts(2)) for i in (0, 2, 4)]
    for job, _ in accepted:
        worker.submit(job)
    spy.pause_when = lambda rows, k: True
    worker.start()
    assert spy.paused.wait(WAIT_S)
    stopper = threading.Thread(target=worker.stop, args=(WAIT_S,))
    stopper.start()
    wait_for(lambda: not worker.accepting, "stop() to close the queue")
    late, late_outcome = make_job(engine, tiny.sources[6:7], opts(2))
    with pytest.raises(ShuttingDown, match="shutting down"):
        worker.submit(late)
    spy.resume.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive() and not worker.thread.is_alive()
    for i, (_, outcome) in zip((0, 2, 4), accepted, strict=True):
        assert outcome.done.is_set() and outcome.error is None
        assert_same(outcome.results, engine.translate(tiny.sources[i : i + 2], opts(2)))
    assert not late_outcome.done.is_set()


# --- several models -------------------------------------------------------------------------


@pytest.mark.parametrize("encode_ahead", [True, False])
def test_each_decoder_call_and_encoder_call_holds_one_model_versions_sentences(
    engine: Engine,
    tiny: TinyModel,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
    encode_ahead: bool,
) -> None:
    """Two versions (the tiny bundle loaded twice: separate sessions) decode side by side: every
    step's batch and every encoder call hold one version's sentences, and each job's translations
    equal its own engine's."""
    other = ModelVersion("other", "1", Engine.load(tiny.bundle, engine.model.config))
    mine = ModelVersion("tiny", "1", engine)
    steps: list[tuple[object, set[object]]] = []  # (the batch's engine, its sentences' engines)
    encodes: list[tuple[object, int]] = []  # (the OnnxModel called, sentences)
    original_step, original_encode = RunningBatch.step_raw, OnnxModel.encode_sentences

    def step(batch: RunningBatch[SentenceKey]) -> object:
        keys = [r.key for r in batch.requests.values() if isinstance(r.key, SentenceKey)]
        if keys:  # the worker's batches (engine.translate's below have int keys)
            steps.append((batch.engine, {k.job.model.engine for k in keys if k.job.model}))
        return original_step(batch)

    def encode(model: OnnxModel, id_lists: list[Sequence[int]]) -> object:
        if threading.current_thread().name in ("decode-loop", "encode-ahead"):
            encodes.append((model, len(id_lists)))
        return original_encode(model, id_lists)

    monkeypatch.setattr(RunningBatch, "step_raw", step)
    monkeypatch.setattr(OnnxModel, "encode_sentences", encode)
    worker = make_worker(BatchingConfig(encode_ahead=encode_ahead))
    worker.start()
    jobs = []
    for i in range(6):
        model = (mine, other)[i % 2]
        texts = tiny.sources[i * 3 : i * 3 + 3]
        job, outcome = make_job(engine_of(model), texts, opts(2))
        job.model = model
        worker.submit(job)
        jobs.append((model, texts, outcome))
    for model, texts, outcome in jobs:
        assert outcome.wait().error is None
        assert_same(outcome.results, engine_of(model).translate(texts, opts(2), "subword"))
    assert steps and all(models == {batch_engine} for batch_engine, models in steps)
    assert {e for e, _ in steps} == {engine, other.engine}  # both were decoded
    per_model = {m: sum(n for c, n in encodes if c is m) for m in {c for c, _ in encodes}}
    # each model's 9 sentences encoded by its own session (ahead, or again at admission)
    assert set(per_model) == {engine.model, other.engine.model}
    assert all(n >= 9 for n in per_model.values())
    labels = {"model": "other", "version": "1"}
    steps_other = worker.metrics.registry.get_sample_value("s2s_model_decoder_steps_total", labels)
    assert steps_other == sum(1 for e, _ in steps if e is other.engine)
