"""The engine half of the server: loaded models, the decode loop, and the channel's engine end.

An engine process (one per device) runs one `EngineHost`; the single-process mode runs one beside
its front, over an in-process channel. It takes jobs of token ids from its fronts
(service/serve/channel.py), queues them on its worker (service/serve/worker.py) and answers with
the raw results; it never builds a response, reads a request or tokenizes a text (the link head's
markup weights excepted: `heads`). Every `BEAT_S` it tells its fronts it lives and how long its
decode loop has been in one iteration: a front that hears nothing, or hears of a loop stuck in one
iteration, turns the engine's models NOT_SERVING and answers its requests UNAVAILABLE.

The engine owns the model versions: it loads the repository, reloads it (SIGHUP, the polling
interval) and publishes each generation of versions to its fronts (VERSIONS), which follow it
(service/serve/mirror.py). A version the engine drops stays addressable until every front has
acknowledged the generation without it (or `LEAVING_S` passed), so that no request a front
admitted to it meanwhile is refused.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from service.decode.align.aligner import head_weights_for
from service.decode.engine.engine import Engine
from service.decode.runtime.providers import require_provider
from service.decode.shared.errors import ModelNotFound, QueueFull, ShuttingDown
from service.decode.shared.search_types import Hypothesis, Settled
from service.model.embedded import resolve_bundle, resolve_repository
from service.serve import channel as ch
from service.serve import glossary_files, memory_files
from service.serve.config import Settings, VersionPolicy
from service.serve.jobs import Job
from service.serve.metrics import Metrics
from service.serve.metrics_endpoint import ProcessMetrics
from service.serve.repository import Events, ModelVersion, ReloadReport, Repository, single
from service.serve.request_trace import NO_TRACE
from service.serve.tracing import Tracing
from service.serve.worker import Worker, engine_of

log = logging.getLogger("s2s.engine")

BEAT_S = 0.2  # how often the engine tells its fronts it lives
PEER_TIMEOUT_S = 5.0  # a front not heard of for this long is gone: its jobs are cancelled
LEAVING_S = 10.0  # the most a dropped version waits for the fronts' acknowledgements


@dataclass
class Leaving:
    """Versions dropped at a generation, kept addressable until the fronts have followed."""

    generation: int
    versions: list[ModelVersion]
    since: float = field(default_factory=time.monotonic)


class EngineHost:
    def __init__(
        self,
        repository: Repository,
        worker: Worker,
        address: str,
        tracing: Callable[[], Tracing],
        refresh: Callable[[], None] = lambda: None,
    ) -> None:
        """refresh: re-reads what a reload re-reads beside the repository (memory, glossaries)."""
        self.repository = repository
        self.worker = worker
        self.tracing = tracing
        self.refresh = refresh
        self.name = f"{os.getpid()}-{time.time_ns()}"  # this process's life: a restart is another
        self.endpoint = ch.Endpoint(address, self.handle, self.tick, BEAT_S)
        self.jobs: dict[tuple[bytes, int], Job] = {}
        self.seen: dict[bytes, float] = {}  # front -> when last heard of (channel thread)
        self.acked: dict[bytes, int] = {}  # front -> the generation it follows
        self.generation = 0
        self.published: dict[tuple[str, str], ModelVersion] = {}
        self.leaving: list[Leaving] = []
        self.lock = threading.Lock()  # published, leaving, generation
        self.link_head_pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="link-head"
        )

    def start(self) -> None:
        self.publish()
        self.worker.start()
        self.endpoint.start()

    # --- versions -------------------------------------------------------------------------------

    def publish(self) -> None:
        """A new generation: the loaded versions, held while published; dropped ones leave."""
        loaded = {(m.name, m.version): m for m in self.repository.loaded()}
        with self.lock:
            self.generation += 1
            for key, model in loaded.items():
                if self.published.get(key) is not model:
                    self.repository.hold(model)
            dropped = [m for k, m in self.published.items() if loaded.get(k) is not m]
            if dropped:
                self.leaving.append(Leaving(self.generation, dropped))
            self.published = loaded
        self.endpoint.broadcast(self.versions_message())

    def versions_message(self) -> tuple[Any, ...]:
        with self.lock:
            entries = tuple(
                (
                    m.name,
                    m.version,
                    str(m.path or ""),
                    tuple(m.engine.model.providers),
                    m.resident_bytes,
                )
                for m in self.published.values()
            )
            return (ch.VERSIONS, self.generation, self.name, entries)

    def reload(self) -> ReloadReport:
        """Follow the repository's folder, re-read memory and glossaries, publish (slow: loads)."""
        report = self.repository.reload()
        self.refresh()
        self.publish()
        return report

    def resolve(self, name: str, version: str) -> ModelVersion:
        with self.lock:
            model = self.published.get((name, version))
            if model is None:
                model = next(
                    (
                        m
                        for leaving in self.leaving
                        for m in leaving.versions
                        if (m.name, m.version) == (name, version)
                    ),
                    None,
                )
        if model is None:
            raise ModelNotFound(f"model {name!r} version {version!r} is not loaded in this engine")
        return model

    def release_left(self, now: float) -> None:
        """Let go of dropped versions every front has stopped sending (or after LEAVING_S)."""
        followed = min(self.acked.values(), default=self.generation)
        with self.lock:
            done = [
                g for g in self.leaving if g.generation <= followed or now - g.since > LEAVING_S
            ]
            self.leaving = [g for g in self.leaving if g not in done]
        for gone in done:
            for model in gone.versions:
                self.repository.release(model)

    # --- the channel's messages (its thread) ------------------------------------------------------

    def handle(self, peer: bytes, message: Sequence[Any]) -> None:
        self.seen[peer] = time.monotonic()
        kind = message[0]
        if kind == ch.HELLO:
            _, _, engine, generation = message
            if engine != self.name or generation < self.generation:
                self.endpoint.send(peer, self.versions_message())
            self.acked.setdefault(peer, 0)
        elif kind == ch.ACK:
            self.acked[peer] = message[1]
            self.release_left(time.monotonic())
        elif kind == ch.JOB:
            self.endpoint.send(peer, (ch.TAKEN, message[1]))  # held from now on
            self.take(peer, message)
        elif kind == ch.CANCEL:
            job = self.jobs.get((peer, message[1]))
            if job is not None:
                self.worker.cancel(job)
        elif kind == ch.HEADS:
            self.endpoint.send(peer, (ch.TAKEN, message[1]))
            self.link_head_pool.submit(self.link_weights, peer, message)

    def take(self, peer: bytes, message: Sequence[Any]) -> None:
        """A job: queued on the worker, or refused at once (a full queue, a stop, no such model)."""
        _, ident, kind, name, version, deadline, carrier, request_id, work = message
        try:
            model = self.resolve(name, version)
        except ModelNotFound as err:
            self.endpoint.send(peer, (ch.FAILED, ident, *ch.error_message(err)))
            return
        trace = self.tracing().remote(carrier) if carrier else NO_TRACE
        done = self.answer(peer, ident, kind, model)
        if kind == ch.ALIGN:
            pairs, options = ch.read_align(work)
            job = Job.align(request_id, pairs, options, done, deadline, model)
        else:
            read = ch.read_translate(work)
            job = Job(
                request_id, read.sentences, read.options, read.alignment, done, deadline, model
            )
            job.controls, job.keep_rows = read.controls, read.keep_rows
            if read.progress:
                job.on_progress = self.progress_of(peer, ident)
        job.raw, job.trace = True, trace
        self.repository.hold(model)
        self.jobs[(peer, ident)] = job
        trace.queued()
        try:
            self.worker.submit(job)
        except (QueueFull, ShuttingDown) as err:
            self.jobs.pop((peer, ident), None)
            self.repository.release(model)
            self.endpoint.send(peer, (ch.FAILED, ident, *ch.error_message(err)))

    def answer(
        self, peer: bytes, ident: int, kind: int, model: ModelVersion
    ) -> Callable[[list[Any] | None, Exception | None], None]:
        """The job's completion (called on the decode loop's thread): its raw results sent back."""

        def done(results: list[Any] | None, error: Exception | None) -> None:
            self.jobs.pop((peer, ident), None)
            self.repository.release(model)
            if error is not None:
                self.endpoint.send(peer, (ch.FAILED, ident, *ch.error_message(error)))
            else:
                self.endpoint.send(peer, (ch.DONE, ident, ch.results_out(kind, results or [])))

        return done

    def progress_of(self, peer: bytes, ident: int) -> Settled:
        """A streamed job's progress (called on the decode loop's thread): each sentence's
        settled prefix sent as it grows."""

        def report(index: int, prefix: Hypothesis) -> None:
            self.endpoint.send(peer, (ch.PROGRESS, ident, index, ch.hypothesis_out(prefix)))

        return report

    def link_weights(self, peer: bytes, message: Sequence[Any]) -> None:
        """Markup's link head weights (aligner.head_weights_for), off the decode loop."""
        _, ident, name, version, texts = message
        try:
            model = self.resolve(name, version)
            engine = engine_of(model)
            found = head_weights_for(engine, [(s, list(t)) for s, t in texts], engine.kept_rows)
        except Exception as err:
            if not isinstance(err, ModelNotFound):
                log.exception("the link head failed")
            self.endpoint.send(peer, (ch.FAILED, ident, *ch.error_message(err)))
            return
        self.endpoint.send(peer, (ch.DONE, ident, tuple(found)))

    def tick(self) -> None:
        """Every BEAT_S: the heartbeat, fronts gone, versions no front sends any more."""
        now = time.monotonic()
        load = self.worker.load
        self.endpoint.broadcast(
            (ch.BEAT, self.name, self.worker.busy_for(), load.waiting, load.decoding)
        )
        gone = [p for p, t in self.seen.items() if now - t > PEER_TIMEOUT_S]
        for peer in gone:
            self.forget(peer)
        self.release_left(now)

    def forget(self, peer: bytes) -> None:
        """A front gone (killed mid-request): its jobs are cancelled, their places freed."""
        self.seen.pop(peer, None)
        self.acked.pop(peer, None)
        self.endpoint.peers.discard(peer)
        for (who, _), job in list(self.jobs.items()):
            if who == peer:
                self.worker.cancel(job)

    # --- life cycle -------------------------------------------------------------------------------

    def close_intake(self) -> None:
        self.worker.close_intake()

    def stop(self, drain_timeout: float | None = None) -> None:
        """Finish the accepted jobs (up to drain_timeout), send their answers, stop."""
        self.worker.stop(drain_timeout)
        self.endpoint.stop()
        self.link_head_pool.shutdown(wait=False, cancel_futures=True)


# --- loading ------------------------------------------------------------------------------------


class EngineEvents(Events):
    """The engine's versions -> its metrics: info, memory, decode series (the front's requests'
    series are the front's: server.FrontEvents)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def loaded(self, model: ModelVersion) -> None:
        engine = model.engine
        # every version's host<->device bytes, not only the default model's (a ledger stays
        # watched after its version unloads: the counters it fed must not go down)
        self.metrics.watch_transfers(engine.model.transfers)
        self.metrics.model_loaded(
            model.name,
            model.version,
            engine.cfg.attention,
            engine.model.providers[0],
            model.resident_bytes,
        )

    def unloaded(self, model: ModelVersion) -> None:
        self.metrics.model_unloaded(model.name, model.version)

    def failed(self, name: str, version: str, error: Exception) -> None:
        self.metrics.model_load_failed(name)


def warm_up(engine: Engine) -> None:
    """Decode once at several batch shapes so the first real request pays no first-run costs."""
    engine.warm_up()


def build_repository(settings: Settings, metrics: Metrics) -> Repository:
    """The repository the settings name: one bundle (--bundle) or a folder (--models). Each
    version is loaded, given its memory and glossary files (one that does not parse refuses it,
    as the fronts would) and, unless --no-warmup, warmed up before it takes requests."""
    s = settings.server

    def load(path: Path) -> Engine:
        engine = Engine.load(path, settings.runtime, settings.limits)
        memory_files.attach(engine, s.memory_dir)
        glossary_files.attach(engine, s.glossary_dir)
        if s.warmup:
            warm_up(engine)
        return engine

    return Repository(
        resolve_bundle(s.bundle) if s.bundle else resolve_repository(s.models),
        load,
        VersionPolicy(s.version_policy, s.pinned_versions),
        s.default_model,
        EngineEvents(metrics),
        single=bool(s.bundle),
    )


def build_engine_host(
    settings: Settings,
    metrics: Metrics,
    address: str,
    engine: Engine | None = None,
    tracing: Callable[[], Tracing] | None = None,
) -> EngineHost:
    """An engine half: its models loaded (or `engine`, warmed up), its decode loop, its channel
    end bound at `address` (not started)."""
    if engine is None:
        repository = build_repository(settings, metrics)
        repository.load_all()
    else:
        if settings.server.warmup:
            warm_up(engine)
        repository = Repository.of(single(engine), events=EngineEvents(metrics))
        repository.events.loaded(repository.get())
    worker = Worker(engine_of(repository.get()), settings.batching, metrics)
    own = Tracing(settings.tracing) if tracing is None else None

    def refresh() -> None:
        engines = [m.engine for m in repository.loaded()]
        memory_files.refresh(engines, settings.server.memory_dir)
        glossary_files.refresh(engines, settings.server.glossary_dir)

    return EngineHost(repository, worker, address, tracing or (lambda: own), refresh)  # type: ignore[arg-type,return-value]


# --- an engine process ----------------------------------------------------------------------------


def run_engine_process(
    settings: Settings, address: str, name: str, run_dir: Path, index: int = 0
) -> int:
    """An engine process (started by the supervisor): load, serve its fronts over `address` until
    SIGTERM, reload on SIGHUP and every --reload-interval-s. Engine `index` decodes on device
    --device-id + index (one engine per GPU). Its metrics on 127.0.0.1, the port in
    RUN/metrics/NAME.port, its final reading in NAME.final; why it cannot start in RUN/NAME.error
    (the supervisor tells the fronts)."""
    runtime = replace(settings.runtime, device_id=settings.runtime.device_id + index)
    settings = replace(settings, runtime=runtime)
    metrics = Metrics()
    try:
        require_provider(settings.runtime.require_provider, settings.runtime.device_id)
        host = build_engine_host(settings, metrics, address)
    except Exception as err:  # a bad bundle, a provider refused: one clear line
        log.critical("cannot start: %s", err)
        (run_dir / f"{name}.error").write_text(f"cannot start: {err}")  # the supervisor tells why
        return 1
    stop, reload = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    process_metrics = ProcessMetrics(metrics, run_dir, name)
    host.start()
    log.info(
        "engine serving",
        extra={"engine": name, "models": [str(m) for m in host.repository.loaded()]},
    )
    interval = settings.server.reload_interval_s
    next_poll = time.monotonic() + (interval or math.inf)
    while not stop.is_set():
        if reload.wait(0.25) or time.monotonic() >= next_poll:
            reload.clear()
            next_poll = time.monotonic() + (interval or math.inf)
            try:
                report = host.reload()
                metrics.reloaded()
                log.info(
                    "reloaded",
                    extra={"loaded": report.loaded, "failed": report.failed,
                           "retired": report.retired},
                )  # fmt: skip
            except Exception:  # a reload never takes the engine down; the old versions serve on
                log.exception("reload failed")
    log.info("shutting down", extra={"engine": name})
    host.close_intake()
    host.stop(settings.server.grace_s)
    host.tracing().shutdown()  # the spans still buffered
    process_metrics.close()
    log.info("stopped", extra={"engine": name})
    return 0
