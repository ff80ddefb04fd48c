"""Every Prometheus metric the server exports, built on an injected registry.

Names follow Prometheus conventions (base unit seconds, `_total` on counters); every label set is
bounded and declared up front (METHODS, CODES, REJECT_REASONS), and each labelled series is created
at zero when `Metrics` is built, so dashboards see it before the first event. The per-model series
(`s2s_model_*`, labelled model and version) are bounded by the loaded versions: created when a
version loads, removed when it is unloaded. The call sites use the
small typed methods below, never the prometheus_client objects. `start_metrics_http_server` serves
the registry, and only it, on its own port.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from service.decode.runtime.transfers import DIRECTIONS, REASONS, TransferLedger

# --- bounded label values ---------------------------------------------------------------------

METHODS: tuple[str, ...] = ("Translate", "GetModelInfo", "ListModels", "Align", "TranslateStream")
CODES: tuple[str, ...] = (  # gRPC status names, as grpc.StatusCode.X.name
    "OK",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "CANCELLED",
    "UNAVAILABLE",
    "INTERNAL",
)
PROTOCOLS: tuple[str, ...] = (
    "grpc",
    "http",
)  # the face a request came in by (service/serve/http_api.py)
REJECT_REASONS: tuple[str, ...] = (
    "invalid_argument",
    "not_found",
    "queue_full",
    "deadline_exceeded",
    "cancelled",
    "shutting_down",
    "not_ready",
    "engine_unavailable",
    "internal",
)

ROLES: tuple[str, ...] = (
    "engine",
    "front",
)  # the processes of a server (service/serve/supervisor.py)
# how the wait of a request for its engine's restart ended (service/serve/engine_link.py)
RESTART_WAIT_OUTCOMES: tuple[str, ...] = (
    "resumed",  # the engine back, the request was sent to it
    "deadline_exceeded",
    "engine_unavailable",  # it failed to start again, or was not back within the longest wait
    "queue_full",  # refused at once: the waiting requests fill the queue's bound
    "cancelled",
    "shutting_down",
)

# --- buckets ----------------------------------------------------------------------------------

# fmt: off
REQUEST_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                           10.0, 30.0)
QUEUE_WAIT_SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                              0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                        0.5, 1.0)
# fmt: on
BATCH_SENTENCES_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RESTART_WAIT_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
BATCH_HYPOTHESES_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _check_label(kind: str, value: str, allowed: Sequence[str]) -> str:
    """value if it is one of the declared label values, else ValueError (keeps label sets bounded)."""
    if value not in allowed:
        raise ValueError(f"{kind} label must be one of {tuple(allowed)}, got {value!r}")
    return value


class TransferCollector(Collector):
    """The models' transfer ledgers as two counters, read at scrape time (the decode loop only adds
    to its ledger: no Prometheus call on the hot path). Every (direction, reason) series exists from
    the start, at zero."""

    def __init__(self) -> None:
        self.ledgers: list[TransferLedger] = []

    def collect(self) -> Iterable[CounterMetricFamily]:
        labels = ["direction", "reason"]
        moved = CounterMetricFamily(
            "s2s_device_transfer_bytes",
            "Bytes copied between host memory and the model's device, by direction and reason.",
            labels=labels,
        )
        copies = CounterMetricFamily(
            "s2s_device_transfers",
            "Copies between host memory and the model's device, by direction and reason.",
            labels=labels,
        )
        snapshots = [ledger.snapshot() for ledger in self.ledgers]
        for direction in DIRECTIONS:
            for reason in REASONS:
                key = (direction, reason)
                moved.add_metric([direction, reason], sum(s.bytes[key] for s in snapshots))
                copies.add_metric([direction, reason], sum(s.copies[key] for s in snapshots))
        yield moved
        yield copies


class Metrics:
    """The server's metrics on `registry` (a fresh CollectorRegistry when None, never the global one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(
            registry=r
        )  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        # requests
        self.request_duration = Histogram(
            "s2s_request_duration_seconds",
            "Time to answer one RPC, by method, gRPC status code and protocol (grpc or http).",
            ["method", "code", "protocol"],
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=r,
        )
        self.first_chunk = Histogram(
            "s2s_stream_first_chunk_seconds",
            "TranslateStream: time from the request to its first message (a sentence final, or "
            "the whole answer), by model.",
            ["model"],
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "s2s_requests_in_flight", "RPCs being handled now.", ["method"], registry=r
        )
        self.rejected = Counter(
            "s2s_rejected_requests_total",
            "Requests refused or abandoned before a full answer, by reason.",
            ["reason"],
            registry=r,
        )
        # queue and batch
        self.queue_wait = Histogram(
            "s2s_queue_wait_seconds",
            "Time a sentence waits from arrival until it joins a decoding batch.",
            buckets=QUEUE_WAIT_SECONDS_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "s2s_queue_depth_sentences", "Sentences waiting to join a decoding batch.", registry=r
        )
        self.running = Gauge("s2s_running_sentences", "Sentences being decoded now.", registry=r)
        self.batch_sentences = Histogram(
            "s2s_batch_sentences",
            "Sentences advanced by one decoder step.",
            buckets=BATCH_SENTENCES_BUCKETS,
            registry=r,
        )
        self.batch_hypotheses = Histogram(
            "s2s_batch_hypotheses",
            "Hypotheses (sentences x beam) advanced by one decoder step.",
            buckets=BATCH_HYPOTHESES_BUCKETS,
            registry=r,
        )
        # model calls
        self.encoder_duration = Histogram(
            "s2s_encoder_duration_seconds",
            "Time to encode a group of sentences (ahead of admission or when joining a batch), in length-bucketed encoder calls.",
            buckets=STEP_SECONDS_BUCKETS,
            registry=r,
        )
        self.decoder_step_duration = Histogram(
            "s2s_decoder_step_duration_seconds",
            "Time of one decoder step over the running batch.",
            buckets=STEP_SECONDS_BUCKETS,
            registry=r,
        )
        # output
        self.generated_tokens = Counter(
            "s2s_generated_tokens_total", "Target tokens generated (best hypotheses).", registry=r
        )
        self.translated_sentences = Counter(
            "s2s_translated_sentences_total", "Sentences translated to the end.", registry=r
        )
        self.low_confidence = Counter(
            "s2s_low_confidence_translations_total",
            "Translations answered whose best hypothesis is below the confidence threshold "
            "(--min-confidence or the bundle's).",
            registry=r,
        )
        self.memory = Counter(
            "s2s_memory_lookups",
            "Texts looked up in a model's memory before decoding (docs/memory.md), by result: "
            "hit (answered from the memory) or miss.",
            ["model", "result"],
            registry=r,
        )
        self.model_info = Gauge(
            "s2s_model_info",
            "The served model; always 1.",
            ["name", "version", "attention", "provider"],
            registry=r,
        )
        # device transfers (s2s_device_transfer_bytes_total, s2s_device_transfers_total)
        self.transfers = TransferCollector()
        r.register(self.transfers)
        # per model version (series exist while the version is loaded)
        mv = ["model", "version"]
        self.model_requests = Counter(
            "s2s_model_requests_total",
            "Translate RPCs answered, by model, version and gRPC status code.",
            [*mv, "code"],
            registry=r,
        )
        self.model_request_duration = Histogram(
            "s2s_model_request_duration_seconds",
            "Time to answer one Translate RPC, by model and version.",
            mv,
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=r,
        )
        self.model_queue_depth = Gauge(
            "s2s_model_queue_depth_sentences",
            "Sentences waiting to join a decoding batch, by model and version.",
            mv,
            registry=r,
        )
        self.model_running = Gauge(
            "s2s_model_running_sentences",
            "Sentences being decoded now, by model and version.",
            mv,
            registry=r,
        )
        self.model_steps = Counter(
            "s2s_model_decoder_steps_total", "Decoder steps, by model and version.", mv, registry=r
        )
        self.model_hypothesis_steps = Counter(
            "s2s_model_hypothesis_steps_total",
            "Hypotheses advanced by decoder steps (the decode work done), by model and version.",
            mv,
            registry=r,
        )
        self.model_resident_memory = Gauge(
            "s2s_model_resident_memory_bytes",
            "Growth of the process's resident memory while the version loaded and warmed up.",
            mv,
            registry=r,
        )
        self.model_load_failures = Counter(
            "s2s_model_load_failures_total",
            "Model versions refused at a (re)load: broken bundle, failed warm-up.",
            ["model"],
            registry=r,
        )
        self.model_reloads = Counter(
            "s2s_model_reloads_total", "Repository reloads (SIGHUP or polling).", registry=r
        )
        # processes (the supervisor counts; every process exports the series, at zero here, so
        # that the merged /metrics and a single-process server have it alike)
        self.process_restarts = Counter(
            "s2s_process_restarts",
            "Front and engine processes started again after they exited or hung, by role.",
            ["role"],
            registry=r,
        )
        for role in ROLES:
            self.process_restarts.labels(role)
        self.restart_waits = Counter(
            "s2s_restart_waits",
            "Requests that came while their engine process was down and being started again, by "
            "how their wait ended: resumed (sent to the engine once back), deadline_exceeded, "
            "engine_unavailable (it failed to start again, or was not back within "
            "--engine-restart-wait-s), queue_full (refused: the waiting requests fill the queue's "
            "bound), cancelled, shutting_down.",
            ["outcome"],
            registry=r,
        )
        self.restart_wait = Histogram(
            "s2s_restart_wait_seconds",
            "Time a request waited for its engine process to be started again (every outcome but "
            "queue_full).",
            buckets=RESTART_WAIT_SECONDS_BUCKETS,
            registry=r,
        )
        self._model_series: dict[tuple[str, str], set[str]] = {}  # version → its codes seen
        self._create_labelled_series()

    def _create_labelled_series(self) -> None:
        """Create every declared label combination at zero."""
        for method in METHODS:
            self.in_flight.labels(method=method)
            for code in CODES:
                for protocol in PROTOCOLS:
                    self.request_duration.labels(method=method, code=code, protocol=protocol)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        for outcome in RESTART_WAIT_OUTCOMES:
            self.restart_waits.labels(outcome=outcome)

    # --- requests -----------------------------------------------------------------------------

    def observe_request(
        self, method: str, code: str, seconds: float, protocol: str = "grpc"
    ) -> None:
        """One finished RPC: its method, gRPC status name (e.g. "OK"), duration in seconds, and the
        protocol it came by (an HTTP request is counted under the gRPC code it was mapped from)."""
        self.request_duration.labels(
            method=_check_label("method", method, METHODS),
            code=_check_label("code", code, CODES),
            protocol=_check_label("protocol", protocol, PROTOCOLS),
        ).observe(seconds)

    def observe_first_chunk(self, seconds: float, model: str) -> None:
        """A TranslateStream's first message sent, `seconds` after its request arrived."""
        self.first_chunk.labels(model=model).observe(seconds)

    @contextmanager
    def track_in_flight(self, method: str) -> Iterator[None]:
        """Count the RPC as in flight for the duration of the `with` block."""
        gauge = self.in_flight.labels(method=_check_label("method", method, METHODS))
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def reject(self, reason: str) -> None:
        """One request refused or abandoned, for a reason in REJECT_REASONS."""
        self.rejected.labels(reason=_check_label("reason", reason, REJECT_REASONS)).inc()

    def restart_waited(self, outcome: str, seconds: float | None = None) -> None:
        """A request's wait for its engine's restart ended (RESTART_WAIT_OUTCOMES), after
        `seconds` (None: it was refused without waiting)."""
        self.restart_waits.labels(
            outcome=_check_label("outcome", outcome, RESTART_WAIT_OUTCOMES)
        ).inc()
        if seconds is not None:
            self.restart_wait.observe(seconds)

    # --- queue and batch ----------------------------------------------------------------------

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def set_queue_depth(self, sentences: int) -> None:
        self.queue_depth.set(sentences)

    def set_running(self, sentences: int) -> None:
        self.running.set(sentences)

    def observe_step(self, sentences: int, hypotheses: int, seconds: float) -> None:
        """One decoder step over `sentences` sentences holding `hypotheses` beams, taking `seconds`."""
        self.batch_sentences.observe(sentences)
        self.batch_hypotheses.observe(hypotheses)
        self.decoder_step_duration.observe(seconds)

    def observe_encoder(self, seconds: float) -> None:
        self.encoder_duration.observe(seconds)

    def watch_transfers(self, ledger: TransferLedger) -> None:
        """Export a model's transfer ledger (added to any watched before; each ledger counted once)."""
        if all(ledger is not watched for watched in self.transfers.ledgers):
            self.transfers.ledgers.append(ledger)

    # --- output -------------------------------------------------------------------------------

    def add_generated(self, tokens: int, sentences: int) -> None:
        """Count `tokens` generated target tokens over `sentences` finished sentences."""
        self.generated_tokens.inc(tokens)
        self.translated_sentences.inc(sentences)

    def memory_lookups(self, model: str, hits: int, misses: int) -> None:
        """Count a request's memory lookups (s2s_memory_lookups_total{model, result})."""
        if hits:
            self.memory.labels(model=model, result="hit").inc(hits)
        if misses:
            self.memory.labels(model=model, result="miss").inc(misses)

    def add_low_confidence(self, translations: int) -> None:
        """Count answered translations marked low_confidence (their best hypothesis)."""
        if translations:
            self.low_confidence.inc(translations)

    # --- per model version ----------------------------------------------------------------------

    def model_loaded(
        self, name: str, version: str, attention: str, provider: str, resident_bytes: int
    ) -> None:
        """A version loaded by the engine: its info series, memory gauge and zeroed decode
        counters (the requests' series are the front's: `model_served`)."""
        self.model_info.labels(
            name=name, version=version, attention=attention, provider=provider
        ).set(1)
        self.model_resident_memory.labels(name, version).set(resident_bytes)
        self.model_queue_depth.labels(name, version).set(0)
        self.model_running.labels(name, version).set(0)
        self.model_steps.labels(name, version)
        self.model_hypothesis_steps.labels(name, version)
        self.model_load_failures.labels(name)

    def model_served(self, name: str, version: str) -> None:
        """A version a front serves: its request series, zeroed."""
        self.model_request_duration.labels(name, version)
        for code in CODES:  # every code's series from the start, as s2s_request_duration_seconds
            self.model_requests.labels(name, version, code)
        self.model_load_failures.labels(name)
        self._model_series.setdefault((name, version), set()).update(CODES)

    def model_unloaded(self, name: str, version: str) -> None:
        """A version the engine unloaded: every decode series labelled with it goes (label sets
        stay bounded)."""
        for labels in list(self.model_info._metrics):  # (name, version, attention, provider)
            if labels[:2] == (name, version):
                self.model_info.remove(*labels)
        for metric in (
            self.model_queue_depth,
            self.model_running,
            self.model_steps,
            self.model_hypothesis_steps,
            self.model_resident_memory,
        ):
            with suppress(KeyError):  # a series never created (e.g. no queue seen)
                metric.remove(name, version)

    def model_unserved(self, name: str, version: str) -> None:
        """A version a front no longer serves: its request series go."""
        with suppress(KeyError):
            self.model_request_duration.remove(name, version)
        for code in self._model_series.pop((name, version), set()):
            self.model_requests.remove(name, version, code)

    def model_load_failed(self, name: str) -> None:
        self.model_load_failures.labels(name).inc()

    def reloaded(self) -> None:
        self.model_reloads.inc()

    def observe_model_request(self, name: str, version: str, code: str, seconds: float) -> None:
        """One Translate RPC answered by a model version (code: a gRPC status name)."""
        self.model_requests.labels(name, version, _check_label("code", code, CODES)).inc()
        self._model_series.setdefault((name, version), set()).add(code)
        self.model_request_duration.labels(name, version).observe(seconds)

    def set_model_queue_depth(self, name: str, version: str, sentences: int) -> None:
        self.model_queue_depth.labels(name, version).set(sentences)

    def set_model_running(self, running: dict[tuple[str, str], int]) -> None:
        """Sentences decoding per (model, version); versions not named are set to 0."""
        for labels in list(self.model_running._metrics):
            if labels not in running:
                self.model_running.labels(*labels).set(0)
        for (name, version), n in running.items():
            self.model_running.labels(name, version).set(n)

    def observe_model_step(self, name: str, version: str, hypotheses: int) -> None:
        self.model_steps.labels(name, version).inc()
        self.model_hypothesis_steps.labels(name, version).inc(hypotheses)


def start_metrics_http_server(
    port: int, host: str, registry: CollectorRegistry
) -> tuple[WSGIServer, int]:
    """Serve `registry` in the Prometheus text format over HTTP from a daemon thread.

    Only this registry's metrics are served (not the process-wide default registry, no other
    endpoints). Port 0 picks a free port; the returned port is the one actually bound. Stop with
    `server.shutdown()` then `server.server_close()`.
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_address[1])
