"""service/serve/engine_link.py: a front's jobs while their engine is down and being started again,
on a fake clock, with spy peers in place of the channel (no engine process, no event loop): they
wait, bounded by their deadline, the longest wait and the queue's bound, and go to the engine once
it is back, in arrival order; a failed start ends the wait with its reason; the metrics count each
wait by how it ended."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest

from service.decode.engine.engine import Engine
from service.decode.shared.controls import Controls
from service.decode.shared.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    QueueFull,
    ShuttingDown,
)
from service.decode.shared.options import SearchOptions
from service.decode.text.preparation import Prepared
from service.serve import channel as ch
from service.serve.engine_link import EngineLink, EngineState
from service.serve.jobs import Job
from service.serve.metrics import Metrics
from service.serve.repository import ModelVersion

MODEL = ModelVersion("numbers", "1", cast(Engine, None))  # the link reads its name and version
FAILED = "engine 0 failed to start again (exit status 1): cannot start: bundle file altered"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SpyPeer:
    """An engine's end of the channel as the link uses it: the jobs sent, answered by the test.
    A live engine takes each job as it comes (TAKEN); one that died (`taking` False) takes none."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.open: dict[int, Any] = {}
        self.taken: set[int] = set()
        self.taking = True
        self.jobs: list[str] = []  # the request ids sent, in order

    def request(self, kind: int, build: Any, answer: Any, progress: Any = None) -> int:
        ident = next(self.ids)
        message = build(ident)
        assert message[0] == ch.JOB
        self.jobs.append(message[7])
        self.open[ident] = answer
        if self.taking:
            self.taken.add(ident)
        return ident

    def answer_all(self) -> None:
        open_, self.open = self.open, {}
        for answer in open_.values():
            answer(["done"], None)

    def fail_all(self, error: Exception) -> None:
        """As ch.Peer's: `error` for what the engine took, NotTaken for the rest."""
        open_, self.open = self.open, {}
        taken, self.taken = self.taken, set()
        for ident, answer in open_.items():
            answer(None, error if ident in taken else ch.NotTaken(str(error)))

    def forget(self, ident: int) -> None:
        self.open.pop(ident, None)

    def send(self, message: Any) -> None:
        pass

    def hello(self, engine: str = "", generation: int = 0) -> None:
        pass


class Front:
    """An EngineLink on a fake clock over spy peers, each engine up and serving MODEL."""

    def __init__(self, engines: int = 1, wait_s: float = 60.0, queue_sentences: int = 8) -> None:
        async def follow(index: int, versions: Any) -> None:
            pass

        self.clock = Clock()
        self.metrics = Metrics()
        self.failures: dict[int, str] = {}  # the supervisor's word, by engine
        self.link = EngineLink(
            [f"inproc://engine-link-test-{i}" for i in range(engines)],
            "front",
            follow,
            clock=self.clock,
            wait_s=wait_s,
            queue_sentences=queue_sentences,
            start_failure=lambda i: self.failures.get(i, ""),
            metrics=self.metrics,
        )
        self.peers = [SpyPeer() for _ in range(engines)]
        for engine, peer in zip(self.link.engines, self.peers, strict=True):
            engine.peer.socket.close(0)
            engine.peer = cast(ch.Peer, peer)
            self.up(engine.index)
        self.answers: dict[str, tuple[Any, Exception | None]] = {}

    def engine(self, index: int) -> EngineState:
        return self.link.engines[index]

    def up(self, index: int, life: str = "first") -> None:
        """Engine `index` (a process's `life`) published MODEL and beats: it is up."""
        engine = self.engine(index)
        engine.name, engine.generation = life, 1
        engine.versions = ((MODEL.name, MODEL.version, "", ("CPUExecutionProvider",), 0),)
        engine.served = {(MODEL.name, MODEL.version)}
        engine.last_beat = self.clock()
        self.link.check(engine)
        assert engine.up

    def killed(self, index: int) -> None:
        """Engine `index`'s process ended: its connection closed (the supervisor restarts it)."""
        self.link.gone_of(index)()

    def tick(self, seconds: float) -> None:
        """Time passes; the link's watch looks (every 0.1 s in a front)."""
        self.clock.now += seconds
        self.link.hear_failures()
        self.link.settle()

    def job(self, request_id: str, sentences: int = 1, timeout: float | None = None) -> Job:
        def done(results: Any, error: Exception | None) -> None:
            self.answers[request_id] = (results, error)

        deadline = None if timeout is None else self.clock() + timeout
        return Job(
            request_id, [Prepared("one", [5, 6], [])] * sentences, SearchOptions(), "none", done,
            deadline, MODEL, controls=[(Controls(),)] * sentences,
        )  # fmt: skip

    def submit(self, request_id: str, sentences: int = 1, timeout: float | None = None) -> Job:
        job = self.job(request_id, sentences, timeout)
        self.link.submit(job)
        return job

    def error(self, request_id: str) -> Exception | None:
        return self.answers[request_id][1]

    def waits(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "s2s_restart_waits_total", {"outcome": outcome}
        )
        assert value is not None
        return value

    def waited_s(self) -> tuple[float, float]:
        """(count, sum) of s2s_restart_wait_seconds."""
        count = self.metrics.registry.get_sample_value("s2s_restart_wait_seconds_count")
        total = self.metrics.registry.get_sample_value("s2s_restart_wait_seconds_sum")
        return count or 0.0, total or 0.0


def test_jobs_wait_for_their_engine_restarted_and_go_to_it_in_arrival_order() -> None:
    front = Front()
    front.submit("held")
    front.killed(0)
    held = front.error("held")  # what the engine held fails, as before
    assert isinstance(held, EngineUnavailable) and "stopped" in str(held)
    for name in ("a", "b", "c"):
        front.clock.now += 0.5
        front.submit(name, timeout=30.0)  # not refused: waits
    front.tick(1.0)
    assert front.peers[0].jobs == ["held"] and set(front.answers) == {"held"}
    front.up(0, life="second")  # the engine back, with its versions
    assert front.peers[0].jobs == ["held", "a", "b", "c"]
    front.peers[0].answer_all()
    assert [front.answers[n] for n in "abc"] == [(["done"], None)] * 3
    assert front.waits("resumed") == 3
    assert front.waited_s() == (3, pytest.approx(2.0 + 1.5 + 1.0))
    assert not front.link.waiting and front.link.waiting_sentences == 0


def test_a_waiting_job_ends_at_its_deadline_or_after_the_longest_wait() -> None:
    front = Front(wait_s=5.0)
    front.killed(0)
    front.submit("short", timeout=1.0)
    front.submit("no deadline")
    front.tick(0.9)
    assert not front.answers
    front.tick(0.1)
    assert isinstance(front.error("short"), DeadlineExceeded)
    front.tick(3.9)
    assert "no deadline" not in front.answers
    front.tick(0.1)
    error = front.error("no deadline")
    assert isinstance(error, EngineUnavailable) and "--engine-restart-wait-s" in str(error)
    assert (front.waits("deadline_exceeded"), front.waits("engine_unavailable")) == (1, 1)
    front.up(0, life="second")
    assert front.peers[0].jobs == []  # neither was sent


def test_the_waiting_jobs_are_bounded_by_the_queue_in_sentences_and_leave_when_cancelled() -> None:
    front = Front(queue_sentences=4)
    front.killed(0)
    three = front.submit("three", sentences=3, timeout=30.0)
    with pytest.raises(QueueFull, match="3 sentences waiting"):
        front.submit("two", sentences=2)
    front.submit("one")
    assert front.waits("queue_full") == 1
    front.link.cancel(three)  # the client went away: its place is free again
    front.submit("late", sentences=3, timeout=1.0)
    front.clock.now += 0.9
    front.link.cancel(front.job("not waiting"))  # a job the link does not hold: nothing
    late = next(j for j in front.link.waiting if j.request_id == "late")
    front.link.cancel(late)  # cancelled by gRPC at its deadline: counted as the deadline's
    assert (front.waits("cancelled"), front.waits("deadline_exceeded")) == (1, 1)
    front.up(0, life="second")
    assert front.peers[0].jobs == ["one"]
    assert "three" not in front.answers and "late" not in front.answers  # their callers left


def test_an_engine_whose_start_fails_again_ends_the_wait_with_why_until_it_serves() -> None:
    front = Front()
    front.killed(0)
    front.submit("waiting", timeout=30.0)
    front.tick(1.0)
    front.failures[0] = FAILED  # the supervisor's word
    front.tick(0.1)
    error = front.error("waiting")
    assert isinstance(error, EngineUnavailable) and FAILED in str(error)
    with pytest.raises(EngineUnavailable, match="bundle file altered"):
        front.submit("new")  # refused at once while it fails
    assert front.waits("engine_unavailable") == 1
    del front.failures[0]  # its next start serves
    front.up(0, life="third")
    assert not front.engine(0).failed
    front.submit("again")
    assert front.peers[0].jobs == ["again"]


def test_with_no_restart_to_wait_for_a_job_is_refused_at_once_and_a_survivor_takes_it() -> None:
    single = Front(wait_s=0.0)  # the single-process mode: no supervisor restarts its engine
    single.killed(0)
    with pytest.raises(EngineUnavailable, match="no engine process serves"):
        single.submit("refused", timeout=30.0)
    two = Front(engines=2)
    two.killed(0)
    two.submit("survivor")  # the engine left takes it
    assert two.peers[1].jobs == ["survivor"] and two.waits("resumed") == 0
    two.killed(1)
    two.submit("both down", timeout=30.0)  # both coming back: it waits for the first
    two.up(1, life="second")
    assert two.peers[1].jobs == ["survivor", "both down"]
    assert two.waits("resumed") == 1


def test_closing_the_intake_fails_the_waiting_jobs_shutting_down() -> None:
    front = Front()
    front.killed(0)
    front.submit("waiting", timeout=30.0)
    front.link.close_intake()
    assert isinstance(front.error("waiting"), ShuttingDown)
    with pytest.raises(ShuttingDown):
        front.submit("after")
    assert front.waits("shutting_down") == 1 and not front.link.waiting


def test_a_job_sent_to_an_engine_that_died_before_taking_it_is_sent_again() -> None:
    """In the moment between an engine's death and the front's knowing, a job goes to it and is
    never taken: it does not fail with the engine, it waits for it (or goes to a survivor)."""
    front = Front()
    front.submit("held")
    front.peers[0].taking = False  # the process is gone; the front does not know yet
    front.submit("never taken", timeout=30.0)
    front.killed(0)
    assert isinstance(front.error("held"), EngineUnavailable)
    assert "never taken" not in front.answers  # waiting for the restart
    front.up(0, life="second")
    front.peers[0].taking = True
    assert front.peers[0].jobs == ["held", "never taken", "never taken"]
    front.peers[0].answer_all()
    assert front.answers["never taken"] == (["done"], None)
    two = Front(engines=2)
    two.peers[0].taking = False
    job = two.job("to the survivor")
    two.link.send(job, two.engine(0))
    two.killed(0)
    assert two.peers[1].jobs == ["to the survivor"]
