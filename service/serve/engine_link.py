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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.decode.errors import EngineUnavailable, ShuttingDown
from service.serve import channel as ch
from service.serve.repository import ModelVersion
from service.serve.worker import Job

log = logging.getLogger("s2s.front")

Versions = tuple[tuple[str, str, str, tuple[str, ...], int], ...]  # the engine's VERSIONS entries


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


class EngineLink:
    """The front's intake: `submit` never waits (a refusal, ShuttingDown or EngineUnavailable, is
    raised at once; the engine's own, QueueFull, comes back in a few hundred microseconds)."""

    def __init__(
        self,
        addresses: Sequence[str],
        name: str,
        follow: Callable[[int, Versions], Awaitable[None]],
        on_change: Callable[[], None] = lambda: None,
        beat_timeout_s: float = 2.0,
        hang_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """follow(engine index, versions): the front takes up an engine's versions (awaited
        before the engine is told, ACK, and counted up)."""
        self.follow = follow
        self.on_change = on_change
        self.beat_timeout_s = beat_timeout_s
        self.hang_s = hang_s
        self.clock = clock
        self.accepting = True
        self.engines = [
            EngineState(
                i, ch.Peer(a, name, self.versions_of(i), self.beat_of(i), on_gone=self.gone_of(i))
            )
            for i, a in enumerate(addresses)
        ]
        self.sent: dict[Job, tuple[EngineState, int]] = {}
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
        engine = self.pick(job.model)
        kind = ch.ALIGN if job.forced else ch.TRANSLATE
        if job.forced:
            assert job.align_options is not None
            work = ch.align_work(job.pairs, job.align_options)
        else:
            assert job.controls is not None  # computed by the front's text side
            work = ch.translate_work(
                job.sentences, job.options, job.alignment, job.controls, job.keep_rows
            )
        model, carrier = job.model, job.trace.carrier()

        def answer(results: Any, error: Exception | None) -> None:
            if self.sent.pop(job, None) is not None:
                engine.in_flight -= 1
            job.finished = True
            job.on_done(results, error)

        ident = engine.peer.request(
            kind,
            lambda i: (ch.JOB, i, kind, model.name, model.version, job.deadline, carrier,
                       job.request_id, work),
            answer,
        )  # fmt: skip
        self.sent[job] = (engine, ident)
        engine.in_flight += 1

    def cancel(self, job: Job) -> None:
        """The client went away or its deadline passed: the engine drops its sentences."""
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
        self.accepting = False

    def pick(self, model: ModelVersion) -> EngineState:
        key = (model.name, model.version)
        ready = [e for e in self.engines if e.up and key in e.served]
        if not ready:
            raise EngineUnavailable(
                f"no engine process serves model {model} now (it is starting or restarting): "
                "retry in a few seconds"
            )
        return min(ready, key=lambda e: e.in_flight)

    async def heads(self, model: ModelVersion, texts: Sequence[tuple[str, list[str]]]) -> Any:
        """The link head's weights for markup (aligner.head_weights_for), from an engine."""
        engine = self.pick(model)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answer(results: Any, error: Exception | None) -> None:
            if not future.done():
                future.set_exception(error) if error else future.set_result(results)

        engine.peer.request(
            0, lambda i: (ch.HEADS, i, model.name, model.version, tuple(texts)), answer
        )
        return await future

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
        """Every 0.1 s: each engine up or down by its heartbeat; a front's ping (HELLO, once a
        second) keeps it known to the engine."""
        pinged = 0.0
        while True:
            await asyncio.sleep(0.1)
            now = self.clock()
            for engine in self.engines:
                self.check(engine)
                if now - pinged >= 1.0:
                    engine.peer.hello(engine.name, engine.generation)
            pinged = pinged if now - pinged < 1.0 else now

    def check(self, engine: EngineState) -> None:
        now = self.clock()
        silent = now - engine.last_beat > self.beat_timeout_s
        hung = engine.busy_s > self.hang_s
        if engine.up and (silent or hung):
            self.down(engine, "hung" if hung else "not heard of")
        elif not engine.up and not silent and not hung and engine.generation:
            engine.up = True
            log.info("engine up", extra={"engine": engine.index, "engine_process": engine.name})
            self.on_change()

    def down(self, engine: EngineState, why: str) -> None:
        was_up = engine.up
        engine.up = False
        failed = len(engine.peer.open)
        engine.peer.fail_all(
            EngineUnavailable(
                f"the engine process decoding this request stopped ({why}); it is being "
                "restarted: retry in a few seconds"
            )
        )
        log.warning(
            "engine down",
            extra={"engine": engine.index, "why": why, "requests_failed": failed},
        )
        if was_up:
            self.on_change()

    def serving(self) -> set[tuple[str, str]]:
        """The (model, version)s some engine that is up serves."""
        return {key for e in self.engines if e.up for key in e.served}

    async def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        for task in list(self.tasks):
            task.cancel()
        for engine in self.engines:
            await engine.peer.close()
