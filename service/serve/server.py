"""The gRPC server: translation.v1.Translator over grpc.aio, with health, reflection and metrics.

    s2s-serve --bundle models/default --port 50051 --metrics-port 9090
    s2s-serve --models /srv/models   # a repository: DIR/NAME/VERSION/ bundles, reloaded on SIGHUP

Protobuf stays at this edge: service/serve/protocol.py validates requests and converts them to plain
types, the worker decodes, and results are converted back; errors become status codes here
(service/serve/status.py); logs are JSON lines (service/serve/logs.py). Life cycle: NOT_SERVING while the model loads and
warms up, SERVING after; on SIGTERM NOT_SERVING again, new requests refused (the worker's intake
closed), accepted ones finished within the grace period.

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
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import generate_latest

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.engine import Engine
from service.decode.errors import ModelNotFound, NotReady
from service.decode.providers import require_provider
from service.serve.config import Settings, load_settings
from service.serve.engine_host import EngineHost, build_engine_host, run_engine_process
from service.serve.engine_link import EngineLink
from service.serve.http_api import HttpFace
from service.serve.logs import configure_logging
from service.serve.metrics import Metrics, start_metrics_http_server
from service.serve.mirror import Follower, shared_engines, text_sides
from service.serve.protocol import (
    MAX_REQUEST_ID_CHARS,
    MalformedRequest,
    deserialize_align_request,
    deserialize_translate_request,
)
from service.serve.repository import Events, ModelVersion, ReloadReport, Repository
from service.serve.status import status_for
from service.serve.supervisor import die_with_parent, layout, start_failure, supervise
from service.serve.tracing import traced
from service.serve.translator import TranslatorCore
from service.serve.worker import Worker

log = logging.getLogger("s2s.server")

ResponseT = TypeVar("ResponseT", pb.TranslateResponse, pb.AlignResponse)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name


# A client's deadline passes on the client's clock, which runs ahead of the server's view of the same
# deadline by the time the request took to arrive: its cancellation can reach the server while
# `time_remaining()` is still a little above 0. Within this margin it counts as a deadline.
DEADLINE_MARGIN_S = 0.25
# On stop, the gRPC server is shut once no Translate handler has run for this long: requests that
# reached gRPC core before the stop began have been handed to a handler by then.
QUIET_S = 0.3


def cancel_code(remaining: float | None) -> grpc.StatusCode:
    """The status of a handler cancelled by gRPC, from the time its deadline had left then."""
    if remaining is not None and remaining <= DEADLINE_MARGIN_S:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


class Handlers:
    """Counts the Translate handlers running, so a stop can wait until none has run for a while
    (gRPC core may still hold requests the server has not picked up: stopping it then would answer
    them CANCELLED, unlogged and uncounted)."""

    def __init__(self) -> None:
        self.active = 0
        self.last_ended = time.monotonic()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self.last_ended = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last handler ended; 0 while one runs."""
        return 0.0 if self.active else time.monotonic() - self.last_ended


# --- the servicer ------------------------------------------------------------------------------


class TranslatorServicer(TranslatorCore, pb_grpc.TranslatorServicer):
    """Registered before the server starts; answers UNAVAILABLE until `attach` gives it the model.

    The work is TranslatorCore's (service/serve/translator.py), shared with the HTTP face; this class
    adds the gRPC context: deadlines, cancellation, status codes, and counts its handlers for the
    stop."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        super().__init__(settings, metrics)
        self.handlers = Handlers()

    @traced("Translate")
    async def Translate(
        self, request: pb.TranslateRequest | MalformedRequest, context: grpc.aio.ServicerContext
    ) -> pb.TranslateResponse:
        async def call(request_id: str, model: ModelVersion) -> pb.TranslateResponse:
            return await self.translate(request, request_id, context, model)

        return await self.handle("Translate", request, context, len(request.texts), call)

    @traced("Align")
    async def Align(
        self, request: pb.AlignRequest | MalformedRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlignResponse:
        async def call(request_id: str, model: ModelVersion) -> pb.AlignResponse:
            return await self.align(request, request_id, context.time_remaining(), model)

        pairs = len(request.pairs) if isinstance(request, pb.AlignRequest) else 0
        return await self.handle("Align", request, context, pairs, call)

    async def handle(
        self,
        method: str,
        request: pb.TranslateRequest | pb.AlignRequest | MalformedRequest,
        context: grpc.aio.ServicerContext,
        texts: int,
        call: Callable[[str, ModelVersion], Awaitable[ResponseT]],
    ) -> ResponseT:
        """A decoding RPC: its model version held until answered, `call(request_id, model)`, and
        its status code, log line and metrics (`texts`: the texts or pairs it holds)."""
        request_id = request.request_id or uuid.uuid4().hex[:16]
        if len(request_id) > MAX_REQUEST_ID_CHARS:  # refused by parse_request: not logged whole
            request_id = request_id[:MAX_REQUEST_ID_CHARS] + "..."
        started = time.perf_counter()
        code, message, response = grpc.StatusCode.OK, "", None
        error: Exception | None = None
        model: ModelVersion | None = None
        with self.handlers.track(), self.metrics.track_in_flight(method):
            try:
                # held until answered: a reload does not unload it meanwhile
                model = self.acquire(request)
                response = await call(request_id, model)
            except asyncio.CancelledError:  # the client cancelled or a deadline passed
                code = cancel_code(context.time_remaining())
                self.finish(method, request_id, code, started, texts, model=model)
                raise
            except Exception as err:
                error = err
                code, message = status_for(err)
                if code == grpc.StatusCode.INTERNAL:
                    log.error("request failed", exc_info=err, extra={"request_id": request_id})
            finally:
                if model is not None:
                    self.repository.release(model)
        self.finish(method, request_id, code, started, texts, message, error, model=model)
        if code != grpc.StatusCode.OK:
            await context.abort(code, message)
        assert response is not None
        return response

    async def translate(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        context: grpc.aio.ServicerContext,
        model: ModelVersion,
    ) -> pb.TranslateResponse:
        return await self.decode(request, request_id, context.time_remaining(), model)

    @traced("GetModelInfo")
    async def GetModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        started = time.perf_counter()
        with self.metrics.track_in_flight("GetModelInfo"):
            try:
                info = self.model_info(request.model)
            except (NotReady, ModelNotFound) as err:
                code, message = status_for(err)
                self.finish("GetModelInfo", "", code, started, 0, message, err)
                await context.abort(code, message)
        self.finish("GetModelInfo", "", grpc.StatusCode.OK, started, 0)
        return info

    @traced("ListModels")
    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        started = time.perf_counter()
        with self.metrics.track_in_flight("ListModels"):
            try:
                response = self.list_models()
            except NotReady as err:
                code, message = status_for(err)
                self.finish("ListModels", "", code, started, 0, message, err)
                await context.abort(code, message)
        self.finish("ListModels", "", grpc.StatusCode.OK, started, 0)
        return response


def add_translator_servicer(servicer: TranslatorServicer, server: grpc.aio.Server) -> None:
    """As the generated `add_TranslatorServicer_to_server`, with Translate's bytes parsed by
    `deserialize_translate_request`."""
    handlers = {
        "Translate": grpc.unary_unary_rpc_method_handler(
            servicer.Translate,
            request_deserializer=deserialize_translate_request,
            response_serializer=pb.TranslateResponse.SerializeToString,
        ),
        "Align": grpc.unary_unary_rpc_method_handler(
            servicer.Align,
            request_deserializer=deserialize_align_request,
            response_serializer=pb.AlignResponse.SerializeToString,
        ),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetModelInfo,
            request_deserializer=pb.ModelInfoRequest.FromString,
            response_serializer=pb.ModelInfo.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=pb.ListModelsRequest.FromString,
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


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
    metrics_http: Any = None
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
    def engine(self) -> Engine:
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
            self.metrics_http.shutdown()
            self.metrics_http.server_close()  # release the port: shutdown() only ends the serving loop
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


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    s = settings.server
    if not s.tls_cert:
        return None
    with open(s.tls_key, "rb") as f:
        key = f.read()
    with open(s.tls_cert, "rb") as f:
        cert = f.read()
    client_ca = read_client_ca(s.tls_client_ca) if s.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=bool(client_ca)
    )


def read_client_ca(path: str) -> bytes:
    """The client CA bundle, refused by name when it holds no PEM certificate: grpc would only
    fail to bind, and the message would blame the (valid) server certificate and key."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise OSError(err.errno, f"cannot read the TLS client CA {path}: {err.strerror}") from err
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError(
            f"TLS client CA {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----')"
        )
    return data


def start_metrics_endpoint(settings: Settings, metrics: Metrics) -> tuple[Any, int]:
    """The Prometheus endpoint; a port in use is named, with what to do about it."""
    host, port = settings.server.metrics_host, settings.server.metrics_port
    try:
        return start_metrics_http_server(port, host, metrics.registry)
    except OSError as err:
        raise OSError(
            err.errno,
            f"cannot serve metrics on {host}:{port}: {err.strerror} "
            "(choose another --metrics-port, 0 for any free port, or -1 to disable metrics)",
        ) from err


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
    address = f"{settings.server.host}:{settings.server.port}"
    credentials = server_credentials(settings)
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials
            else server.add_insecure_port(address)
        )
    except RuntimeError as err:  # grpc says "Failed to bind" for a bad key or certificate too
        if not credentials:
            raise
        s = settings.server
        ca = f", and {s.tls_client_ca} PEM CA certificates" if s.tls_client_ca else ""
        raise RuntimeError(
            f"{err} (or the TLS files are wrong: {s.tls_cert} and {s.tls_key} must be a PEM "
            f"certificate and its private key{ca})"
        ) from err
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
    require_provider(settings.runtime.require_provider, settings.runtime.device_id)
    metrics = metrics or Metrics()
    loop = asyncio.get_running_loop()
    host: EngineHost | None = None
    link: EngineLink | None = None
    faces: Faces | None = None
    try:
        if engines is None:
            faces = await start_front(settings, metrics)
            host = await loop.run_in_executor(
                None, start_engine_half, settings, metrics, engine, faces.servicer
            )
            follower = Follower(
                Repository.of(events=FrontEvents(metrics)),
                settings,
                partial(shared_engines, host.repository),
            )
            engines = [host.endpoint.address]
        else:
            follower = Follower(
                Repository.of(events=FrontEvents(metrics)), settings, partial(text_sides, settings)
            )
        repository = follower.repository
        repository.default_name = settings.server.default_model
        changed = asyncio.Event()
        link = EngineLink(
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
        await link.start()
        while not link.serving():
            await asyncio.sleep(0.005)
        if faces is None:
            faces = await start_front(settings, metrics, reuse_port=True)
        faces.servicer.attach(repository, link)
        running = Running(
            faces.server,
            faces.port,
            faces.health,
            metrics,
            settings,
            repository,
            faces.servicer,
            link,
            host,
            http=faces.http,
        )
        running.health_task = loop.create_task(follow_health(running, changed))
        if settings.server.metrics_port >= 0 and host is not None:
            running.metrics_http, running.metrics_port = start_metrics_endpoint(settings, metrics)
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
                "engines": len(engines),
                "front": name,
            },
        )
    except BaseException:  # a bad bundle, a failed warm-up: release the port before raising
        if faces is not None:
            if faces.http is not None:
                await faces.http.stop()
            await faces.server.stop(None)
        if link is not None:
            await link.stop()
        if host is not None:
            await loop.run_in_executor(None, host.stop, 0.0)
        raise
    return running


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


def split_role(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The supervisor's flags for the processes it starts (not settings: no S2S_ variable)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--role", choices=("front", "engine"))
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--channel", default="")
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument("--front-index", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0)
    return parser.parse_known_args(argv)


async def serve_front(settings: Settings, role: argparse.Namespace) -> None:
    """A front process: gRPC and HTTP for the supervisor's engines; its metrics on 127.0.0.1 (the
    supervisor's /metrics merges them), its final reading written at exit."""
    metrics = Metrics()
    name = f"front-{role.front_index}-{os.getpid()}"
    running = await create_server(
        settings, metrics=metrics, engines=role.channel.split(","), name=name, run_dir=role.run_dir
    )
    server, port = start_metrics_http_server(0, "127.0.0.1", metrics.registry)
    label = f"front-{role.front_index}"
    (role.run_dir / "metrics" / f"{label}.port").write_text(str(port))
    try:
        await run_until_stopped(running, settings)
    finally:
        (role.run_dir / "metrics" / f"{label}.final").write_bytes(generate_latest(metrics.registry))
        server.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """s2s-serve: the single-process server (--fronts 0, or one core), else the supervisor and its
    engine and front processes (service/serve/supervisor.py); and those processes themselves."""
    role, rest = split_role(sys.argv[1:] if argv is None else argv)
    if role.role is not None:
        die_with_parent(role.parent)
    try:
        settings = load_settings(rest)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.server.log_level, settings.server.log_format)
    try:
        if role.role == "engine":
            return run_engine_process(
                settings, role.channel, f"engine-{role.engine_index}", role.run_dir,
                role.engine_index,
            )  # fmt: skip
        if role.role == "front":
            asyncio.run(serve_front(settings, role))
            return 0
        fronts, engines = layout(settings)
        if fronts > 0:
            return supervise(settings, rest, fronts, engines)
        asyncio.run(serve(settings))
    except Exception as err:  # a bad bundle, a busy port: one clear line, not a traceback
        log.critical("cannot start: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
