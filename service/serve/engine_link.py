"""A front's side of its engine processes: the worker's interface (submit, cancel, close_intake,
clock) over the channel (service/serve/channel.py), and what the front knows of each engine.

Each engine is an `EngineState`: its channel peer, its life (`name`: its process, from its
heartbeats), the model versions it published, and whether it is up. An engine is up while its
heartbeat comes (at most `beat_timeout_s` apart), its connection stays open (a process that ends
closes it: the front knows at once, and sends it nothing more) and its decode loop has not spent
`hang_s` in one iteration; when it goes down, every request it held is answered `EngineUnavailable` (UNAVAILABLE,
with a message) at once, and `on_change` tells the front (health NOT_SERVING for its models). A
restarted engine is a new name: the front says HELLO again, follows its versions, and it is up.

A job goes to an engine that is up and serves its version, the one with the fewest of this front's
requests in flight (engines x devices). Its work is token ids and the controls the front computed
(its text side); the results come back raw and the front converts them
(service/serve/translator.py).

A job that finds no such engine while one that served its version is down and being started again
(a front process's: the supervisor restarts every engine that exits) waits for it (`wait_s` > 0):
in arrival order, up to the queue's bound in sentences (QueueFull beyond it), until its deadline
(DeadlineExceeded) or `wait_s` (EngineUnavailable); the engine back, it takes them. Measured, one
request every 100 ms across a SIGKILL of the only engine (default model, 2 cores): 29 of 29
answered over a 3.1 s restart, where refusing them (`wait_s` 0, as before) failed 31 of 31.
An engine whose start fails again (the supervisor says why: `start_failure`) ends the wait of the
jobs no other engine comes back for, EngineUnavailable with its reason, and refuses new ones at once
until it serves again. So only the jobs an engine held when it went down fail with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.decode.shared.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    QueueFull,
    ShuttingDown,
)
from service.serve import channel as ch
from service.serve.jobs import Job
from service.serve.metrics import Metrics
from service.serve.repository import ModelVersion

log = logging.getLogger("s2s.front")

Versions = tuple[tuple[str, str, str, tuple[str, ...], int], ...]  # the engine's VERSIONS entries
# A waiting job cancelled this close to its deadline (the gRPC server cancels the handler when the
# deadline passes, about when the link would fail it) is counted as its deadline's.
DEADLINE_MARGIN_S = 0.25


@dataclass
class EngineState:
    index: int
    peer: ch.Peer
    name: str = ""  # the engine process's life (its heartbeats say it); "" until heard of
    up: bool = False
    last_beat: float = 0.0
    busy_s: float = 0.0
    generation: int = 0
    versions: Versions = ()
    in_flight: int = 0  # this front's requests it holds
    served: set[tuple[str, str]] = field(default_factory=set)
    failed: str = ""  # why its start failed again (the supervisor's word), until it is up

    def published(self) -> set[tuple[str, str]]:
        """The (model, version)s it served last: what it is expected back with, while down."""
        return {(e[0], e[1]) for e in self.versions}


class EngineLink:
    """The front's intake: `submit` never blocks (a refusal, ShuttingDown, EngineUnavailable or a
    full wait for a restart's QueueFull, is raised at once; the engine's own, QueueFull, comes back
    in a few hundred microseconds). A job waiting for an engine's restart is answered through its
    callback like one sent."""

    def __init__(
        self,
        addresses: Sequence[str],
        name: str,
        follow: Callable[[int, Versions], Awaitable[None]],
        on_change: Callable[[], None] = lambda: None,
        beat_timeout_s: float = 2.0,
        hang_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = 0.0,
        queue_sentences: int = 2048,
        start_failure: Callable[[int], str] = lambda index: "",
        metrics: Metrics | None = None,
    ) -> None:
        """follow(engine index, versions): the front takes up an engine's versions (awaited
        before the engine is told, ACK, and counted up). wait_s: the most a job waits for an
        engine being started again (0: none waits; the single-process mode has no restarts);
        queue_sentences: the sentences that may wait; start_failure(engine index): why its last
        start failed, "" while none did since it last served (the supervisor's word)."""
        self.follow = follow
        self.on_change = on_change
        self.beat_timeout_s = beat_timeout_s
        self.hang_s = hang_s
        self.clock = clock
        self.wait_s = wait_s
        self.queue_sentences = queue_sentences
        self.start_failure = start_failure
        self.metrics = metrics or Metrics()
        self.accepting = True
        self.engines = [
            EngineState(
                i, ch.Peer(a, name, self.versions_of(i), self.beat_of(i), on_gone=self.gone_of(i))
            )
            for i, a in enumerate(addresses)
        ]
        self.sent: dict[Job, tuple[EngineState, int]] = {}
        self.waiting: dict[Job, float] = {}  # jobs waiting for a restart -> since (arrival order)
        self.waiting_sentences = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for engine in self.engines:
            engine.peer.start()
        self.watcher = asyncio.get_running_loop().create_task(self.watch())

    # --- the worker's interface -----------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if not self.accepting:
            raise ShuttingDown("the server is shutting down: retry on another replica")
        assert job.model is not None  # the front names every job's version
        engine = self.ready(job.model)
        if engine is None:
            self.wait(job)
        else:
            self.send(job, engine)

    def send(self, job: Job, engine: EngineState) -> None:
        assert job.model is not None
        kind = ch.ALIGN if job.forced else ch.TRANSLATE
        if job.forced:
            assert job.align_options is not None
            work = ch.align_work(job.pairs, job.align_options)
        else:
            assert job.controls is not None  # computed by the front's text side
            work = ch.translate_work(
                job.sentences, job.options, job.alignment, job.controls, job.keep_rows,
                job.on_progress is not None,
            )  # fmt: skip
        model, carrier = job.model, job.trace.carrier()

        def answer(results: Any, error: Exception | None) -> None:
            if self.sent.pop(job, None) is not None:
                engine.in_flight -= 1
            if isinstance(error, ch.NotTaken) and self.accepting:
                self.resubmit(job)  # the engine went before it took it: it held nothing
                return
            job.finished = True
            job.on_done(results, error)

        ident = engine.peer.request(
            kind,
            lambda i: (ch.JOB, i, kind, model.name, model.version, job.deadline, carrier,
                       job.request_id, work),
            answer,
            job.on_progress,
        )  # fmt: skip
        self.sent[job] = (engine, ident)
        engine.in_flight += 1

    def resubmit(self, job: Job) -> None:
        """A job an engine never took, submitted again: to another engine, or waiting for one
        coming back (`submit`); refused, it fails with the reason."""
        try:
            self.submit(job)
        except Exception as err:
            self.fail(job, err)

    def cancel(self, job: Job) -> None:
        """The client went away or its deadline passed: the engine drops its sentences."""
        if job in self.waiting:
            now = self.clock()
            late = job.deadline is not None and now >= job.deadline - DEADLINE_MARGIN_S
            self.stop_waiting(job, "deadline_exceeded" if late else "cancelled", now)
            return
        found = self.sent.pop(job, None)
        if found is None:
            return
        engine, ident = found
        engine.in_flight -= 1
        engine.peer.forget(ident)
        # the engine not reading: it is going down, its jobs with it
        with contextlib.suppress(EngineUnavailable):
            engine.peer.send((ch.CANCEL, ident))

    def close_intake(self) -> None:
        """Refuse new jobs; the jobs waiting for a restart fail (the supervisor starts no engine
        again once it stops)."""
        self.accepting = False
        error = ShuttingDown("the server is shutting down: retry on another replica")
        for job in list(self.waiting):
            self.end_wait(job, "shutting_down", error, self.clock())

    def ready(self, model: ModelVersion) -> EngineState | None:
        """The engine that is up and serves `model` with the fewest of this front's requests."""
        key = (model.name, model.version)
        ready = [e for e in self.engines if e.up and key in e.served]
        return min(ready, key=lambda e: e.in_flight) if ready else None

    def pick(self, model: ModelVersion) -> EngineState:
        engine = self.ready(model)
        if engine is None:
            raise self.absent(model)
        return engine

    def absent(self, model: ModelVersion) -> EngineUnavailable:
        """Why no engine serves `model`: one that served it failed to start again, or none is up."""
        key = (model.name, model.version)
        failed = [e.failed for e in self.engines if e.failed and key in e.published()]
        if failed:
            return EngineUnavailable(
                f"no engine process serves model {model}: {failed[0]}; it is started again "
                "after a delay: retry later"
            )
        return EngineUnavailable(
            f"no engine process serves model {model} now (it is starting or restarting): "
            "retry in a few seconds"
        )

    # --- jobs waiting for an engine's restart ---------------------------------------------------

    def coming_back(self, model: ModelVersion) -> bool:
        """Whether an engine that served `model` is down and being started again (not failed)."""
        key = (model.name, model.version)
        return self.wait_s > 0 and any(
            not e.up and not e.failed and key in e.published() for e in self.engines
        )

    def wait(self, job: Job) -> None:
        """No engine that is up serves the job's version: it waits for one coming back, or is
        refused at once (none is coming back; the waiting jobs fill the queue's bound)."""
        assert job.model is not None
        if not self.coming_back(job.model):
            raise self.absent(job.model)
        if self.waiting_sentences + len(job.sentences) > self.queue_sentences:
            self.metrics.restart_waited("queue_full")
            raise QueueFull(
                f"the queue is full ({self.waiting_sentences} sentences waiting for an engine "
                f"process to be started again, limit {self.queue_sentences}): retry with backoff"
            )
        self.waiting[job] = self.clock()
        self.waiting_sentences += len(job.sentences)

    def settle(self) -> None:
        """Each waiting job, in arrival order: failed once its deadline passed, sent to an engine
        that serves its version again, failed when none is coming back for it (one failed to
        start again) or it waited `wait_s`; else it waits on."""
        now = self.clock()
        resumed = 0
        for job, since in list(self.waiting.items()):
            assert job.model is not None
            engine = self.ready(job.model)
            if job.deadline is not None and now >= job.deadline:
                late = DeadlineExceeded(
                    "the deadline passed while the request waited for its engine process to be "
                    "started again"
                )
                self.end_wait(job, "deadline_exceeded", late, now)
            elif engine is not None:
                self.stop_waiting(job, "resumed", now)
                resumed += 1
                try:
                    self.send(job, engine)
                except EngineUnavailable as err:  # the engine not reading already
                    self.fail(job, err)
            elif not self.coming_back(job.model):
                self.end_wait(job, "engine_unavailable", self.absent(job.model), now)
            elif now - since >= self.wait_s:
                too_long = EngineUnavailable(
                    f"no engine process serves model {job.model}: none was started again within "
                    f"{self.wait_s:g} s (--engine-restart-wait-s): retry later"
                )
                self.end_wait(job, "engine_unavailable", too_long, now)
        if resumed:
            log.info("requests that waited for an engine sent to it", extra={"requests": resumed})

    def stop_waiting(self, job: Job, outcome: str, now: float) -> None:
        """The job waits no more; counted by how its wait ended (metrics.RESTART_WAIT_OUTCOMES)."""
        since = self.waiting.pop(job)
        self.waiting_sentences -= len(job.sentences)
        self.metrics.restart_waited(outcome, now - since)

    def end_wait(self, job: Job, outcome: str, error: Exception, now: float) -> None:
        self.stop_waiting(job, outcome, now)
        self.fail(job, error)

    def fail(self, job: Job, error: Exception) -> None:
        job.finished = True
        job.on_done(None, error)

    def hear_failures(self) -> None:
        """Each engine down and not heard of since: whether its start failed again (the
        supervisor's word), which ends the wait of the jobs only it was coming back for."""
        for engine in self.engines:
            if engine.up or engine.served:
                continue
            failed = self.start_failure(engine.index)
            if failed and failed != engine.failed:
                log.warning(
                    "engine failed to start again", extra={"engine": engine.index, "why": failed}
                )
            engine.failed = failed

    async def link_head_weights(
        self,
        model: ModelVersion,
        texts: Sequence[tuple[str, list[str]]],
        deadline: float | None = None,
    ) -> Any:
        """The link head's weights for markup (aligner.head_weights_for), from an engine; while
        none serves the version but one is coming back, it waits for it (within the deadline and
        `wait_s`), and a request an engine went without taking is sent again."""
        since = self.clock()
        while True:
            engine = self.ready(model)
            if engine is None:
                late = deadline is not None and self.clock() >= deadline
                if late or not self.coming_back(model) or self.clock() - since >= self.wait_s:
                    raise self.absent(model)
                await asyncio.sleep(0.05)
                continue
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            def answer(results: Any, error: Exception | None, future: Any = future) -> None:
                if not future.done():
                    future.set_exception(error) if error else future.set_result(results)

            engine.peer.request(
                0, lambda i: (ch.HEADS, i, model.name, model.version, tuple(texts)), answer
            )
            try:
                return await future
            except ch.NotTaken:
                continue  # the engine went before it took it: another one, or it again

    # --- what the engines say ---------------------------------------------------------------------

    def beat_of(self, index: int) -> Callable[[Sequence[Any]], None]:
        def beat(message: Sequence[Any]) -> None:
            engine = self.engines[index]
            _, name, busy_s, _, _ = message
            engine.last_beat, engine.busy_s = self.clock(), busy_s
            if name != engine.name:  # a new engine process: follow its versions
                self.new_life(engine, name)

        return beat

    def versions_of(self, index: int) -> Callable[[Sequence[Any]], None]:
        def versions(message: Sequence[Any]) -> None:
            task = asyncio.get_running_loop().create_task(self.take_versions(index, message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        return versions

    async def take_versions(self, index: int, message: Sequence[Any]) -> None:
        _, generation, name, entries = message
        engine = self.engines[index]
        if name != engine.name:
            self.new_life(engine, name)
        # the engine serves the new versions already, and the old ones until this front's ACK:
        # requests the front admits to either while it takes them up go to it
        engine.served |= {(e[0], e[1]) for e in entries}
        try:
            await self.follow(index, entries)
        except Exception:
            log.exception("could not follow the versions of engine %d", index)
            return
        if name != engine.name or generation < engine.generation:
            return  # overtaken meanwhile
        engine.generation, engine.versions = generation, entries
        engine.served = {(e[0], e[1]) for e in entries}
        engine.peer.send((ch.ACK, generation))
        self.check(engine)
        self.on_change()
        self.settle()

    def gone_of(self, index: int) -> Callable[[], None]:
        def gone() -> None:
            """The engine's connection closed: its process ended (killed, crashed, stopped). It is
            down now, not when its heartbeat is missed, and stays down until a process says its
            versions again (the same one, were it still alive: the front's next ping asks)."""
            engine = self.engines[index]
            engine.generation, engine.served = 0, set()
            if engine.up or engine.peer.open:
                self.down(engine, "its connection closed")

        return gone

    def new_life(self, engine: EngineState, name: str) -> None:
        """The engine's process is another one (restarted): what the old one held is lost."""
        if engine.name:
            self.down(engine, "restarted")
        engine.name, engine.generation, engine.served = name, 0, set()
        engine.peer.hello(name, 0)

    async def watch(self) -> None:
        """Every 0.1 s: each engine up or down by its heartbeat, a failed start again, the jobs
        waiting for a restart; a front's ping (HELLO, once a second) keeps it known to the engine."""
        pinged = 0.0
        while True:
            await asyncio.sleep(0.1)
            now = self.clock()
            for engine in self.engines:
                self.check(engine)
                if now - pinged >= 1.0:
                    engine.peer.hello(engine.name, engine.generation)
            pinged = pinged if now - pinged < 1.0 else now
            if self.wait_s > 0:
                self.hear_failures()
            if self.waiting:
                self.settle()

    def check(self, engine: EngineState) -> None:
        now = self.clock()
        silent = now - engine.last_beat > self.beat_timeout_s
        hung = engine.busy_s > self.hang_s
        if engine.up and (silent or hung):
            self.down(engine, "hung" if hung else "not heard of")
        elif not engine.up and not silent and not hung and engine.generation:
            engine.up, engine.failed = True, ""
            log.info("engine up", extra={"engine": engine.index, "engine_process": engine.name})
            self.on_change()
            self.settle()

    def down(self, engine: EngineState, why: str) -> None:
        was_up = engine.up
        engine.up = False
        failed = len(engine.peer.taken & engine.peer.open.keys())
        sent_again = len(engine.peer.open) - failed if self.accepting else 0  # never taken
        engine.peer.fail_all(
            EngineUnavailable(
                f"the engine process decoding this request stopped ({why}); it is being "
                "restarted: retry in a few seconds"
            )
        )
        log.warning(
            "engine down",
            extra={
                "engine": engine.index,
                "why": why,
                "requests_failed": failed,
                "requests_sent_again": sent_again,
            },
        )
        if was_up:
            self.on_change()

    def serving(self) -> set[tuple[str, str]]:
        """The (model, version)s some engine that is up serves."""
        return {key for e in self.engines if e.up for key in e.served}

    async def stop(self) -> None:
        self.close_intake()
        if self.watcher is not None:
            self.watcher.cancel()
        for task in list(self.tasks):
            task.cancel()
        for engine in self.engines:
            await engine.peer.close()
