"""What the load-test commands share (loadtest/run.py, loadtest/soak.py): a local server started
and stopped, locust run headless, its CSV statistics read back, /metrics scraped, exit statuses."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import workload

REPO = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
CSV_PREFIX = "locust"
AGGREGATED = "Aggregated"

EXIT_OK, EXIT_SLO, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


class RunFailed(Exception):
    """The run could not be made (not an SLO miss): exit status 3."""


# --- durations ---------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_duration(text: str) -> float:
    """'30s', '5m', '1h30m', '90' (seconds) -> seconds."""
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"cannot read duration {text!r}: use e.g. 30s, 5m, 1h30m or seconds")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


# --- the server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_serving(target: str, timeout: float = 2.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class LocalServer:
    process: subprocess.Popen[bytes]
    target: str
    metrics_url: str
    log: Path

    @classmethod
    def start(
        cls,
        bundle: str,
        policy: str,
        out: Path,
        ready_timeout_s: float,
        models: str = "",
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> LocalServer:
        """Serve one bundle, or with `models` a model repository folder (service/serve/repository.py);
        `extra`: more server flags; `env`: the server's environment (default: this process's);
        `cwd`: the checkout whose server runs (default: this one; a benchmark's baseline is another)."""
        port, metrics_port = free_port(), free_port()
        log = out / "server.log"
        source = ["--models", models] if models else ["--bundle", bundle]
        command = [
            sys.executable, "-m", "service.serve.server", *source, "--policy", policy,
            "--host", "127.0.0.1", "--port", str(port),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), *extra,
        ]  # fmt: skip
        with open(log, "wb") as f:
            process = subprocess.Popen(
                command, cwd=cwd or REPO, stdout=f, stderr=subprocess.STDOUT, env=env
            )
        server = cls(process, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log)
        deadline = time.monotonic() + ready_timeout_s
        while not is_serving(server.target):
            if process.poll() is not None:
                raise RunFailed(f"the server exited with status {process.returncode}: {tail(log)}")
            if time.monotonic() > deadline:
                server.stop()
                raise RunFailed(
                    f"the server was not SERVING after {ready_timeout_s:.0f} s: {tail(log)}"
                )
            time.sleep(0.25)
        return server

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful: finishes accepted requests), SIGKILL after `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def tail(path: Path, lines: int = 5) -> str:
    """The log's last ERROR/CRITICAL JSON message when it has one, else its last lines."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in reversed(text):
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("level") in ("ERROR", "CRITICAL"):
                return str(entry.get("message", line))
    return " | ".join(text[-lines:])


def server_info(target: str) -> dict[str, Any]:
    """What the server says it serves (model, version, providers, batching policy); {} if it cannot."""
    import grpc

    from service.cli.client import TranslatorClient

    try:
        with TranslatorClient(target, timeout=10.0) as client:
            info = client.model_info()
    except (grpc.RpcError, ValueError) as err:
        print(f"warning: no model info from {target}: {err}", file=sys.stderr)
        return {}
    keys = ("name", "version", "execution_providers", "scheduling_policy")
    return {k: info[k] for k in keys if k in info}


def scrape(url: str | None, path: Path) -> str | None:
    """GET the metrics page and save it; None (with a note) when it cannot be read."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text: str = reply.read().decode("utf-8")
    except OSError as err:
        print(f"warning: cannot scrape {url}: {err}", file=sys.stderr)
        return None
    path.write_text(text, encoding="utf-8")
    return text


# --- locust ------------------------------------------------------------------------------------

USERS_PER_PROCESS = 8
MAX_PROCESSES = 4


def default_processes(users: int) -> int:
    """Locust worker processes for `users`: one per 8 users, 1 to 4.

    All users of one locust process share one gevent loop, and gRPC completions wait their turn in
    it: with 32 users in one process, short requests measured ~2x slower by locust than by an
    independent client at the same moment (p50 140 vs 48 ms under iteration-level batching), which
    hides exactly the latency differences the report is about. Split over 4 processes, locust's
    figures came back in line with that client's.
    """
    return max(1, min(MAX_PROCESSES, users // USERS_PER_PROCESS))


def run_locust(args: argparse.Namespace, target: str, out: Path) -> None:
    stop_timeout = math.ceil(args.timeout_s) + 1  # users finish the call in flight at the end
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(args.users), "-r", f"{args.spawn_rate:g}", "-t", f"{math.ceil(args.duration_s)}s",
        "--host", target, "--stop-timeout", f"{stop_timeout}s",
        "--csv", str(out / CSV_PREFIX), "--html", str(out / "report.html"),
        "--only-summary", "--exit-code-on-error", "0",
    ]  # fmt: skip
    if args.processes > 1:
        command += ["--processes", str(args.processes)]
    env = dict(os.environ)
    env.update(
        {
            workload.ENV_TARGET: target,
            workload.ENV_MIX: args.mix,
            workload.ENV_ALIGNMENT: args.alignment,
            workload.ENV_TIMEOUT: str(args.timeout_s),
            workload.ENV_WAIT: args.wait,
            workload.ENV_MODELS: getattr(args, "model_mix", "") or "",
        }
    )
    if args.sentences:
        env[workload.ENV_SENTENCES] = str(Path(args.sentences).resolve())
    log = out / "locust.log"
    limit = args.duration_s + stop_timeout + 120
    with open(log, "wb") as f:
        try:
            done = subprocess.run(
                command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit
            )
        except subprocess.TimeoutExpired as err:
            raise RunFailed(f"locust did not finish within {limit:.0f} s: {tail(log)}") from err
    if done.returncode != 0:
        raise RunFailed(f"locust exited with status {done.returncode}: {tail(log)}")


# --- results -----------------------------------------------------------------------------------

REPORTED = {"p50": "50%", "p95": "95%", "p99": "99%"}


@dataclass
class KindStats:
    name: str
    requests: int
    failures: int
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    sentences_per_request: int

    @property
    def error_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:  # "N/A" for a row without requests
        return math.nan


def read_stats(path: Path) -> dict[str, KindStats]:
    """locust's <prefix>_stats.csv by name (the total row is 'Aggregated')."""
    if not path.is_file():
        raise RunFailed(f"locust wrote no {path}")
    rows = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            name = row["Name"]
            rows[name] = KindStats(
                name=name,
                requests=int(row["Request Count"]),
                failures=int(row["Failure Count"]),
                requests_per_s=_number(row["Requests/s"]),
                p50_ms=_number(row[REPORTED["p50"]]),
                p95_ms=_number(row[REPORTED["p95"]]),
                p99_ms=_number(row[REPORTED["p99"]]),
                avg_ms=_number(row["Average Response Time"]),
                sentences_per_request=0 if name == AGGREGATED else workload.texts_per_request(name),
            )
    if AGGREGATED not in rows:
        raise RunFailed(f"{path} has no {AGGREGATED} row")
    return rows


def read_failures(path: Path, limit: int = 5) -> list[dict[str, Any]]:
    """The most frequent failures from locust's <prefix>_failures.csv: name, error, occurrences."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = [
            {"name": r["Name"], "error": r["Error"], "occurrences": int(r["Occurrences"])}
            for r in csv.DictReader(f)
        ]
    return sorted(rows, key=lambda r: int(r["occurrences"]), reverse=True)[:limit]
