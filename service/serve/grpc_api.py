"""The gRPC face of the Translator API: its servicer over grpc.aio, and the registration of it.

The work is TranslatorCore's (service/serve/translator.py), shared with the HTTP/JSON face
(service/serve/http_api.py); the servicer adds the gRPC context: the request's deadline, the
client's cancellation, domain errors as status codes (service/serve/status.py), and a count of the
handlers running, which the stop waits on (service/serve/grpc_server.py). Translate's and Align's bytes
are parsed by service/serve/protocol.py, so a malformed request is answered INVALID_ARGUMENT by the
handler, counted and logged like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.shared.errors import ModelNotFound, NotReady
from service.serve.config import Settings
from service.serve.metrics import Metrics
from service.serve.protocol import (
    MAX_REQUEST_ID_CHARS,
    MalformedRequest,
    deserialize_align_request,
    deserialize_translate_request,
)
from service.serve.repository import ModelVersion
from service.serve.status import status_for
from service.serve.tracing import traced
from service.serve.translator import TranslatorCore

log = logging.getLogger("s2s.server")


ResponseT = TypeVar("ResponseT", pb.TranslateResponse, pb.AlignResponse)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name


# A client's deadline passes on the client's clock, which runs ahead of the server's view of the same
# deadline by the time the request took to arrive: its cancellation can reach the server while
# `time_remaining()` is still a little above 0. Within this margin it counts as a deadline.
DEADLINE_MARGIN_S = 0.25


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


def request_id_of(request: pb.TranslateRequest | pb.AlignRequest | MalformedRequest) -> str:
    """The request's id, one made where it has none; an over-long one cut for the log (the
    request is refused by parse_request)."""
    request_id = request.request_id or uuid.uuid4().hex[:16]
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        request_id = request_id[:MAX_REQUEST_ID_CHARS] + "..."
    return request_id


@dataclass
class Answering:
    """A decoding RPC in `TranslatorServicer.answering`: its id, and the model version it holds."""

    request_id: str
    model: ModelVersion | None = None


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

    async def TranslateStream(
        self, request: pb.TranslateRequest | MalformedRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TranslateStreamResponse]:
        """Translate, streamed (translator.py's translate_stream): counted, logged and its errors
        mapped as Translate's; a client that cancels cancels the sentences not yet decoded."""
        async with self.answering("TranslateStream", request, context, len(request.texts)) as rpc:
            rpc.model = self.acquire(request)
            remaining = context.time_remaining()
            messages = self.translate_stream(request, rpc.request_id, remaining, rpc.model)
            async for message in messages:
                yield message

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
        response = None
        async with self.answering(method, request, context, texts) as rpc:
            # held until answered: a reload does not unload it meanwhile
            rpc.model = self.acquire(request)
            response = await call(rpc.request_id, rpc.model)
        assert response is not None
        return response

    @contextlib.asynccontextmanager
    async def answering(
        self,
        method: str,
        request: pb.TranslateRequest | pb.AlignRequest | MalformedRequest,
        context: grpc.aio.ServicerContext,
        texts: int,
    ) -> AsyncIterator[Answering]:
        """The bookkeeping of a decoding RPC around its work (the `async with` body, which sets
        `model` once it holds one): counted in flight, the model released, the status code from
        the error (the body's exception is answered, not raised), logged and in the metrics, and
        the call aborted with that code unless OK. A cancellation is counted and raised on."""
        rpc = Answering(request_id_of(request))
        started = time.perf_counter()
        code, message = grpc.StatusCode.OK, ""
        error: Exception | None = None
        with self.handlers.track(), self.metrics.track_in_flight(method):
            try:
                yield rpc
            # the client cancelled or a deadline passed: the task is cancelled where it waits,
            # or, a stream's waiting at a `yield` for its next message to be asked for, the
            # stream is closed there (GeneratorExit)
            except (asyncio.CancelledError, GeneratorExit):
                code = cancel_code(context.time_remaining())
                self.finish(method, rpc.request_id, code, started, texts, model=rpc.model)
                raise
            except Exception as err:
                error = err
                code, message = status_for(err)
                if code == grpc.StatusCode.INTERNAL:
                    log.error("request failed", exc_info=err, extra={"request_id": rpc.request_id})
            finally:
                if rpc.model is not None:
                    self.repository.release(rpc.model)
        self.finish(method, rpc.request_id, code, started, texts, message, error, model=rpc.model)
        if code != grpc.StatusCode.OK:
            await context.abort(code, message)

    async def translate(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        context: grpc.aio.ServicerContext,
        model: ModelVersion,
    ) -> pb.TranslateResponse:
        return await self.translate_request(request, request_id, context.time_remaining(), model)

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
        "TranslateStream": grpc.unary_stream_rpc_method_handler(
            servicer.TranslateStream,
            request_deserializer=deserialize_translate_request,
            response_serializer=pb.TranslateStreamResponse.SerializeToString,
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
