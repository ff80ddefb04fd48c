"""Headless load test: start the server (or target one), run locust, summarize, check the SLOs.

    python -m loadtest.run --users 32 --spawn-rate 32 --duration 30s --policy iteration \
        --out runs/loadtest/iteration-u32 --slo-p99-ms 2000 --slo-max-error-ratio 0.01
    python -m loadtest.run --target s2s.default.svc:50051 --metrics-url http://s2s.default.svc:9090/metrics \
        --users 64 --duration 5m --mix short-long --out runs/loadtest/k8s-u64

Without --target it starts `python -m service.server --bundle BUNDLE --policy POLICY` on 127.0.0.1
with free ports (other server settings from the S2S_* environment, e.g. S2S_MAX_BATCH_HYPOTHESES),
waits until health says SERVING, and stops it with SIGTERM at the end. With --target it starts
nothing. Locust runs headless as a subprocess (loadtest/locustfile.py); OUT receives:

    locust_stats.csv, locust_failures.csv, locust_exceptions.csv, locust_stats_history.csv
    report.html      locust's HTML report
    locust.log       locust's output, with its final tables
    server.log       the server's JSON log (when started here)
    metrics-before.txt, metrics.txt   /metrics scraped before and after the run (when known)
    summary.json     everything the summary line says, per request kind too

One summary line is printed: throughput (requests/s, sentences/s), p50/p95/p99 in ms, the error
ratio, the server histogram's quantiles and whether they agree with locust's within one bucket, and
the SLO verdict. Exit status: 0 all SLOs met, 1 an SLO missed (or no request answered), 2 bad
arguments, 3 the run itself failed (server did not start, locust crashed).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest import prom, workload

REPO = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
MAX_USERS = 256
MAX_DURATION_S = 15 * 60
CSV_PREFIX = "locust"
AGGREGATED = "Aggregated"

EXIT_OK, EXIT_SLO, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


class RunFailed(Exception):
    """The run could not be made (not an SLO miss): exit status 3."""


# --- arguments ---------------------------------------------------------------------------------

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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--users", "-u", type=int, default=32, help="concurrent users (default: 32)")
    p.add_argument(
        "--spawn-rate", "-r", type=float, help="users started per second (default: all at once)"
    )
    p.add_argument("--duration", "-t", default="30s", help="e.g. 30s, 5m (default: %(default)s)")
    p.add_argument(
        "--processes",
        type=int,
        help="locust worker processes (default: one per 8 users, at most 4; see default_processes)",
    )
    p.add_argument("--mix", default=workload.DEFAULT_MIX, choices=tuple(workload.MIXES))
    p.add_argument("--alignment", default="none", choices=workload.ALIGNMENTS)
    p.add_argument(
        "--timeout-s", type=float, default=workload.DEFAULT_TIMEOUT_S, help="per-call deadline"
    )
    p.add_argument(
        "--wait", default="0", help="seconds between a user's requests: S or MIN,MAX (default: 0)"
    )
    p.add_argument(
        "--sentences", default="", help="source<TAB>target TSV (default: see loadtest/workload.py)"
    )
    p.add_argument(
        "--out", type=Path, help="output folder (default: runs/loadtest/<time>-<mix>-<policy>-u<N>)"
    )
    where = p.add_argument_group("server (started here unless --target)")
    where.add_argument(
        "--target", help="gRPC address of a running server, e.g. a Kubernetes Service"
    )
    where.add_argument("--metrics-url", help="its /metrics URL, for the Prometheus cross-check")
    where.add_argument(
        "--policy",
        choices=("none", "request", "iteration"),
        help="batching policy (default: iteration)",
    )
    where.add_argument(
        "--bundle", default="models/default", help="model bundle (default: %(default)s)"
    )
    where.add_argument(
        "--ready-timeout-s", type=float, default=180.0, help="wait this long for SERVING"
    )
    slo = p.add_argument_group("SLOs (exit status 1 when missed)")
    slo.add_argument("--slo-p99-ms", type=float, help="p99 latency bound (default: none)")
    slo.add_argument(
        "--slo-max-error-ratio",
        type=float,
        default=0.01,
        help="failed/all requests (default: %(default)s)",
    )
    slo.add_argument(
        "--slo-name", default=AGGREGATED, help="request kind the p99 SLO applies to (default: all)"
    )
    p.add_argument(
        "--force", action="store_true", help=f"allow > {MAX_USERS} users or > 15 minutes"
    )
    args = p.parse_args(argv)
    try:
        args.duration_s = parse_duration(args.duration)
        workload.parse_wait(args.wait)
    except ValueError as err:
        p.error(str(err))
    if args.users < 1 or args.duration_s <= 0 or args.timeout_s <= 0:
        p.error("--users, --duration and --timeout-s must be positive")
    if args.spawn_rate is None:
        args.spawn_rate = float(args.users)
    if args.processes is None:
        args.processes = default_processes(args.users)
    if not 1 <= args.processes <= args.users:
        p.error("--processes must be between 1 and --users")
    if args.spawn_rate <= 0:
        p.error("--spawn-rate must be positive")
    if not args.force and (args.users > MAX_USERS or args.duration_s > MAX_DURATION_S):
        p.error(f"refusing more than {MAX_USERS} users or 15 minutes without --force")
    if args.target and args.policy:
        p.error("--policy configures the server started here; it cannot apply to --target")
    if args.slo_max_error_ratio is not None and not 0 <= args.slo_max_error_ratio <= 1:
        p.error("--slo-max-error-ratio must be in [0, 1]")
    if args.slo_name != AGGREGATED and args.slo_name not in workload.mix_weights(args.mix):
        kinds = ", ".join(workload.mix_weights(args.mix))
        p.error(f"--slo-name {args.slo_name!r} is not sent by mix {args.mix!r}: use {kinds}")
    args.policy = None if args.target else (args.policy or "iteration")
    if args.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        args.out = (
            REPO
            / "runs"
            / "loadtest"
            / f"{stamp}-{args.mix}-{args.policy or 'remote'}-u{args.users}"
        )
    return args


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
    def start(cls, bundle: str, policy: str, out: Path, ready_timeout_s: float) -> LocalServer:
        port, metrics_port = free_port(), free_port()
        log = out / "server.log"
        command = [
            sys.executable, "-m", "service.server", "--bundle", bundle, "--policy", policy,
            "--host", "127.0.0.1", "--port", str(port),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        with open(log, "wb") as f:
            process = subprocess.Popen(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
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

    from service.client import TranslatorClient

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


@dataclass
class Summary:
    mix: str
    policy: str | None
    target: str
    users: int
    duration_s: float
    requests: int
    failures: int
    error_ratio: float
    requests_per_s: float
    sentences_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    elapsed_s: float
    kinds: list[dict[str, Any]]
    locust_processes: int = 1
    server: dict[str, Any] = field(default_factory=dict)
    failures_top: list[dict[str, Any]] = field(default_factory=list)
    prometheus: dict[str, Any] | None = None
    slo: dict[str, Any] = field(default_factory=dict)
    slo_missed: list[str] = field(default_factory=list)
    line: str = ""


def summarize(
    args: argparse.Namespace,
    target: str,
    rows: dict[str, KindStats],
    histogram: prom.Histogram | None,
    server: dict[str, Any] | None = None,
) -> Summary:
    total = rows[AGGREGATED]
    kinds = [r for n, r in sorted(rows.items()) if n != AGGREGATED]
    elapsed = total.requests / total.requests_per_s if total.requests_per_s > 0 else math.nan
    sentences = sum((k.requests - k.failures) * k.sentences_per_request for k in kinds)
    summary = Summary(
        mix=args.mix,
        policy=args.policy,
        target=target,
        users=args.users,
        duration_s=args.duration_s,
        requests=total.requests,
        failures=total.failures,
        error_ratio=total.error_ratio,
        requests_per_s=total.requests_per_s,
        sentences_per_s=sentences / elapsed if elapsed > 0 else 0.0,
        p50_ms=total.p50_ms,
        p95_ms=total.p95_ms,
        p99_ms=total.p99_ms,
        elapsed_s=elapsed,
        kinds=[asdict(k) | {"error_ratio": k.error_ratio} for k in kinds],
        locust_processes=args.processes,
        server=dict(server or {}),
    )
    if histogram is not None and histogram.count > 0:
        agreements = prom.compare(
            histogram, {0.5: total.p50_ms, 0.95: total.p95_ms, 0.99: total.p99_ms}
        )
        summary.prometheus = {
            "series": f'{prom.REQUEST_HISTOGRAM}_bucket{{method="Translate",code="OK"}}',
            "requests": histogram.count,
            "agree": all(a.agree for a in agreements),
            "quantiles": [asdict(a) for a in agreements],
            "text": prom.format_comparison(agreements),
        }
    check_slos(summary, args, rows)
    summary.line = summary_line(summary)
    return summary


def check_slos(summary: Summary, args: argparse.Namespace, rows: dict[str, KindStats]) -> None:
    missed = summary.slo_missed
    if summary.requests - summary.failures <= 0:
        missed.append("no request was answered")
    if args.slo_max_error_ratio is not None:
        summary.slo["max_error_ratio"] = args.slo_max_error_ratio
        if summary.error_ratio > args.slo_max_error_ratio:
            missed.append(f"error ratio {summary.error_ratio:.2%} > {args.slo_max_error_ratio:.2%}")
    if args.slo_p99_ms is not None:
        summary.slo["p99_ms"] = args.slo_p99_ms
        summary.slo["p99_of"] = args.slo_name
        row = rows.get(args.slo_name)
        if row is None or row.requests == 0:
            missed.append(f"no {args.slo_name} requests to check p99 on")
        elif not row.p99_ms <= args.slo_p99_ms:
            of = "" if args.slo_name == AGGREGATED else f" ({args.slo_name})"
            missed.append(f"p99{of} {row.p99_ms:g} ms > {args.slo_p99_ms:g} ms")


def summary_line(s: Summary) -> str:
    policy = s.policy or s.server.get("scheduling_policy")
    where = f"policy={policy}" if s.policy else f"target={s.target} policy={policy or '?'}"
    parts = [
        f"{s.mix} {where} users={s.users} {s.duration_s:g}s:",
        f"{s.requests_per_s:.1f} req/s, {s.sentences_per_s:.1f} sentences/s;",
        f"p50 {s.p50_ms:g} ms, p95 {s.p95_ms:g} ms, p99 {s.p99_ms:g} ms;",
        f"errors {s.failures}/{s.requests} ({s.error_ratio:.2%});",
    ]
    if s.prometheus:
        verdict = "agree" if s.prometheus["agree"] else "DISAGREE"
        parts.append(f"prometheus {verdict} ({s.prometheus['text']});")
    parts.append("SLO " + ("MISSED: " + "; ".join(s.slo_missed) if s.slo_missed else "met"))
    return " ".join(parts)


def kind_lines(s: Summary) -> list[str]:
    return [
        f"  {k['name']:<12} {k['requests']:>6} req {k['failures']:>4} err  {k['requests_per_s']:7.1f} req/s  "
        f"p50 {k['p50_ms']:>6g}  p95 {k['p95_ms']:>6g}  p99 {k['p99_ms']:>6g} ms"
        for k in s.kinds
    ]


# --- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    server: LocalServer | None = None
    if args.target:
        target, metrics_url = args.target, args.metrics_url
    else:
        bundle = str(Path(args.bundle).resolve()) if Path(args.bundle).exists() else args.bundle
        server = LocalServer.start(bundle, args.policy, out, args.ready_timeout_s)
        target, metrics_url = server.target, server.metrics_url
    try:
        info = server_info(target)
        before = scrape(metrics_url, out / "metrics-before.txt")
        run_locust(args, target, out)
        after = scrape(metrics_url, out / "metrics.txt")
    finally:
        if server is not None:
            status = server.stop()
            if status not in (0, None):
                print(
                    f"warning: the server exited with status {status}: {tail(server.log)}",
                    file=sys.stderr,
                )
    histogram = None
    if before is not None and after is not None:
        try:
            histogram = prom.subtract(prom.parse_histogram(after), prom.parse_histogram(before))
        except ValueError as err:
            print(f"warning: no Prometheus cross-check: {err}", file=sys.stderr)
    summary = summarize(args, target, read_stats(out / f"{CSV_PREFIX}_stats.csv"), histogram, info)
    summary.failures_top = read_failures(out / f"{CSV_PREFIX}_failures.csv")
    (out / "summary.json").write_text(
        json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8"
    )
    print(summary.line)
    print("\n".join(kind_lines(summary)))
    for failure in summary.failures_top:
        print(f"  failed {failure['occurrences']}x {failure['name']}: {failure['error']}")
    print(f"  results in {out}")
    return EXIT_SLO if summary.slo_missed else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("locust") is None:
        print("error: locust is not installed: pip install -e '.[loadtest]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
