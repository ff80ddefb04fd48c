"""A front's life cycle: `create_server`, `serve` (the single-process server) and `serve_front`
(a front process of the supervisor's); service/serve/server.py starts them.

`create_server` starts a front: the gRPC face (service/serve/grpc_api.py) with health and
reflection, and the HTTP face (service/serve/http_api.py), over the front's versions and its link to
the engines; in the single-process mode, the engine half beside it. Protobuf stays at the faces:
service/serve/protocol.py validates requests and converts them to plain types, the engines decode,
and results are converted back; errors become status codes in one place (service/serve/status.py);
logs are JSON lines (service/serve/logs.py); TLS is service/serve/tls.py's, the metrics endpoints
service/serve/metrics_endpoint.py's. Life cycle: NOT_SERVING while the model loads and warms up,
SERVING after; on SIGTERM NOT_SERVING again, new requests refused (the intake closed), accepted ones
finished within the grace period.

Several models (service/serve/repository.py): a request names its model (or gets the default one), holds
that version until it is answered, and decodes in that version's batches. SIGHUP and a polling
interval reload the repository off the event loop; health has a service name per model
(`translation.v1.Translator/NAME`), SERVING while a version of it is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.decode.engine.text_side import TextSide
from service.serve.config import Settings
from service.serve.engine_link import EngineLink
from service.serve.grpc_api import SERVICE_NAME, TranslatorServicer, add_translator_servicer
from service.serve.http_api import HttpFace
from service.serve.metrics import Metrics
from service.serve.metrics_endpoint import (
    ProcessMetrics,
    start_metrics_endpoint,
    stop_metrics_endpoint,
)
from service.serve.mirror import Follower, shared_engines, text_sides
from service.serve.repository import Events, ModelVersion, ReloadReport, Repository
from service.serve.status import status_for
from service.serve.supervisor import start_failure
from service.serve.tls import bind_grpc_port

if TYPE_CHECKING:  # the engine half's: a front process imports neither it nor ONNX Runtime
    from service.decode.engine.engine import Engine
    from service.serve.engine_host import EngineHost
    from service.serve.worker import Worker

log = logging.getLogger("s2s.server")

# On stop, the gRPC server is shut once no Translate handler has run for this long: requests that
# reached gRPC core before the stop began have been handed to a handler by then.
QUIET_S = 0.3


# --- life cycle --------------------------------------------------------------------------------


@dataclass
class Running:
    """A started server and what it owns: the front (gRPC, HTTP, the servicer, its versions) and,
    in the single-process mode, the engine half beside it (`host`)."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    metrics: Metrics
    settings: Settings
    repository: Repository  # the front's versions (service/serve/mirror.py)
    servicer: TranslatorServicer
    link: EngineLink
    host: EngineHost | None = None  # the single-process mode's engine half
    metrics_port: int | None = None
    metrics_http: WSGIServer | None = None
    health_names: set[str] = field(default_factory=set)  # per-model names set so far
    http: HttpFace | None = None  # the HTTP/JSON face (service/serve/http_api.py), --http-port >= 0
    serving: bool = False
    health_task: asyncio.Task[None] | None = None

    @property
    def http_port(self) -> int | None:
        return None if self.http is None else self.http.port

    @property
    def worker(self) -> Worker:
        """The single-process mode's decode loop."""
        assert self.host is not None, "a front process has no decode loop"
        return self.host.worker

    @property
    def engine(self) -> TextSide:
        """The default model's engine (a front process's: its text side)."""
        return self.repository.get().engine

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving
        await self.set_model_health()

    async def set_model_health(self) -> None:
        """SERVING for each model with a version an engine that is up serves, NOT_SERVING for the
        others and models gone since; the server as a whole SERVING while any is ("" stays SERVING
        while the front lives and is not stopping: the liveness probe's)."""
        up = self.link.serving()
        served = {
            model_health_name(m.name)
            for m in self.repository.loaded()
            if (m.name, m.version) in up and self.serving
        }
        for name in sorted(
            served | self.health_names | {model_health_name(n) for n in self.repository.names()}
        ):
            await self.health.set(name, SERVING if name in served else NOT_SERVING)
        self.health_names |= served
        await self.health.set(SERVICE_NAME, SERVING if served else NOT_SERVING)
        await self.health.set("", SERVING if self.serving else NOT_SERVING)

    async def reload(self) -> ReloadReport:
        """The single-process mode's reload: the engine half reloads (off the event loop: loads and
        warm-ups are slow) and publishes, the front follows; then health."""
        assert self.host is not None, "a front process follows its engines' reloads"
        host = self.host
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(None, host.reload)
        deadline = loop.time() + 60.0
        while self.link.engines[0].generation < host.generation and loop.time() < deadline:
            await asyncio.sleep(0.005)  # the front takes up the new generation
        self.metrics.reloaded()
        await self.set_model_health()
        log.info(
            "reloaded",
            extra={"loaded": report.loaded, "failed": report.failed, "retired": report.retired},
        )
        return report

    async def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING, refuse new work, finish accepted requests within the grace period, stop.

        The gRPC server goes on taking requests until the handlers are done (new ones answered
        UNAVAILABLE, logged and counted, since the intake is closed): stopping it at once would
        have gRPC core answer CANCELLED the requests that reached it but no handler yet, and
        cancel at the end of the grace the ones it did hand over. It stops once no handler has run
        for QUIET_S, with what is left of the grace for the answers still being sent."""
        grace = self.settings.server.grace_s if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self.serving = False
        await self.health.enter_graceful_shutdown()
        self.link.close_intake()
        if self.host is not None:
            self.host.close_intake()
        while loop.time() < deadline and self.servicer.handlers.idle_for() < QUIET_S:
            await asyncio.sleep(0.02)
        remaining = max(0.0, deadline - loop.time())
        if self.http is not None:  # stops listening, then waits for its answers in progress
            await asyncio.gather(self.http.stop(), self.server.stop(remaining))
        else:
            await self.server.stop(remaining)
        if self.health_task is not None:
            self.health_task.cancel()
        if self.host is not None:
            await loop.run_in_executor(None, self.host.stop, 5.0)
        await self.link.stop()
        if self.metrics_http is not None:
            stop_metrics_endpoint(self.metrics_http)
        await loop.run_in_executor(None, self.servicer.tracing.shutdown)  # spans still buffered


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def model_health_name(name: str) -> str:
    """The grpc.health.v1 service name of one model."""
    return f"{SERVICE_NAME}/{name}"


class FrontEvents(Events):
    """The front's versions -> its request series (the engine's: engine_host.EngineEvents)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def loaded(self, model: ModelVersion) -> None:
        self.metrics.model_served(model.name, model.version)

    def unloaded(self, model: ModelVersion) -> None:
        self.metrics.model_unserved(model.name, model.version)


def connection_age_options(seconds: float) -> list[tuple[str, int]]:
    """Close client connections after `seconds` (gracefully) so headless-Service clients using
    round_robin re-resolve DNS and reach pods added by a scale-out."""
    if seconds <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", int(seconds * 1000)),
        ("grpc.max_connection_age_grace_ms", 30_000),
    ]


@dataclass
class Faces:
    """A front's started faces: gRPC (with health and reflection) and HTTP, and the servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    servicer: TranslatorServicer
    http: HttpFace | None


async def start_front(settings: Settings, metrics: Metrics, reuse_port: bool = False) -> Faces:
    """The front's faces, bound and started: health NOT_SERVING and Translate UNAVAILABLE until
    the servicer is attached. reuse_port: the front processes share the ports (SO_REUSEPORT)."""
    health_servicer = health.aio.HealthServicer()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.server.max_message_bytes),
            ("grpc.max_send_message_length", settings.server.max_message_bytes),
            # fronts of one server share the port (the kernel spreads connections over them)
            ("grpc.so_reuseport", int(reuse_port)),
            *connection_age_options(settings.server.max_connection_age_s),
        ]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, NOT_SERVING)
    if settings.server.reflection:
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
    port = bind_grpc_port(server, settings)
    servicer = TranslatorServicer(settings, metrics)
    add_translator_servicer(servicer, server)  # before start: grpc takes no handlers after it
    await server.start()  # health answers NOT_SERVING, Translate UNAVAILABLE, while the model loads
    http: HttpFace | None = None
    try:
        if settings.server.http_port >= 0:
            http = HttpFace(servicer, status_for, reuse_port)
            await http.start()
    except BaseException:
        await server.stop(None)
        raise
    return Faces(server, port, health_servicer, servicer, http)


@dataclass
class Starting:
    """What `create_server` has started so far: released, the ports first, when the start fails."""

    faces: Faces | None = None
    host: EngineHost | None = None  # the single-process mode's engine half
    link: EngineLink | None = None

    async def release(self) -> None:
        if self.faces is not None:
            if self.faces.http is not None:
                await self.faces.http.stop()
            await self.faces.server.stop(None)
        if self.link is not None:
            await self.link.stop()
        if self.host is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.host.stop, 0.0)


async def create_server(
    settings: Settings,
    engine: Engine | None = None,
    metrics: Metrics | None = None,
    engines: Sequence[str] | None = None,
    name: str = "front",
    run_dir: Path | None = None,
) -> Running:
    """A server: the front and, unless `engines` names the engine processes' channel addresses,
    the engine half in this process (the single-process mode: it loads the models, or takes
    `engine`, and warms them up); port 0 picks a free one. Returns once the models are served.
    A front process's requests wait for an engine being started again (--engine-restart-wait-s);
    its supervisor's `run_dir` says when one failed to start.

    The single-process mode binds its ports first (health NOT_SERVING while the models load); a
    front process binds them once it follows its engines' versions, so that a front (re)started
    beside others never takes a connection it cannot serve."""
    if settings.runtime.require_provider:  # (ONNX Runtime imported only to check it)
        from service.decode.runtime.providers import require_provider

        require_provider(settings.runtime.require_provider, settings.runtime.device_id)
    metrics = metrics or Metrics()
    loop = asyncio.get_running_loop()
    started = Starting()
    try:
        if engines is None:  # the single-process mode
            started.faces = await start_front(settings, metrics)
            started.host = await loop.run_in_executor(
                None, start_engine_half, settings, metrics, engine, started.faces.servicer
            )
            engines = [started.host.endpoint.address]
        follower = front_follower(settings, metrics, started.host)
        changed = asyncio.Event()  # the engines' versions, or an engine's state, changed
        started.link = link_engines(
            settings, metrics, engines, name, run_dir, follower, changed, started.host
        )
        await started.link.start()
        while not started.link.serving():
            await asyncio.sleep(0.005)
        if started.faces is None:
            started.faces = await start_front(settings, metrics, reuse_port=True)
        faces = started.faces
        running = Running(
            faces.server,
            faces.port,
            faces.health,
            metrics,
            settings,
            follower.repository,
            faces.servicer,
            started.link,
            started.host,
            http=faces.http,
        )
        await start_serving(running, changed, len(engines), name)
    except BaseException:  # a bad bundle, a failed warm-up: release the port before raising
        await started.release()
        raise
    return running


def front_follower(settings: Settings, metrics: Metrics, host: EngineHost | None) -> Follower:
    """The front's versions, following the engines': the single-process mode's front shares the
    engine half's Engine objects, a front process loads their text sides."""
    engines_of = (
        partial(text_sides, settings) if host is None else partial(shared_engines, host.repository)
    )
    follower = Follower(Repository.of(events=FrontEvents(metrics)), settings, engines_of)
    follower.repository.default_name = settings.server.default_model
    return follower


def link_engines(
    settings: Settings,
    metrics: Metrics,
    engines: Sequence[str],
    name: str,
    run_dir: Path | None,
    follower: Follower,
    changed: asyncio.Event,
    host: EngineHost | None,
) -> EngineLink:
    """The front's link to its engines (not started): their versions to `follower`, any change
    to `changed`."""
    return EngineLink(
        engines,
        name,
        follower.follow,
        changed.set,
        hang_s=settings.server.engine_hang_s,
        # the single-process mode has no restarts to wait for
        wait_s=0.0 if host is not None else settings.server.engine_restart_wait_s,
        queue_sentences=settings.batching.max_queue_sentences,
        start_failure=(lambda i: "") if run_dir is None else partial(start_failure, run_dir),
        metrics=metrics,
    )


async def start_serving(running: Running, changed: asyncio.Event, engines: int, name: str) -> None:
    """The servicer given the front's versions and engines, health following them, the
    single-process mode's metrics endpoint (a front process's are the supervisor's), SERVING."""
    settings, repository = running.settings, running.repository
    running.servicer.attach(repository, running.link)
    running.health_task = asyncio.get_running_loop().create_task(follow_health(running, changed))
    if settings.server.metrics_port >= 0 and running.host is not None:
        running.metrics_http, running.metrics_port = start_metrics_endpoint(
            settings, running.metrics
        )
    await running.set_serving(True)
    log.info(
        "serving",
        extra={
            "port": running.port,
            "metrics_port": running.metrics_port,
            "http_port": running.http_port,
            "model": repository.default(),
            "models": [str(m) for m in repository.loaded()],
            "providers": running.engine.model.providers,
            "engines": engines,
            "front": name,
        },
    )


async def follow_health(running: Running, changed: asyncio.Event) -> None:
    """Health follows the engines: their versions, up or down."""
    while True:
        await changed.wait()
        changed.clear()
        await running.set_model_health()


def start_engine_half(
    settings: Settings, metrics: Metrics, engine: Engine | None, servicer: TranslatorServicer
) -> EngineHost:
    """The single-process mode's engine half, over an in-process channel; traced with the front's
    tracer (whatever it is when a request comes)."""
    from service.serve.engine_host import build_engine_host

    host = build_engine_host(
        settings, metrics, f"inproc://engine-{uuid.uuid4().hex}", engine, lambda: servicer.tracing
    )
    host.start()
    return host


async def serve(settings: Settings) -> None:
    """The single-process server (--fronts 0), or one front process (the supervisor gives it its
    engines' addresses: service/serve/supervisor.py)."""
    running = await create_server(settings)
    await run_until_stopped(running, settings)


async def run_until_stopped(running: Running, settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then stop; SIGHUP and the polling interval reload (the
    single-process mode's; a front process follows its engines)."""
    stop = asyncio.Event()
    reload = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloader = None
    if running.host is not None:
        loop.add_signal_handler(signal.SIGHUP, reload.set)
        reloader = asyncio.create_task(
            reload_loop(running, reload, settings.server.reload_interval_s)
        )
    else:
        loop.add_signal_handler(signal.SIGHUP, lambda: None)  # the supervisor's engines reload
    await stop.wait()
    if reloader is not None:
        reloader.cancel()
    log.info("shutting down", extra={"grace_s": settings.server.grace_s})
    await running.stop()
    log.info("stopped")


async def reload_loop(running: Running, asked: asyncio.Event, interval_s: float) -> None:
    """Reload the repository when asked (SIGHUP) or every `interval_s` (0: only when asked)."""
    while True:
        with contextlib.suppress(TimeoutError):  # the polling interval passed
            await asyncio.wait_for(asked.wait(), interval_s or None)
        asked.clear()
        try:
            await running.reload()
        except Exception:  # a reload never takes the server down; the old versions serve on
            log.exception("reload failed")


async def serve_front(settings: Settings, role: argparse.Namespace) -> None:
    """A front process: gRPC and HTTP for the supervisor's engines; its metrics on 127.0.0.1 (the
    supervisor's /metrics merges them), its final reading written at exit."""
    metrics = Metrics()
    name = f"front-{role.front_index}-{os.getpid()}"
    running = await create_server(
        settings, metrics=metrics, engines=role.channel.split(","), name=name, run_dir=role.run_dir
    )
    process_metrics = ProcessMetrics(metrics, role.run_dir, f"front-{role.front_index}")
    try:
        await run_until_stopped(running, settings)
    finally:
        process_metrics.close()
