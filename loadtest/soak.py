"""Soak test: a long load at a fixed concurrency, with the server's memory watched all along.

    python -m loadtest.soak --duration 30m --users 64 --out runs/soak/u64-30m
    python -m loadtest.soak --duration 20s --users 4 --sample-s 1 --max-rss-growth 1 \
        --out /tmp/soak-smoke      # the smoke run of tests/test_soak.py: the tooling, not a verdict

It starts the server as `loadtest.run` does (`python -m service.serve.server` on 127.0.0.1 with free ports,
other settings from the S2S_* environment), runs locust headless against it for --duration, and every
--sample-s seconds writes a row to OUT/rss.csv: the server's resident memory (VmRSS from
/proc/PID/status, else the process_resident_memory_bytes metric) and its queue, running and in-flight
gauges. Bounded: at most 256 users and 30 minutes. At the end it checks

    errors    locust counted no failed request;
    lost      no request lost: locust's request count equals the increase of the server's
              s2s_request_duration_seconds_count{method="Translate",code="OK"};
    drained   s2s_queue_depth_sentences, s2s_running_sentences and
              s2s_requests_in_flight{method="Translate"} are back to 0;
    rss       the median RSS of the last third of the samples is at most (1 + --max-rss-growth)
              times that of the first third (samples of the first --settle-s seconds, the
              allocators' warm-up, left out: by default a tenth of the run, at most 2 minutes);
    exit      the server exits 0 on SIGTERM;

and prints one line. OUT also gets what loadtest.run writes (locust's CSVs, report.html, locust.log,
server.log, metrics-before.txt, metrics.txt, summary.json), rss.png (the RSS curve, when matplotlib is
installed) and soak.json (every figure and check). Exit status: 0 every check passed, 1 one failed,
2 bad arguments, 3 the run itself failed (the server did not start, locust crashed).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadtest import harness, prom, run, workload

MAX_USERS = 256
MAX_DURATION_S = 30 * 60
DEFAULT_MAX_RSS_GROWTH = 0.10
DRAIN_TIMEOUT_S = 15.0
MIB = 1024 * 1024

# column -> (sample name, labels) in the server's /metrics
SERIES: dict[str, tuple[str, dict[str, str]]] = {
    "queue_depth": ("s2s_queue_depth_sentences", {}),
    "running": ("s2s_running_sentences", {}),
    "in_flight": ("s2s_requests_in_flight", {"method": "Translate"}),
    "ok_requests": ("s2s_request_duration_seconds_count", {"method": "Translate", "code": "OK"}),
    "metric_rss_bytes": ("process_resident_memory_bytes", {}),
}
GAUGES = ("queue_depth", "running", "in_flight")
CSV_FIELDS = ("t_s", "rss_bytes", *SERIES)


# --- arguments ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--duration", "-t", default="30m", help="e.g. 20s, 10m, 30m (default: %(default)s)"
    )
    p.add_argument("--users", "-u", type=int, default=64, help="concurrent users (default: 64)")
    p.add_argument("--spawn-rate", "-r", type=float, help="users started per second (default: all)")
    p.add_argument("--mix", default=workload.DEFAULT_MIX, choices=tuple(workload.MIXES))
    p.add_argument("--alignment", default="none", choices=workload.ALIGNMENTS)
    p.add_argument(
        "--timeout-s", type=float, default=workload.DEFAULT_TIMEOUT_S, help="per-call deadline"
    )
    p.add_argument("--wait", default="0", help="seconds between a user's requests: S or MIN,MAX")
    p.add_argument(
        "--sentences", default="", help="source<TAB>target TSV (default: see workload.py)"
    )
    p.add_argument("--policy", default="iteration", choices=("none", "request", "iteration"))
    p.add_argument("--bundle", default="models/default", help="model bundle (default: %(default)s)")
    p.add_argument(
        "--ready-timeout-s", type=float, default=180.0, help="wait this long for SERVING"
    )
    p.add_argument(
        "--out", type=Path, help="output folder (default: runs/soak/<time>-u<N>-<duration>)"
    )
    p.add_argument(
        "--sample-s", type=float, help="seconds between samples (default: duration/60, 1 to 5 s)"
    )
    p.add_argument(
        "--max-rss-growth",
        type=float,
        default=DEFAULT_MAX_RSS_GROWTH,
        help="allowed RSS growth, last third vs first third, as a fraction (default: %(default)s)",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        help="leave the first SETTLE seconds out of the RSS check: the allocators' warm-up "
        "(default: a tenth of the duration, at most 120 s)",
    )
    args = p.parse_args(argv)
    try:
        args.duration_s = harness.parse_duration(args.duration)
    except ValueError as err:
        p.error(str(err))
    if not 1 <= args.users <= MAX_USERS:
        p.error(f"--users must be between 1 and {MAX_USERS}")
    if not 0 < args.duration_s <= MAX_DURATION_S:
        p.error(f"--duration must be positive and at most {MAX_DURATION_S // 60} minutes")
    if args.sample_s is None:
        args.sample_s = min(5.0, max(1.0, args.duration_s / 60))
    if args.settle_s is None:
        args.settle_s = min(120.0, args.duration_s / 10)
    if args.sample_s <= 0 or args.max_rss_growth < 0 or args.settle_s < 0:
        p.error("--sample-s must be positive, --max-rss-growth and --settle-s >= 0")
    if args.settle_s >= args.duration_s:
        p.error("--settle-s must be shorter than --duration")
    if args.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        args.out = harness.REPO / "runs" / "soak" / f"{stamp}-u{args.users}-{args.duration_s:g}s"
    # the same run as loadtest.run's, for its locust runner and summary (bounds checked above)
    load = [
        *("--users", str(args.users), "--duration", f"{args.duration_s:g}"),
        *("--mix", args.mix, "--alignment", args.alignment, "--timeout-s", f"{args.timeout_s:g}"),
        *("--wait", args.wait, "--policy", args.policy, "--bundle", args.bundle),
        *("--ready-timeout-s", f"{args.ready_timeout_s:g}", "--out", str(args.out), "--force"),
        *("--slo-max-error-ratio", "0"),
    ]
    if args.spawn_rate is not None:
        load += ["--spawn-rate", f"{args.spawn_rate:g}"]
    if args.sentences:
        load += ["--sentences", args.sentences]
    args.load = run.parse_args(load)
    return args


# --- sampling ----------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (a server's supervisor, its fronts and engines)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(child) for child in f.read().split()]
        except OSError:
            continue
    return out


def process_label(pid: int, root: int) -> str:
    """A server process's name: "supervisor" (the root of several), "engine-N" or "front-N" (by
    its --role and index flags), "server" (the single-process server)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return f"pid-{pid}"
    if "--role" in argv:
        role = argv[argv.index("--role") + 1]
        flag = f"--{role}-index"
        return f"{role}-{argv[argv.index(flag) + 1]}" if flag in argv else role
    return "supervisor" if pid == root and len(process_tree(pid)) > 1 else "server"


def rss_by_process(pid: int) -> dict[str, int]:
    """VmRSS in bytes of the server's every process, by `process_label`."""
    out = {}
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out[process_label(member, pid)] = int(line.split()[1]) * 1024  # in kB
        except (OSError, ValueError, IndexError):
            continue
    return out


def read_rss(pid: int) -> int | None:
    """The server's resident memory in bytes: VmRSS of /proc/PID/status summed over the process and
    its children (the supervisor's fronts and engines); None when unreadable."""
    total, found = 0, False
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total, found = total + int(line.split()[1]) * 1024, True  # in kB
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None


def read_series(text: str) -> dict[str, float]:
    """The SERIES values in a scrape (a missing one is left out)."""
    wanted = {name: (sample, labels) for name, (sample, labels) in SERIES.items()}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for column, (sample, labels) in wanted.items():
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    values[column] = values.get(column, 0.0) + float(s.value)
    return values


def scrape_series(url: str, timeout: float = 5.0) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return read_series(reply.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}


@dataclass
class Sample:
    t_s: float  # seconds since the load started
    rss_bytes: float  # NaN when neither /proc nor the metric could be read
    values: dict[str, float]

    def row(self) -> dict[str, Any]:
        return {
            "t_s": f"{self.t_s:.2f}",
            "rss_bytes": "" if math.isnan(self.rss_bytes) else int(self.rss_bytes),
            **{c: self.values.get(c, "") for c in SERIES},
        }


class Sampler(threading.Thread):
    """Samples the server every `every_s` seconds into `path` (CSV, flushed per row) until stopped."""

    def __init__(self, pid: int, metrics_url: str, every_s: float, path: Path) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.pid, self.metrics_url, self.every_s, self.path = pid, metrics_url, every_s, path
        self.samples: list[Sample] = []
        self.halt = threading.Event()
        self.started_at = time.monotonic()

    def take(self) -> Sample:
        values = scrape_series(self.metrics_url, timeout=min(5.0, self.every_s * 2))
        rss: float | None = read_rss(self.pid)
        if rss is None:
            rss = values.get("metric_rss_bytes")
        return Sample(time.monotonic() - self.started_at, math.nan if rss is None else rss, values)

    def run(self) -> None:
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            last = False
            while not last:
                next_at = self.started_at + len(self.samples) * self.every_s
                last = self.halt.wait(max(0.0, next_at - time.monotonic()))  # one more when stopped
                sample = self.take()
                self.samples.append(sample)
                writer.writerow(sample.row())
                f.flush()

    def stop(self) -> list[Sample]:
        self.halt.set()
        self.join(30.0)
        return self.samples


# --- the checks --------------------------------------------------------------------------------


@dataclass
class RssTrend:
    samples: int
    first_mib: float  # median of the first third
    last_mib: float  # median of the last third
    growth: float  # last / first - 1
    slope_mib_per_h: float  # least-squares slope over every sample used
    peak_mib: float
    first_span_s: tuple[float, float]  # times of the first and the last third's samples
    last_span_s: tuple[float, float]


def rss_trend(samples: Sequence[Sample], settle_s: float = 0.0) -> RssTrend | None:
    """The RSS trend of the samples after `settle_s`; None with fewer than 6 readable samples."""
    points = [
        (s.t_s, s.rss_bytes / MIB)
        for s in samples
        if s.t_s >= settle_s and not math.isnan(s.rss_bytes)
    ]
    if len(points) < 6:
        return None
    third = len(points) // 3
    first = statistics.median(m for _, m in points[:third])
    last = statistics.median(m for _, m in points[-third:])
    ts, ms = [t for t, _ in points], [m for _, m in points]
    t_mean, m_mean = statistics.fmean(ts), statistics.fmean(ms)
    var = sum((t - t_mean) ** 2 for t in ts)
    slope = sum((t - t_mean) * (m - m_mean) for t, m in points) / var if var else 0.0
    return RssTrend(
        samples=len(points),
        first_mib=first,
        last_mib=last,
        growth=last / first - 1,
        slope_mib_per_h=slope * 3600,
        peak_mib=max(ms),
        first_span_s=(points[0][0], points[third - 1][0]),
        last_span_s=(points[-third][0], points[-1][0]),
    )


@dataclass
class Check:
    ok: bool
    detail: str


@dataclass
class SoakReport:
    users: int
    duration_s: float
    requests: int
    failures: int
    ok_requests: float
    gauges_after: dict[str, float]
    server_exit: int | None
    rss: dict[str, Any] | None
    checks: dict[str, Check] = field(default_factory=dict)
    summary_line: str = ""
    line: str = ""

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks.values())


def check(report: SoakReport, trend: RssTrend | None, max_growth: float) -> None:
    """Fill report.checks from the figures."""
    c = report.checks
    c["errors"] = Check(report.failures == 0, f"{report.failures} of {report.requests} failed")
    lost = report.requests - report.ok_requests
    c["lost"] = Check(
        report.requests > 0 and lost == 0,
        f"locust sent {report.requests}, the server answered {report.ok_requests:g} OK",
    )
    drained = {g: report.gauges_after.get(g, math.nan) for g in GAUGES}
    c["drained"] = Check(
        all(v == 0 for v in drained.values()),
        ", ".join(f"{g} {v:g}" for g, v in drained.items()),
    )
    if trend is None:
        c["rss"] = Check(False, "fewer than 6 RSS samples: lower --sample-s or --settle-s")
    else:
        c["rss"] = Check(
            trend.growth <= max_growth,
            f"{trend.first_mib:.1f} -> {trend.last_mib:.1f} MiB ({trend.growth:+.1%}, limit "
            f"{max_growth:.0%}), slope {trend.slope_mib_per_h:+.1f} MiB/h over {trend.samples} samples",
        )
    c["exit"] = Check(
        report.server_exit == 0, f"the server exited with status {report.server_exit}"
    )


def wait_drained(url: str, timeout: float = DRAIN_TIMEOUT_S) -> dict[str, float]:
    """The gauges once they are all 0, or as they are after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        values = scrape_series(url)
        if all(values.get(g) == 0 for g in GAUGES) or time.monotonic() > deadline:
            return {g: values.get(g, math.nan) for g in GAUGES}
        time.sleep(0.25)


def plot(
    samples: Sequence[Sample], trend: RssTrend | None, settle_s: float, path: Path, title: str
) -> bool:
    """The RSS curve, the thirds compared and the sentences in the server as a PNG; False without
    matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [s for s in samples if not math.isnan(s.rss_bytes)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([s.t_s for s in points], [s.rss_bytes / MIB for s in points], label="server RSS")
    if settle_s > 0:
        ax.axvspan(0, settle_s, color="0.9", label="settling (not checked)")
    if trend is not None:
        for span, mib, color, name in (
            (trend.first_span_s, trend.first_mib, "tab:green", "first third"),
            (trend.last_span_s, trend.last_mib, "tab:red", "last third"),
        ):
            ax.hlines(
                mib, *span, colors=color, linestyles="--", label=f"{name}: median {mib:.1f} MiB"
            )
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("server resident memory (MiB)")
    ax2 = ax.twinx()
    for column, color in (("running", "tab:gray"), ("queue_depth", "tab:orange")):
        series = [(s.t_s, s.values[column]) for s in samples if column in s.values]
        if series:
            ax2.plot(*zip(*series, strict=True), color=color, alpha=0.5, lw=1, label=column)
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("sentences decoding / queued")
    ax.set_zorder(ax2.get_zorder() + 1)  # the RSS curve in front
    ax.patch.set_visible(False)
    handles = [h for a in (ax, ax2) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="lower right", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- main --------------------------------------------------------------------------------------


def soak(args: argparse.Namespace) -> SoakReport:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    load = args.load
    bundle = str(Path(args.bundle).resolve()) if Path(args.bundle).exists() else args.bundle
    server = harness.LocalServer.start(bundle, args.policy, out, args.ready_timeout_s)
    status: int | None = None
    try:
        info = harness.server_info(server.target)
        before = scrape_series(server.metrics_url)
        harness.scrape(server.metrics_url, out / "metrics-before.txt")
        sampler = Sampler(server.process.pid, server.metrics_url, args.sample_s, out / "rss.csv")
        sampler.start()
        try:
            harness.run_locust(load, server.target, out)
        finally:
            samples = sampler.stop()
        gauges = wait_drained(server.metrics_url)
        after = scrape_series(server.metrics_url)
        after_text = harness.scrape(server.metrics_url, out / "metrics.txt")
    finally:
        status = server.stop()
    rows = harness.read_stats(out / f"{harness.CSV_PREFIX}_stats.csv")
    total = rows[harness.AGGREGATED]
    histogram = None
    before_text = (
        (out / "metrics-before.txt").read_text() if (out / "metrics-before.txt").is_file() else None
    )
    if before_text and after_text:
        try:
            histogram = prom.subtract(
                prom.parse_histogram(after_text), prom.parse_histogram(before_text)
            )
        except ValueError:
            histogram = None
    summary = run.summarize(load, server.target, rows, histogram, info)
    (out / "summary.json").write_text(
        json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8"
    )
    trend = rss_trend(samples, args.settle_s)
    report = SoakReport(
        users=args.users,
        duration_s=args.duration_s,
        requests=total.requests,
        failures=total.failures,
        ok_requests=after.get("ok_requests", math.nan) - before.get("ok_requests", 0.0),
        gauges_after=gauges,
        server_exit=status,
        rss=None if trend is None else asdict(trend),
        summary_line=summary.line,
    )
    check(report, trend, args.max_rss_growth)
    verdict = (
        "PASS"
        if report.passed
        else "FAIL: " + ", ".join(n for n, c in report.checks.items() if not c.ok)
    )
    report.line = (
        f"soak users={args.users} {args.duration_s:g}s: {total.requests_per_s:.1f} req/s, "
        f"p99 {total.p99_ms:g} ms; "
        + "; ".join(f"{n} {c.detail}" for n, c in report.checks.items())
        + f"; {verdict}"
    )
    plotted = plot(
        samples,
        trend,
        args.settle_s,
        out / "rss.png",
        f"soak: {args.users} users, {args.duration_s:g} s, {args.mix}",
    )
    document = asdict(report) | {
        "passed": report.passed,
        "rss_png": plotted,
        "samples": len(samples),
    }
    (out / "soak.json").write_text(
        json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8"
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("locust") is None:
        print("error: locust is not installed: pip install -e '.[loadtest]'", file=sys.stderr)
        return harness.EXIT_USAGE
    try:
        report = soak(args)
    except harness.RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return harness.EXIT_FAILED
    print(report.line)
    print(f"  {report.summary_line}")
    print(f"  results in {args.out}")
    return harness.EXIT_OK if report.passed else harness.EXIT_SLO


if __name__ == "__main__":
    sys.exit(main())
