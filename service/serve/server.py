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

import asyncio
import contextlib
import logging
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.engine import Engine
from service.decode.errors import ModelNotFound, NotReady
from service.decode.providers import require_provider
from service.model.embedded import resolve_bundle, resolve_repository
from service.serve import glossary_files, memory_files
from service.serve.config import Settings, VersionPolicy, load_settings
from service.serve.http_api import HttpFace
from service.serve.logs import configure_logging
from service.serve.metrics import Metrics, start_metrics_http_server
from service.serve.protocol import (
    MAX_REQUEST_ID_CHARS,
    MalformedRequest,
    deserialize_align_request,
    deserialize_translate_request,
)
from service.serve.repository import Events, ModelVersion, ReloadReport, Repository, single
from service.serve.status import status_for
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
    """A started server and what it owns."""

    server: grpc.aio.Server
    port: int
    worker: Worker
    health: health.aio.HealthServicer
    engine: Engine  # the default model's, at start
    metrics: Metrics
    settings: Settings
    repository: Repository
    servicer: TranslatorServicer | None = None
    metrics_port: int | None = None
    metrics_http: Any = None
    health_names: set[str] = field(default_factory=set)  # per-model names set so far
    http: HttpFace | None = (
        None  # the HTTP/JSON face (service/serve/http_api.py), when --http-port >= 0
    )

    @property
    def http_port(self) -> int | None:
        return None if self.http is None else self.http.port

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        await self.set_model_health()

    async def set_model_health(self) -> None:
        """SERVING for each model with a loaded version, NOT_SERVING for models gone since."""
        served = {model_health_name(name) for name in self.repository.names()}
        for name in sorted(served | self.health_names):
            await self.health.set(
                name,
                health_pb2.HealthCheckResponse.SERVING
                if name in served
                else health_pb2.HealthCheckResponse.NOT_SERVING,
            )
        self.health_names |= served

    async def reload(self) -> ReloadReport:
        """Reload the repository off the event loop (loads and warm-ups are slow), then health."""
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(None, self.repository.reload)
        engines = [m.engine for m in self.repository.loaded()]
        await loop.run_in_executor(
            None, memory_files.refresh, engines, self.settings.server.memory_dir
        )
        await loop.run_in_executor(
            None, glossary_files.refresh, engines, self.settings.server.glossary_dir
        )
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
        UNAVAILABLE, logged and counted, since the worker's intake is closed): stopping it at once
        would have gRPC core answer CANCELLED the requests that reached it but no handler yet, and
        cancel at the end of the grace the ones it did hand over. It stops once no handler has run
        for QUIET_S, with what is left of the grace for the answers still being sent."""
        grace = self.settings.server.grace_s if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.health.enter_graceful_shutdown()
        self.worker.close_intake()
        if self.servicer is not None:
            while loop.time() < deadline and self.servicer.handlers.idle_for() < QUIET_S:
                await asyncio.sleep(0.02)
        remaining = max(0.0, deadline - loop.time())
        if self.http is not None:  # stops listening, then waits for its answers in progress
            await asyncio.gather(self.http.stop(), self.server.stop(remaining))
        else:
            await self.server.stop(remaining)
        await loop.run_in_executor(None, self.worker.stop, 5.0)
        if self.metrics_http is not None:
            self.metrics_http.shutdown()
            self.metrics_http.server_close()  # release the port: shutdown() only ends the serving loop
        if self.servicer is not None:  # export the spans still buffered
            await loop.run_in_executor(None, self.servicer.tracing.shutdown)


def model_health_name(name: str) -> str:
    """The grpc.health.v1 service name of one model."""
    return f"{SERVICE_NAME}/{name}"


class MetricEvents(Events):
    """Repository events → metrics (per-version series come and go with the versions)."""

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


def build_repository(settings: Settings, metrics: Metrics) -> Repository:
    """The repository the settings name: one bundle (--bundle) or a folder (--models). Each
    version is loaded and, unless --no-warmup, warmed up before it takes requests."""
    s = settings.server

    def load(path: Path) -> Engine:
        engine = Engine.load(path, settings.runtime, settings.limits)
        memory_files.attach(engine, s.memory_dir)  # a file that does not parse refuses it
        glossary_files.attach(engine, s.glossary_dir)
        if s.warmup:
            warm_up(engine)
        return engine

    return Repository(
        resolve_bundle(s.bundle) if s.bundle else resolve_repository(s.models),
        load,
        VersionPolicy(s.version_policy, s.pinned_versions),
        s.default_model,
        MetricEvents(metrics),
        single=bool(s.bundle),
    )


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


async def create_server(
    settings: Settings, engine: Engine | None = None, metrics: Metrics | None = None
) -> Running:
    """Load (unless given) and warm the model, bind the port, start everything; port 0 picks a free one.

    With --require-provider, a provider that did not load stops it here, before any port is bound."""
    require_provider(settings.runtime.require_provider, settings.runtime.device_id)
    metrics = metrics or Metrics()
    health_servicer = health.aio.HealthServicer()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.server.max_message_bytes),
            ("grpc.max_send_message_length", settings.server.max_message_bytes),
            ("grpc.so_reuseport", 0),
            *connection_age_options(settings.server.max_connection_age_s),
        ]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
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
            http = HttpFace(servicer, status_for)
            await http.start()
        loop = asyncio.get_running_loop()
        if engine is None:
            repository = build_repository(settings, metrics)
            await loop.run_in_executor(None, repository.load_all)
        else:
            if settings.server.warmup:
                await loop.run_in_executor(None, warm_up, engine)
            repository = Repository.of(single(engine))
            MetricEvents(metrics).loaded(repository.get())
        default = repository.get()
        worker = Worker(default.engine, settings.batching, metrics)
        servicer.attach(repository, worker)
        running = Running(
            server,
            port,
            worker,
            health_servicer,
            default.engine,
            metrics,
            settings,
            repository,
            servicer,
            http=http,
        )
        if settings.server.metrics_port >= 0:
            running.metrics_http, running.metrics_port = start_metrics_endpoint(settings, metrics)
        worker.start()
        await running.set_serving(True)
        log.info(
            "serving",
            extra={
                "port": port,
                "metrics_port": running.metrics_port,
                "http_port": running.http_port,
                "model": repository.default(),
                "models": [str(m) for m in repository.loaded()],
                "providers": default.engine.model.providers,
            },
        )
    except BaseException:  # a bad bundle, a failed warm-up: release the port before raising
        if http is not None:
            await http.stop()
        await server.stop(None)
        raise
    return running


def warm_up(engine: Engine) -> None:
    """Decode once at several batch shapes so the first real request pays no first-run costs."""
    engine.warm_up()


async def serve(settings: Settings) -> None:
    running = await create_server(settings)
    stop = asyncio.Event()
    reload = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    reloader = asyncio.create_task(reload_loop(running, reload, settings.server.reload_interval_s))
    await stop.wait()
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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.server.log_level, settings.server.log_format)
    try:
        asyncio.run(serve(settings))
    except Exception as err:  # a bad bundle, a busy port: one clear line, not a traceback
        log.critical("cannot start: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
