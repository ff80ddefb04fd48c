"""The transport-neutral core of the Translator API: protobuf request in, protobuf response out.

Both faces call it, the gRPC servicer (service/server.py) and the HTTP/JSON one (service/http_api.py),
so both validate, decode and limit requests the same way. It raises only the domain errors of
service/errors.py; each face maps them to its own status codes and counts them in the metrics.
"""

from __future__ import annotations

import asyncio

from proto.translation.v1 import translation_pb2 as pb
from service.config import Settings
from service.engine import Engine, Translation
from service.errors import InvalidInput, NotReady
from service.metrics import Metrics
from service.protocol import (
    MalformedRequest,
    check_response_bound,
    model_info,
    parse_request,
    translation_to_pb,
)
from service.worker import Job, Worker


class TranslatorCore:
    """Built before the server starts; raises NotReady until `attach` gives it the model."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._engine: Engine | None = None
        self._worker: Worker | None = None

    def attach(self, engine: Engine, worker: Worker) -> None:
        self._engine, self._worker = engine, worker

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise NotReady("the model is still loading: retry in a few seconds")
        return self._engine

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            raise NotReady("the model is still loading: retry in a few seconds")
        return self._worker

    async def decode(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        remaining: float | None,
    ) -> pb.TranslateResponse:
        """Validate, queue on the worker, wait, convert; `remaining` is the client's deadline in
        seconds from now (None: no deadline). Cancelling the awaiting task cancels the job."""
        if isinstance(request, MalformedRequest):
            raise InvalidInput(
                f"the request is not a valid {pb.TranslateRequest.DESCRIPTOR.full_name}: {request.error}"
            )
        parsed = parse_request(request, self.settings)
        self.engine.check_options(parsed.options, parsed.alignment)
        prepared = []
        for i, text in enumerate(parsed.texts):
            try:
                prepared.append(self.engine.prepare(text))
            except InvalidInput as err:
                raise InvalidInput(f"texts[{i}]: {err}") from err
        check_response_bound(
            [len(p.ids) for p in prepared],
            parsed.options,
            parsed.alignment,
            self.engine.max_piece_bytes,
            self.settings.server.max_message_bytes,
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Translation]] = loop.create_future()

        def on_done(results: list[Translation] | None, error: Exception | None) -> None:
            loop.call_soon_threadsafe(resolve, future, results, error)

        deadline = None if remaining is None else self.worker.clock() + remaining
        job = Job(request_id, prepared, parsed.options, parsed.alignment, on_done, deadline)
        self.worker.submit(job)
        try:
            results = await future
        except asyncio.CancelledError:
            self.worker.cancel(job)
            raise
        response = pb.TranslateResponse(
            translations=[translation_to_pb(t) for t in results],
            request_id=request_id,
            model_version=self.engine.bundle.version,
        )
        size, limit = response.ByteSize(), self.settings.server.max_message_bytes
        if size > limit:  # grpc would refuse to send it, after the metrics counted it OK
            raise InvalidInput(
                f"the response would be {size} bytes, over the server's message limit of {limit}: "
                "send fewer texts, or ask for a smaller n_best or no alignment"
            )
        return response

    def model_info(self) -> pb.ModelInfo:
        return model_info(self.engine, self.settings)


def resolve(
    future: asyncio.Future[list[Translation]],
    results: list[Translation] | None,
    error: Exception | None,
) -> None:
    if future.done():  # the request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results or [])
