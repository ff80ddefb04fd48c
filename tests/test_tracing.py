"""OpenTelemetry tracing (service/serve/tracing.py) with the SDK's in-memory exporter: a server span
per RPC over gRPC and HTTP that continues the caller's traceparent, queue / encode / decode children
with the batch at each step, model and length attributes, no text unless asked, the trace id in the log line."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from proto.translation.v1 import translation_pb2 as pb
from service.decode.engine.engine import Engine
from service.serve.config import TracingConfig, load_settings
from service.serve.request_trace import NO_TRACE
from service.serve.tracing import Tracing
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    base_args,
    bundle,
    engine,
    server,
    texts,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def traced(bundle: Path, engine: Engine) -> Iterator[ServerThread]:  # noqa: F811
    srv = ServerThread.start([*base_args(bundle), "--no-warmup", "--http-port", "0"], engine)
    yield srv
    srv.close()


@pytest.fixture
def spans(traced: ServerThread) -> Iterator[InMemorySpanExporter]:
    """The server's spans, kept in memory (a fresh exporter per test)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert traced.r.servicer is not None
    traced.r.servicer.use_tracing(Tracing(TracingConfig(tracing=True), provider))
    yield exporter
    traced.r.servicer.use_tracing(Tracing(TracingConfig(tracing=False)))


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def attrs(item: Any) -> dict[str, Any]:
    """A span's or an event's attributes, as a plain dict."""
    return dict(item.attributes or {})


def trace_hex(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def every_value(span: ReadableSpan) -> list[str]:
    """Every attribute and event attribute value of a span, as text."""
    values = [str(v) for v in (span.attributes or {}).values()]
    for event in span.events:
        values += [str(v) for v in (event.attributes or {}).values()]
    return [*values, span.name]


def translate_grpc(srv: ServerThread, lines: list[str], **kwargs: Any) -> pb.TranslateResponse:
    request = pb.TranslateRequest(
        texts=lines, options=pb.DecodingOptions(beam_size=3, n_best=1), **kwargs
    )
    return srv.stub.Translate(request, timeout=WAIT_S, metadata=(("traceparent", TRACEPARENT),))


def post_http(srv: ServerThread, body: dict[str, Any], headers: dict[str, str]) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{srv.r.http_port}/v1/Translate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
        return json.loads(answer.read())


def check_request_trace(
    exporter: InMemorySpanExporter, rpc_name: str, lines: list[str], answer: Any
) -> ReadableSpan:
    """The RPC span continues TRACEPARENT; queue, decode (and encode, when it ran) are its
    children; attributes carry the model and the lengths, never the texts."""
    spans = by_name(exporter)
    (rpc,) = spans[rpc_name]
    assert rpc.kind == SpanKind.SERVER
    assert trace_hex(rpc) == TRACE_ID
    assert rpc.parent is not None and format(rpc.parent.span_id, "016x") == PARENT_ID
    got = attrs(rpc)
    model = answer.model if hasattr(answer, "model") else answer["model"]
    version = answer.model_version if hasattr(answer, "model") else answer["model_version"]
    assert got["s2s.model.name"] == model and got["s2s.model.version"] == version
    assert got["s2s.texts"] == len(lines)
    assert got["s2s.input.chars"] == sum(len(t) for t in lines)
    assert got["s2s.input.tokens"] > 0 and got["s2s.output.tokens"] > 0
    assert got["rpc.method"] == "Translate" and got["rpc.grpc.status_code_name"] == "OK"
    (decode,) = spans["decode"]
    (queue,) = spans["queue"]
    children = [queue, decode, *spans.get("encode", [])]
    for child in children:
        assert child.parent is not None and child.parent.span_id == rpc.context.span_id
        assert trace_hex(child) == TRACE_ID
    steps = list(attrs(decode)["s2s.step.hypotheses"])
    assert steps and all(n >= 1 for n in steps)  # the batch at each step
    assert attrs(decode)["s2s.decode.steps"] == len(steps)
    assert attrs(decode)["s2s.admissions"] == len(lines)  # one per sentence
    if not attrs(decode)["s2s.encoded_ahead"]:
        assert spans.get("encode")  # the worker encoded them on admission
    assert queue.end_time is not None and decode.start_time is not None
    assert queue.end_time <= decode.start_time + 1_000_000  # queued, then decoded
    for span in [rpc, *children]:
        for text in lines:
            assert all(text not in value for value in every_value(span))
    return rpc


def test_a_grpc_request_continues_the_callers_trace(
    traced: ServerThread,
    spans: InMemorySpanExporter,
    texts: list[str],  # noqa: F811
) -> None:
    lines = texts[:2]
    answer = translate_grpc(traced, lines)
    check_request_trace(spans, "Translate", lines, answer)


def test_an_http_request_continues_the_callers_trace(
    traced: ServerThread,
    spans: InMemorySpanExporter,
    texts: list[str],  # noqa: F811
) -> None:
    lines = texts[2:4]
    body = {"texts": lines, "options": {"beam_size": 2}}
    answer = post_http(traced, body, {"Traceparent": TRACEPARENT})  # header names: any case
    rpc = check_request_trace(spans, "POST /v1/Translate", lines, answer)
    assert attrs(rpc)["s2s.protocol"] == "http"


def test_without_traceparent_a_request_starts_its_own_trace(
    traced: ServerThread,
    spans: InMemorySpanExporter,
    texts: list[str],  # noqa: F811
) -> None:
    traced.stub.Translate(pb.TranslateRequest(texts=texts[:1]), timeout=WAIT_S)
    (rpc,) = by_name(spans)["Translate"]
    assert rpc.parent is None and trace_hex(rpc) != TRACE_ID


def test_texts_only_with_trace_text(
    traced: ServerThread,
    texts: list[str],  # noqa: F811
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert traced.r.servicer is not None
    traced.r.servicer.use_tracing(Tracing(TracingConfig(tracing=True, trace_text=True), provider))
    try:
        answer = translate_grpc(traced, texts[:2])
    finally:
        traced.r.servicer.use_tracing(Tracing(TracingConfig()))
    (rpc,) = by_name(exporter)["Translate"]
    got = attrs(rpc)
    assert list(got["s2s.input.texts"]) == texts[:2]
    assert list(got["s2s.output.texts"]) == [t.hypotheses[0].text for t in answer.translations]


def test_a_refused_request_is_an_error_span_and_other_rpcs_have_spans(
    traced: ServerThread,
    spans: InMemorySpanExporter,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        traced.stub.Translate(
            pb.TranslateRequest(texts=["one"], options=pb.DecodingOptions(beam_size=2, n_best=5)),
            timeout=WAIT_S,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    traced.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=WAIT_S)
    found = by_name(spans)
    (rpc,) = found["Translate"]
    assert rpc.status.status_code == StatusCode.ERROR
    assert attrs(rpc)["rpc.grpc.status_code_name"] == "INVALID_ARGUMENT"
    assert "decode" not in found  # refused before queueing
    (info,) = found["GetModelInfo"]
    assert attrs(info)["rpc.method"] == "GetModelInfo"


def test_the_log_line_carries_the_trace_id(
    traced: ServerThread,
    spans: InMemorySpanExporter,
    texts: list[str],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="s2s.server"):
        translate_grpc(traced, texts[:1])
    done = [r for r in caplog.records if r.getMessage() == "request done"]
    assert [getattr(r, "trace_id", None) for r in done] == [TRACE_ID]


def test_tracing_is_off_by_default_and_set_by_flag_or_environment() -> None:
    assert load_settings([], environ={}).tracing == TracingConfig(False, False)
    assert load_settings(["--tracing"], environ={}).tracing.tracing
    env = load_settings([], environ={"S2S_TRACING": "true", "S2S_TRACE_TEXT": "1"}).tracing
    assert env == TracingConfig(True, True)
    off = Tracing(TracingConfig())
    assert not off.enabled
    with off.rpc("Translate", "grpc", {"traceparent": TRACEPARENT}) as trace:
        assert trace is NO_TRACE and trace.trace_id == ""


def test_the_flag_builds_the_sdks_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    on = Tracing(TracingConfig(tracing=True))
    assert on.enabled
    on.shutdown()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not Tracing(TracingConfig(tracing=True)).enabled
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="otlp"):
        Tracing(TracingConfig(tracing=True))


def test_untraced_servers_log_no_trace_id(
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="s2s.server"):
        server.stub.Translate(pb.TranslateRequest(texts=texts[:1]), timeout=WAIT_S)
    done = [r for r in caplog.records if r.getMessage() == "request done"]
    assert done and not any(hasattr(r, "trace_id") for r in done)


def test_a_sampled_out_request_records_nothing_and_answers(
    traced: ServerThread,
    texts: list[str],  # noqa: F811
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert traced.r.servicer is not None
    traced.r.servicer.use_tracing(Tracing(TracingConfig(tracing=True), provider))
    try:
        answer = traced.stub.Translate(pb.TranslateRequest(texts=texts[:1]), timeout=WAIT_S)
    finally:
        traced.r.servicer.use_tracing(Tracing(TracingConfig()))
    assert answer.translations[0].hypotheses
    assert exporter.get_finished_spans() == ()


def test_an_align_request_is_traced_like_translate(
    traced: ServerThread,
    spans: InMemorySpanExporter,
    texts: list[str],  # noqa: F811
) -> None:
    pairs = [
        pb.AlignPair(source=texts[0], target="un deux trois"),
        pb.AlignPair(source=texts[1], target="quatre"),
    ]
    answer = traced.stub.Align(
        pb.AlignRequest(pairs=pairs), timeout=WAIT_S, metadata=(("traceparent", TRACEPARENT),)
    )
    assert len(answer.alignments) == 2
    found = by_name(spans)
    (rpc,) = found["Align"]
    assert trace_hex(rpc) == TRACE_ID and rpc.kind == SpanKind.SERVER
    got = attrs(rpc)
    assert got["s2s.model.name"] == answer.model and got["s2s.pairs"] == 2
    assert got["rpc.method"] == "Align" and got["rpc.grpc.status_code_name"] == "OK"
    (queue,), (decode,) = found["queue"], found["decode"]
    for child in (queue, decode):
        assert child.parent is not None and child.parent.span_id == rpc.context.span_id
    for span in (rpc, queue, decode):
        assert all(texts[0] not in value for value in every_value(span))
