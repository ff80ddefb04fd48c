"""Per-request tracing with OpenTelemetry: a span per RPC, continuing the caller's W3C traceparent.

Off by default (`--tracing` / S2S_TRACING=true turns it on); the standard OTEL_* variables configure
the rest: OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (OTLP over gRPC,
default localhost:4317), OTEL_SERVICE_NAME (default "s2s-serve"), OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER(_ARG), OTEL_PROPAGATORS, OTEL_SDK_DISABLED; OTEL_TRACES_EXPORTER=console prints
the spans instead (for a look without a collector).

What a request's trace holds (docs/tracing.md):
- the RPC's server span ("Translate"; over HTTP "POST /v1/Translate"), a child of the caller's span
  when the request carries `traceparent` (gRPC metadata or HTTP header), with the model's name and
  version, the number of texts, input characters and source tokens, output tokens, the request id
  and the status code as attributes;
- child spans "queue" (submitted → its first sentence admitted into a running batch), "encode" (the
  encoder call that read its sentences, when the worker encoded them on admission rather than the
  encode-ahead thread) and "decode" (admitted → answered), the decode span with the number of
  decoder steps, their milliseconds, and the batch at each step (s2s.step.hypotheses: the
  hypotheses of every sentence in the decoder call, this request's and the others').
The texts themselves are never recorded unless `--trace-text` asks.

Each face opens the span with one wrapper: `@traced("Translate")` on a gRPC handler,
`tracing.rpc(...)` around an HTTP route. The request's `RequestTrace` is the context variable
`current_trace()` meanwhile, so the transport-neutral core and the log line (its `trace_id`) reach it
without new parameters, and the worker reaches it through the job. With tracing off every call is a
no-op on NO_TRACE.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from service.serve.config import TracingConfig
from service.serve.request_trace import NO_TRACE, RequestTrace, active

try:  # the `tracing` extra (the image installs it): OTLP over gRPC
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
except ImportError:  # pragma: no cover - without the extra, --tracing says what to install
    OTLPSpanExporter = None  # type: ignore[assignment,misc]

SERVICE_NAME = "s2s-serve"
RPC_SERVICE = "translation.v1.Translator"
MAX_STEPS_KEPT = 1024  # per-step batch sizes kept on one decode span


class TracingUnavailable(RuntimeError):
    """--tracing was asked for without the OTLP exporter installed."""


class SpanTrace(RequestTrace):
    """A recording RequestTrace: the RPC span, its "queue", "encode" and "decode" children. Called
    from the event loop and the worker thread; the children's state is guarded by a lock.

    Per-step figures are kept as one integer array on the decode span (s2s.step.hypotheses), not as
    an event per step: the OTLP exporter encodes in Python, and events made tracing cost about four
    times as much per request (measured: docs/tracing.md)."""

    def __init__(self, tracer: trace.Tracer, span: Span, trace_text: bool) -> None:
        self.tracer = tracer
        self.span = span
        self.recording = span.is_recording()  # False: the sampler dropped it (ids only)
        self.trace_text = trace_text
        self.trace_id = format(span.get_span_context().trace_id, "032x")
        self.context = trace.set_span_in_context(span)
        self.lock = threading.Lock()
        self.queued_ns: int | None = None
        self.decode: Span | None = None
        self.admissions = 0
        self.hypotheses: list[int] = []  # the decoder call's hypotheses at each step
        self.steps = 0
        self.step_s = 0.0

    def set(self, **attributes: Any) -> None:
        if self.recording:
            self.span.set_attributes(
                {"s2s." + k.replace("_", "."): v for k, v in attributes.items() if v is not None}
            )

    def texts(self, key: str, texts: Sequence[str]) -> None:
        if self.trace_text and self.recording:
            self.span.set_attribute("s2s." + key, list(texts))

    def finish(self, code: str, message: str = "") -> None:
        self.span.set_attribute("rpc.grpc.status_code_name", code)
        if code != "OK":
            self.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"))

    def child(self, name: str, start_ns: int | None = None) -> Span:
        return self.tracer.start_span(name, context=self.context, start_time=start_ns)

    def queued(self) -> None:
        if self.recording:
            self.queued_ns = time.time_ns()

    def admitted(self, queue_wait_s: float, batch_sentences: int, encoded_ahead: bool) -> None:
        if not self.recording:
            return
        with self.lock:
            self.admissions += 1
            if self.decode is not None:  # a later sentence of the same request
                return
            now = time.time_ns()
            if self.queued_ns is not None:
                queue = self.child("queue", self.queued_ns)
                queue.set_attribute("s2s.queue.wait_ms", round(queue_wait_s * 1000, 3))
                queue.end(now)
            self.decode = self.child("decode", now)
            self.decode.set_attributes(
                {"s2s.admitted.sentences": batch_sentences, "s2s.encoded_ahead": encoded_ahead}
            )

    def encoded(self, start_ns: int, end_ns: int, sentences: int) -> None:
        if self.recording:
            span = self.child("encode", start_ns)
            span.set_attribute("s2s.batch.sentences", sentences)
            span.end(end_ns)

    def step(self, sentences: int, hypotheses: int, seconds: float) -> None:
        with self.lock:
            if self.decode is None:
                return
            if self.steps < MAX_STEPS_KEPT:
                self.hypotheses.append(hypotheses)
            self.steps += 1
            self.step_s += seconds

    def decoded(self, error: Exception | None) -> None:
        with self.lock:
            decode, self.decode = self.decode, None
            if decode is None:
                return
            decode.set_attributes(
                {
                    "s2s.decode.steps": self.steps,
                    "s2s.decode.step_ms": round(self.step_s * 1000, 3),
                    "s2s.step.hypotheses": self.hypotheses,
                    "s2s.admissions": self.admissions,
                }
            )
            if error is not None:
                decode.set_status(Status(StatusCode.ERROR, type(error).__name__))
            decode.end()

    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=self.context)
        return carrier


class RemoteTrace(SpanTrace):
    """An engine process's part of a request's trace: its "queue", "encode" and "decode" spans,
    children of the front process's RPC span, whose context came over the channel."""

    def __init__(self, tracer: trace.Tracer, carrier: Mapping[str, str]) -> None:
        parent = trace.get_current_span(propagate.extract(dict(carrier)))
        super().__init__(tracer, parent, False)
        self.recording = parent.get_span_context().trace_flags.sampled


class Tracing:
    """The server's tracer: `rpc(...)` opens a request's span (or yields NO_TRACE when off)."""

    def __init__(self, config: TracingConfig, provider: TracerProvider | None = None) -> None:
        self.config = config
        self.provider = provider
        if config.tracing and provider is None and not sdk_disabled():
            self.provider = default_provider()
        self.tracer = None if self.provider is None else self.provider.get_tracer("s2s.serve")

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @contextlib.contextmanager
    def rpc(
        self,
        method: str,
        protocol: str,
        carrier: Mapping[str, str] | None = None,
        http_method: str = "",
        path: str = "",
    ) -> Iterator[RequestTrace]:
        """A server span for one RPC, child of the carrier's traceparent, current meanwhile."""
        if self.tracer is None:
            yield NO_TRACE
            return
        name = f"{http_method} {path}" if protocol == "http" else method
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            "rpc.service": RPC_SERVICE,
            "rpc.method": method,
            "s2s.protocol": protocol,
        }
        if protocol == "http":
            attributes |= {"http.request.method": http_method, "url.path": path}
        span = self.tracer.start_span(
            name,
            context=propagate.extract({k.lower(): v for k, v in (carrier or {}).items()}),
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        request = SpanTrace(self.tracer, span, self.config.trace_text)
        try:
            with active(request):
                yield request
        finally:
            request.decoded(None)  # children a cancelled request left open
            span.end()

    def remote(self, carrier: Mapping[str, str]) -> RequestTrace:
        """The engine's part of the trace whose context `carrier` holds (NO_TRACE when off)."""
        if self.tracer is None or not carrier:
            return NO_TRACE
        return RemoteTrace(self.tracer, carrier)

    def shutdown(self) -> None:
        """Export what is buffered (on stop)."""
        if self.provider is not None:
            self.provider.shutdown()


def sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def default_provider() -> TracerProvider:
    """The SDK's provider with the exporter OTEL_TRACES_EXPORTER names: otlp (default) or console;
    the sampler and resource from the OTEL_* variables, as the SDK reads them."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE_NAME)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter_from_env()))
    return provider


def exporter_from_env() -> SpanExporter:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r}: this server exports 'otlp' or 'console'")
    if OTLPSpanExporter is None:
        raise TracingUnavailable(
            "--tracing needs the OTLP exporter: pip install 'seq2seq-serve[tracing]' "
            "(or opentelemetry-exporter-otlp-proto-grpc)"
        )
    return OTLPSpanExporter()


# --- the gRPC handlers' wrapper -------------------------------------------------------------------

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


class HasTracing(Protocol):
    tracing: Tracing


Handler = Callable[[Any, RequestT, Any], Awaitable[ResponseT]]


def traced(method: str) -> Callable[[Handler[RequestT, ResponseT]], Handler[RequestT, ResponseT]]:
    """Decorate a gRPC servicer handler (self, request, context): its RPC runs in a server span
    that continues the traceparent of the call's metadata."""

    def wrap(handler: Handler[RequestT, ResponseT]) -> Handler[RequestT, ResponseT]:
        @functools.wraps(handler)
        async def run(self: HasTracing, request: RequestT, context: Any) -> ResponseT:
            if not self.tracing.enabled:
                return await handler(self, request, context)
            metadata = {
                k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)
            }
            with self.tracing.rpc(method, "grpc", metadata):
                return await handler(self, request, context)

        return run

    return wrap
