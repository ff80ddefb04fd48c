"""Where a process serves its metrics: the single-process server on --metrics-host:--metrics-port,
and each process a supervisor started on 127.0.0.1, for the supervisor's /metrics to merge
(service/serve/pod_metrics.py).

A supervised process writes the port it bound to RUN/metrics/NAME.port, where the supervisor finds
it at scrape time, and its final reading to RUN/metrics/NAME.final when it stops, so that its
counters outlive it.
"""

from __future__ import annotations

from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import generate_latest

from service.serve.config import Settings
from service.serve.metrics import Metrics, start_metrics_http_server


def start_metrics_endpoint(settings: Settings, metrics: Metrics) -> tuple[WSGIServer, int]:
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


def stop_metrics_endpoint(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()  # release the port: shutdown() only ends the serving loop


class ProcessMetrics:
    """A supervised process's endpoint on 127.0.0.1 (any free port): the port written to
    RUN/metrics/NAME.port once it serves, the final reading to NAME.final by `close`."""

    def __init__(self, metrics: Metrics, run_dir: Path, name: str) -> None:
        self.metrics = metrics
        self.folder = run_dir / "metrics"
        self.name = name
        self.server, port = start_metrics_http_server(0, "127.0.0.1", metrics.registry)
        (self.folder / f"{name}.port").write_text(str(port))

    def close(self) -> None:
        """The final reading written, then the endpoint stopped (the supervisor keeps the final
        reading's counters once the process has exited)."""
        (self.folder / f"{self.name}.final").write_bytes(generate_latest(self.metrics.registry))
        self.server.shutdown()
