"""Tests for service/serve/metrics.py: values on an injected registry, the HTTP endpoint, promtool's lint."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from service.serve.metrics import (
    CODES,
    METHODS,
    PROTOCOLS,
    REJECT_REASONS,
    RESTART_WAIT_OUTCOMES,
    Metrics,
    start_metrics_http_server,
)

METRIC_NAMES = (
    "s2s_request_duration_seconds",
    "s2s_requests_in_flight",
    "s2s_queue_wait_seconds",
    "s2s_queue_depth_sentences",
    "s2s_running_sentences",
    "s2s_batch_sentences",
    "s2s_batch_hypotheses",
    "s2s_encoder_duration_seconds",
    "s2s_decoder_step_duration_seconds",
    "s2s_generated_tokens_total",
    "s2s_translated_sentences_total",
    "s2s_rejected_requests_total",
    "s2s_model_info",
    "s2s_restart_waits_total",
    "s2s_restart_wait_seconds",
)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def value(m: Metrics, sample: str, /, **labels: str) -> float | None:
    return m.registry.get_sample_value(sample, labels)


def record_some(m: Metrics) -> None:
    """A little traffic: two requests, one rejection, two decoder steps, one model."""
    m.observe_request("Translate", "OK", 0.02)
    m.observe_request("Translate", "INVALID_ARGUMENT", 0.001)
    m.reject("invalid_argument")
    m.observe_queue_wait(0.003)
    m.set_queue_depth(4)
    m.set_running(2)
    m.observe_encoder(0.002)
    m.observe_step(sentences=2, hypotheses=10, seconds=0.0015)
    m.observe_step(sentences=1, hypotheses=5, seconds=0.0009)
    m.add_generated(tokens=7, sentences=2)
    m.model_loaded("default", "1.0.0", "additive", "CPUExecutionProvider", 1 << 20)
    m.restart_waited("resumed", 2.5)


@pytest.fixture
def served(metrics: Metrics) -> Iterator[tuple[Metrics, str]]:
    """metrics recorded and served on a free port; yields (metrics, url)."""
    record_some(metrics)
    server, port = start_metrics_http_server(0, "127.0.0.1", metrics.registry)
    try:
        yield metrics, f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def test_request_duration_by_method_and_code(metrics: Metrics) -> None:
    metrics.observe_request("Translate", "OK", 0.02)
    metrics.observe_request("Translate", "OK", 0.2)
    name = "s2s_request_duration_seconds"
    assert value(metrics, f"{name}_count", method="Translate", code="OK", protocol="grpc") == 2
    assert value(
        metrics, f"{name}_sum", method="Translate", code="OK", protocol="grpc"
    ) == pytest.approx(0.22)
    assert (
        value(metrics, f"{name}_bucket", method="Translate", code="OK", protocol="grpc", le="0.025")
        == 1
    )
    assert (
        value(metrics, f"{name}_bucket", method="Translate", code="OK", protocol="grpc", le="30.0")
        == 2
    )


def test_declared_label_series_exist_at_zero(metrics: Metrics) -> None:
    for method in METHODS:
        assert value(metrics, "s2s_requests_in_flight", method=method) == 0
        for code in CODES:
            for protocol in PROTOCOLS:
                count = value(
                    metrics,
                    "s2s_request_duration_seconds_count",
                    method=method,
                    code=code,
                    protocol=protocol,
                )
                assert count == 0
    for reason in REJECT_REASONS:
        assert value(metrics, "s2s_rejected_requests_total", reason=reason) == 0
    for outcome in RESTART_WAIT_OUTCOMES:
        assert value(metrics, "s2s_restart_waits_total", outcome=outcome) == 0


def test_unknown_label_values_are_refused(metrics: Metrics) -> None:
    with pytest.raises(ValueError, match="method"):
        metrics.observe_request("Frobnicate", "OK", 0.1)
    with pytest.raises(ValueError, match="code"):
        metrics.observe_request("Translate", "ok", 0.1)
    with pytest.raises(ValueError, match="protocol"):
        metrics.observe_request("Translate", "OK", 0.1, protocol="smtp")
    with pytest.raises(ValueError, match="reason"):
        metrics.reject("because")
    with pytest.raises(ValueError, match="outcome"):
        metrics.restart_waited("answered", 1.0)


def test_restart_waits_by_outcome_and_their_time(metrics: Metrics) -> None:
    metrics.restart_waited("resumed", 2.5)
    metrics.restart_waited("deadline_exceeded", 0.5)
    metrics.restart_waited("queue_full")  # refused without waiting: no time observed
    assert value(metrics, "s2s_restart_waits_total", outcome="resumed") == 1
    assert value(metrics, "s2s_restart_waits_total", outcome="queue_full") == 1
    assert value(metrics, "s2s_restart_wait_seconds_count") == 2
    assert value(metrics, "s2s_restart_wait_seconds_sum") == 3.0
    assert value(metrics, "s2s_restart_wait_seconds_bucket", le="1.0") == 1


def test_in_flight_goes_up_inside_and_back_down_after_errors(metrics: Metrics) -> None:
    with metrics.track_in_flight("Translate"):
        with metrics.track_in_flight("Translate"):
            assert value(metrics, "s2s_requests_in_flight", method="Translate") == 2
        assert value(metrics, "s2s_requests_in_flight", method="GetModelInfo") == 0
    with pytest.raises(RuntimeError), metrics.track_in_flight("Translate"):
        raise RuntimeError("handler failed")
    assert value(metrics, "s2s_requests_in_flight", method="Translate") == 0


def test_queue_batch_and_model_call_metrics(metrics: Metrics) -> None:
    record_some(metrics)
    assert value(metrics, "s2s_queue_wait_seconds_count") == 1
    assert value(metrics, "s2s_queue_depth_sentences") == 4
    assert value(metrics, "s2s_running_sentences") == 2
    assert value(metrics, "s2s_encoder_duration_seconds_count") == 1
    assert value(metrics, "s2s_decoder_step_duration_seconds_count") == 2
    assert value(metrics, "s2s_decoder_step_duration_seconds_sum") == pytest.approx(0.0024)
    assert value(metrics, "s2s_batch_sentences_sum") == 3
    assert value(metrics, "s2s_batch_sentences_bucket", le="1.0") == 1
    assert value(metrics, "s2s_batch_hypotheses_sum") == 15
    assert value(metrics, "s2s_batch_hypotheses_bucket", le="8.0") == 1
    assert value(metrics, "s2s_batch_hypotheses_bucket", le="1024.0") == 2
    metrics.set_queue_depth(0)
    assert value(metrics, "s2s_queue_depth_sentences") == 0


def test_counters_accumulate(metrics: Metrics) -> None:
    metrics.add_generated(tokens=7, sentences=2)
    metrics.add_generated(tokens=3, sentences=1)
    metrics.reject("queue_full")
    metrics.reject("queue_full")
    assert value(metrics, "s2s_generated_tokens_total") == 10
    assert value(metrics, "s2s_translated_sentences_total") == 3
    assert value(metrics, "s2s_rejected_requests_total", reason="queue_full") == 2
    assert value(metrics, "s2s_rejected_requests_total", reason="cancelled") == 0


def test_model_info_holds_the_loaded_versions_and_drops_an_unloaded_one(metrics: Metrics) -> None:
    metrics.model_loaded("a", "1", "dot", "CPUExecutionProvider", 1 << 20)
    metrics.model_loaded("b", "2", "additive", "CUDAExecutionProvider", 1 << 20)
    a = {"name": "a", "version": "1", "attention": "dot", "provider": "CPUExecutionProvider"}
    b = {"name": "b", "version": "2", "attention": "additive", "provider": "CUDAExecutionProvider"}
    assert value(metrics, "s2s_model_info", **a) == 1
    assert value(metrics, "s2s_model_info", **b) == 1
    metrics.model_unloaded("a", "1")
    assert value(metrics, "s2s_model_info", **a) is None
    assert value(metrics, "s2s_model_info", **b) == 1


def test_instances_do_not_share_state() -> None:
    first, second = Metrics(), Metrics()
    first.add_generated(tokens=5, sentences=1)
    first.set_queue_depth(3)
    assert first.registry is not second.registry
    assert value(second, "s2s_generated_tokens_total") == 0
    assert value(second, "s2s_queue_depth_sentences") == 0


def test_uses_the_injected_registry() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.set_running(6)
    assert metrics.registry is registry
    assert registry.get_sample_value("s2s_running_sentences") == 6


def test_http_server_serves_the_metrics(served: tuple[Metrics, str]) -> None:
    _, url = served
    text = scrape(url)
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    assert "s2s_queue_depth_sentences 4.0" in text
    assert "python_gc_objects_collected_total" not in text  # only the injected registry


def test_promtool_accepts_a_real_scrape(served: tuple[Metrics, str]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        message = "promtool not on PATH (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run this check")
        pytest.skip(message)
    _, url = served
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape(url),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
