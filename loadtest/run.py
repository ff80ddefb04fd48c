"""Headless load test: start the server (or target one), run locust, summarize, check the SLOs.

    python -m loadtest.run --users 32 --spawn-rate 32 --duration 30s --policy iteration \
        --out runs/loadtest/iteration-u32 --slo-p99-ms 2000 --slo-max-error-ratio 0.01
    python -m loadtest.run --target s2s.default.svc:50051 --metrics-url http://s2s.default.svc:9090/metrics \
        --users 64 --duration 5m --mix short-long --out runs/loadtest/k8s-u64

Without --target it starts `python -m service.serve.server --bundle BUNDLE --policy POLICY` on 127.0.0.1
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
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest import prom, workload
from loadtest.harness import (
    AGGREGATED,
    CSV_PREFIX,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SLO,
    EXIT_USAGE,
    REPO,
    KindStats,
    LocalServer,
    RunFailed,
    default_processes,
    parse_duration,
    read_failures,
    read_stats,
    run_locust,
    scrape,
    server_info,
    tail,
)

MAX_USERS = 256
MAX_DURATION_S = 15 * 60


# --- arguments ---------------------------------------------------------------------------------


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
        "--models", default="", help="serve a model repository folder instead of --bundle"
    )
    p.add_argument(
        "--model-mix",
        default="",
        help="models the requests name, NAME[:WEIGHT],... (default: the server's default model); "
        "locust reports each kind per model as KIND@MODEL",
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
        workload.parse_models(args.model_mix)
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
        models = str(Path(args.models).resolve()) if args.models else ""
        server = LocalServer.start(bundle, args.policy, out, args.ready_timeout_s, models)
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
