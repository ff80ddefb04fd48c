"""The HTTP/JSON face of the Translator API, and the attention explorer page, on the gRPC loop.

    curl -s localhost:8080/v1/Translate -H 'Content-Type: application/json' \
         -d '{"texts": ["one two"], "options": {"alignment": "ALIGNMENT_MODE_WORD"}}'

aiohttp serves it on the same asyncio loop as grpc.aio, on a port of its own (--http-port). Bodies
are the API's protobuf messages in the proto3 JSON mapping, read and written by protobuf's own
json_format (unknown fields refused), so the JSON face cannot drift from the .proto. Each request
goes through the servicer's transport-neutral core (service/serve/translator.py), with the gRPC face's
limits, deadline handling, metrics (protocol="http") and error mapping: a domain error becomes its
gRPC code (service/serve/status.py's `status_for`), and that code its HTTP status (HTTP_STATUS), with a
body {"code": "INVALID_ARGUMENT", "message": "..."}. A deadline comes from `?timeout=<seconds>` or
the `X-Timeout` header. Routes are one table (ROUTES): adding an RPC is one entry.

With --ui, / serves the explorer (service/serve/ui/: static files, no CDN, no build step) under a strict
Content-Security-Policy. Browsers from other origins get no access unless --http-cors-origins
names them, and POST bodies must be application/json, which a cross-origin page cannot send
without a CORS preflight that is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from proto.translation.v1 import translation_pb2 as pb
from service.decode.shared.errors import InvalidInput
from service.serve.config import Settings
from service.serve.protocol import MAX_REQUEST_ID_CHARS
from service.serve.repository import ModelVersion
from service.serve.tls import ssl_context
from service.serve.translator import TranslatorCore

log = logging.getLogger("s2s.http")

UI_DIR = Path(__file__).resolve().parent / "ui"
API_PREFIX = "/v1/"
TIMEOUT_HEADER = "X-Timeout"

# The standard gRPC → HTTP table (as grpc-gateway's); CANCELLED is nginx's 499 "client closed".
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}

# The page may load only its own files and call only this origin: model output shown with
# textContent can never run, and this header stops any injected markup from running scripts too.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

StatusFor = Callable[[Exception], tuple[grpc.StatusCode, str]]


def request_id_of(request: Any) -> str:
    """The request's id, or one made up; a longer one than the limit (refused later) is cut
    for the logs."""
    request_id = str(request.request_id or uuid.uuid4().hex[:16])
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        request_id = request_id[:MAX_REQUEST_ID_CHARS] + "..."
    return request_id


@dataclass
class HttpRpc:
    """One HTTP call as `HttpFace.answering` keeps it: what the body learned, how it ended."""

    request_id: str = ""
    texts: int = 0
    model: ModelVersion | None = None
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    error: Exception | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id} if self.request_id else {}

    @property
    def body(self) -> str:
        """The error's JSON: {"code", "message"}."""
        return json.dumps({"code": self.code.name, "message": self.message})

    def error_response(self) -> web.Response:
        """The error as a JSON answer with its HTTP status (a bad body's own: 413, 415)."""
        error = self.error
        status = (
            error.http_status if isinstance(error, BadBody) else HTTP_STATUS.get(self.code, 500)
        )
        return web.Response(
            text=self.body, status=status, content_type="application/json", headers=self.headers
        )


class BadBody(InvalidInput):
    """A body that is not the route's message; `http_status` refines the 400 (413, 415)."""

    def __init__(self, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.http_status = http_status


# --- routes ---------------------------------------------------------------------------------


async def translate(
    core: TranslatorCore,
    request: Any,
    request_id: str,
    remaining: float | None,
    model: ModelVersion | None,
) -> Message:
    assert model is not None  # Route.holds_model: acquired by HttpFace.call
    return await core.translate_request(request, request_id, remaining, model)


async def align(
    core: TranslatorCore,
    request: Any,
    request_id: str,
    remaining: float | None,
    model: ModelVersion | None,
) -> Message:
    assert model is not None  # Route.holds_model: acquired by HttpFace.call
    return await core.align(request, request_id, remaining, model)


async def get_model_info(
    core: TranslatorCore,
    request: Any,
    request_id: str,
    remaining: float | None,
    model: ModelVersion | None,
) -> Message:
    return core.model_info(request.model)


async def list_models(
    core: TranslatorCore,
    request: Any,
    request_id: str,
    remaining: float | None,
    model: ModelVersion | None,
) -> Message:
    return core.list_models()


RouteCall = Callable[
    ["TranslatorCore", Any, str, float | None, ModelVersion | None], Awaitable[Message]
]


@dataclass(frozen=True)
class Route:
    """One RPC over HTTP: POST (or GET, without a body) /v1/<method>."""

    method: str  # the RPC's name: the path and the metrics' method label
    request: type[Message]  # the body, in the proto3 JSON mapping
    call: RouteCall
    verbs: tuple[str, ...] = ("POST",)
    has_id: bool = False  # the request carries request_id (one is generated when empty)
    holds_model: bool = False  # the request's model version is held until it is answered
    texts: Callable[[Any], int] = field(default=lambda _request: 0)  # logged


ROUTES: tuple[Route, ...] = (
    Route(
        "Translate",
        pb.TranslateRequest,
        translate,
        has_id=True,
        holds_model=True,
        texts=lambda request: len(request.texts),
    ),
    Route(
        "Align",
        pb.AlignRequest,
        align,
        has_id=True,
        holds_model=True,
        texts=lambda request: len(request.pairs),
    ),
    Route("GetModelInfo", pb.ModelInfoRequest, get_model_info, verbs=("GET", "POST")),
    Route("ListModels", pb.ListModelsRequest, list_models, verbs=("GET", "POST")),
)


# --- parsing --------------------------------------------------------------------------------


async def read_message(route: Route, request: web.Request, limit: int) -> Message:
    """The body as the route's message; BadBody says what is wrong with it."""
    name = route.request.DESCRIPTOR.full_name
    if request.content_length is not None and request.content_length > limit:
        raise BadBody(too_large(request.content_length, limit), 413)
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge as err:  # a chunked body that grew past the limit
        raise BadBody(too_large(None, limit), 413) from err
    message = route.request()
    if not data.strip():
        return message  # an empty body is the empty message (GET, or POST without options)
    if request.content_type != "application/json":
        raise BadBody(
            f"the body must be JSON with Content-Type: application/json, got {request.content_type!r}",
            415,
        )
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadBody(f"the body is not valid JSON: {err}") from err
    if not isinstance(body, dict):
        raise BadBody(f"the body must be a JSON object (a {name}), got {type(body).__name__}")
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as err:
        raise BadBody(f"the body is not a valid {name} in the proto3 JSON mapping: {err}") from err
    return message


def too_large(size: int | None, limit: int) -> str:
    got = "the body is" if size is None else f"the body is {size} bytes,"
    return (
        f"{got} over the server's message limit of {limit} bytes: send fewer or shorter texts "
        "in each request"
    )


def timeout_of(request: web.Request) -> float | None:
    """The client's deadline in seconds from now: ?timeout=, else the X-Timeout header."""
    raw = request.query.get("timeout", request.headers.get(TIMEOUT_HEADER))
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadBody(f"timeout must be a positive number of seconds, got {raw!r}")
    return seconds


def to_json(message: Message) -> str:
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=None,
    )


# --- the face -------------------------------------------------------------------------------


class HttpFace:
    """The aiohttp application and its site; `start` binds the port, `stop` drains and closes."""

    def __init__(
        self, core: TranslatorCore, status_for: StatusFor, reuse_port: bool = False
    ) -> None:
        """reuse_port: the front processes of one server share the port (SO_REUSEPORT)."""
        self.core = core
        self.reuse_port = reuse_port
        self.status_for = status_for
        self.settings: Settings = core.settings
        server = self.settings.server
        # aiohttp refuses bodies over client_max_size itself; read_message words the answer.
        self.app = web.Application(
            client_max_size=server.max_message_bytes, middlewares=[self.headers]
        )
        for route in ROUTES:
            for verb in route.verbs:
                self.app.router.add_route(verb, API_PREFIX + route.method, self.handler(route))
        self.app.router.add_post(API_PREFIX + "TranslateStream", self.stream)
        if server.ui:
            self.app.router.add_get("/", self.index)
            self.app.router.add_static("/ui/", UI_DIR, show_index=False)
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    def handler(self, route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            with self.core.tracing.rpc(
                route.method, "http", request.headers, request.method, request.path
            ):
                return await self.call(route, request)

        return handle

    @contextlib.asynccontextmanager
    async def answering(self, method: str) -> AsyncIterator[HttpRpc]:
        """The bookkeeping of an HTTP call around its work (the `async with` body, which fills
        in its request id, texts and model): counted in flight, the model released, the status
        from the error (the body's exception is answered, not raised; a passed deadline is
        DEADLINE_EXCEEDED), logged and in the metrics. A client that went away is counted
        CANCELLED and raised on."""
        rpc, started = HttpRpc(), time.perf_counter()
        with self.core.metrics.track_in_flight(method):
            try:
                yield rpc
            except TimeoutError:
                rpc.code = grpc.StatusCode.DEADLINE_EXCEEDED
                rpc.message = "the deadline passed before the request was answered"
            except asyncio.CancelledError:  # the client went away
                self.core.finish(method, rpc.request_id, grpc.StatusCode.CANCELLED, started,
                                 rpc.texts, protocol="http", model=rpc.model)  # fmt: skip
                raise
            except Exception as err:
                rpc.error = err
                rpc.code, rpc.message = self.status_for(err)
                if rpc.code == grpc.StatusCode.INTERNAL:
                    log.error("request failed", exc_info=err, extra={"request_id": rpc.request_id})
            finally:
                if rpc.model is not None:
                    self.core.release(rpc.model)
        self.core.finish(method, rpc.request_id, rpc.code, started, rpc.texts, rpc.message,
                         rpc.error, protocol="http", model=rpc.model)  # fmt: skip

    async def call(self, route: Route, http_request: web.Request) -> web.Response:
        response: Message | None = None
        async with self.answering(route.method) as rpc:
            request = await read_message(route, http_request, self.limit)
            if route.has_id:
                rpc.request_id = request_id_of(request)
            rpc.texts = route.texts(request)
            remaining = timeout_of(http_request)
            if route.holds_model:
                rpc.model = self.core.acquire(request)
            work = route.call(self.core, request, rpc.request_id, remaining, rpc.model)
            response = await (work if remaining is None else asyncio.wait_for(work, remaining))
        if response is None:
            return rpc.error_response()
        return web.Response(
            text=to_json(response), content_type="application/json", headers=rpc.headers
        )

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        """POST /v1/TranslateStream: TranslateStream as server-sent events, one `data:` line of
        a TranslateStreamResponse (proto3 JSON) per message, the last one the whole answer. A
        request refused before its first message gets Translate's JSON error and status; an error
        after it, an `event: error` with {"code", "message"}. A client that goes away cancels
        the sentences not yet decoded."""
        response: web.StreamResponse | None = None
        async with self.answering("TranslateStream") as rpc:
            request = await read_message(ROUTES[0], http_request, self.limit)
            rpc.request_id = request_id_of(request)
            rpc.texts = len(request.texts)  # type: ignore[attr-defined]
            remaining = timeout_of(http_request)
            rpc.model = self.core.acquire(request)
            async with asyncio.timeout(remaining):
                messages = self.core.translate_stream(request, rpc.request_id, remaining, rpc.model)
                async for out in messages:
                    if response is None:
                        response = await self.begin_events(http_request, rpc.request_id)
                    await response.write(f"data: {to_json(out)}\n\n".encode())
        if response is None:
            return rpc.error_response()
        if rpc.code != grpc.StatusCode.OK:
            await response.write(f"event: error\ndata: {rpc.body}\n\n".encode())
        await response.write_eof()
        return response

    async def begin_events(self, http_request: web.Request, request_id: str) -> web.StreamResponse:
        """An event stream's response, its headers sent."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Request-Id": request_id}
        )
        self.add_headers(http_request, response)
        await response.prepare(http_request)
        return response

    @property
    def limit(self) -> int:
        return self.settings.server.max_message_bytes

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(UI_DIR / "index.html")

    @web.middleware
    async def headers(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """CORS for the configured origins only; no-sniff and the page's CSP on every answer."""
        origin = request.headers.get("Origin")
        allowed = origin is not None and origin in self.settings.server.http_cors_origins
        if request.method == "OPTIONS":  # a CORS preflight
            if not allowed:
                return web.json_response(
                    {
                        "code": "PERMISSION_DENIED",
                        "message": f"origin {origin!r} may not call this API: "
                        "the server allows the origins given by --http-cors-origins only",
                    },
                    status=403,
                )
            response: web.StreamResponse = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = "GET, POST"
            response.headers["Access-Control-Allow-Headers"] = f"Content-Type, {TIMEOUT_HEADER}"
            response.headers["Access-Control-Max-Age"] = "600"
        else:
            try:
                response = await handler(request)
            except web.HTTPException as err:  # 404, 405: JSON like the API's own errors
                response = web.json_response(
                    {
                        "code": "NOT_FOUND" if err.status == 404 else "UNIMPLEMENTED",
                        "message": f"{err.reason}: {request.method} {request.path}; the API is "
                        + ", ".join(f"{'/'.join(r.verbs)} {API_PREFIX}{r.method}" for r in ROUTES),
                    },
                    status=err.status,
                )
        if not response.prepared:  # a stream (`stream`) set its headers before it began
            self.add_headers(request, response)
        return response

    def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """The headers of every answer: CORS for the configured origins, no-sniff, the CSP."""
        origin = request.headers.get("Origin")
        if origin is not None and origin in self.settings.server.http_cors_origins:
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Access-Control-Expose-Headers"] = "X-Request-Id"
        response.headers["Vary"] = "Origin"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-cache"

    async def start(self) -> int:
        """Bind host:http_port (0 picks a free one), with the gRPC server's TLS files if set."""
        server = self.settings.server
        self.runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=max(server.grace_s, 0.1)
        )
        await self.runner.setup()
        site = web.TCPSite(
            self.runner,
            server.host,
            server.http_port,
            ssl_context=ssl_context(self.settings),
            reuse_port=self.reuse_port,
        )
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop listening, let answers in progress finish (up to the grace period), close."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
