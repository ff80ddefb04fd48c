"""An hour under load: the served repository, closed-loop users, mixed requests, cancellations, and
a reload in the middle, with memory, file descriptors and latency watched all along.

    python -m loadtest.soak_hour --duration 1h --users 32 --out runs/soak/hour       # the real one
    python -m loadtest.soak_hour --duration 60s --users 4 --sample-s 5 --window 20s \
        --settle 10s --max-p99-growth 0 --out /tmp/soak-short      # tests/test_soak_hour.py's run

It starts the server on 127.0.0.1 with free ports serving the model repository `--models` (default:
the embedded models/, every model in it), and runs loadtest/closed_loop.py's users against it:
each model's texts at beam 1 and 5, batches, word and subword alignments, and requests the client
cancels after --cancel-after-s (the mix is `--mix-factory`, default closed_loop.repository_mix: one
function that gets every served model's texts and returns the request kinds; an `Align` kind goes
there). At --reload-at of the run the server gets SIGHUP (the repository reloads). Every --sample-s
seconds a row goes to OUT/samples.csv: the server's RSS (VmRSS) and open file descriptors (/proc/PID/fd),
the client's requests sent and answered so far. After the run, per --window (default 10 minutes):
requests answered, errors, cancelled, p50 and p99 (OUT/windows.csv). It checks

    errors     no request failed (every gRPC code but OK, and our own cancellations, is an error);
    answered   every request sent was answered or cancelled by the client: sent = OK + cancelled;
    server     the server's Translate and Align count (s2s_request_duration_seconds_count, every code) grew
               by between the client's OK and its sent, and its OK count by at least the client's OK
               (a cancelled request the server had already answered counts OK there);
    drained    queue, running sentences and Translate in flight back to 0;
    reload     the server logged "reloaded" after the SIGHUP, and served on;
    rss        after --settle, the median RSS of the last third within (1 + --max-rss-growth) of the
               first third's;
    fds        after --settle, the most open descriptors of the last third at most --max-fd-growth
               above the first third's;
    latency    (with --max-p99-growth > 0) the last full window's p99 within that factor of the first
               full window after --settle;
    exit       the server exits 0 on SIGTERM;

and writes OUT/soak.json (every figure and check) and one line. Bounded: --duration at most 2 hours
(6 with --force), at most 256 users; loopback only; it stops by itself. Exit status: 0 every check
passed, 1 one failed, 2 bad arguments, 3 the run itself failed.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from loadtest import closed_loop, harness, soak, workload
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc

MAX_USERS = 256
MAX_DURATION_S = 2 * 3600
FORCED_MAX_DURATION_S = 6 * 3600
# a mix factory: every served model's texts and the server's address -> the request kinds
MixFactory = Callable[[dict[str, Sequence[str]], str], list[closed_loop.Kind]]


# --- arguments -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.soak_hour", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--duration", "-t", default="1h", help="how long to load (default: 1h)")
    p.add_argument("--users", "-u", type=int, default=32, help="closed-loop users (default: 32)")
    p.add_argument("--models", default="models", help="the repository to serve (default: models)")
    p.add_argument("--policy", default="iteration", help="the server's batching policy")
    p.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (60)")
    p.add_argument("--window", default="10m", help="latency window (default: 10m)")
    p.add_argument(
        "--settle", default="", help="warm-up left out of the trends (default: a tenth, at most 5m)"
    )
    p.add_argument(
        "--reload-at", type=float, default=0.5, help="SIGHUP at this fraction of the run"
    )
    p.add_argument("--cancel-after-s", type=float, default=0.02, help="the cancelled kinds' wait")
    p.add_argument("--timeout-s", type=float, default=30.0, help="each call's deadline")
    p.add_argument(
        "--mix-factory", default="loadtest.closed_loop:repository_mix", help="MODULE:FUNCTION"
    )
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--max-fd-growth", type=int, default=8)
    p.add_argument("--max-p99-growth", type=float, default=2.0, help="0: report only")
    p.add_argument(
        "--server-flags",
        default="",
        help="more server flags, e.g. the deployment's layout \"--fronts 1 --engines 2 "
        '--intra-op-threads 1"',
    )
    p.add_argument(
        "--memory-limit",
        default="deploy",
        help="the pod's memory limit the peak RSS of every process summed must stay under: "
        "a Kubernetes quantity (2Gi, 1500Mi), 'deploy' (deploy/base/deployment.yaml's), or "
        "'none'",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--force", action="store_true", help="allow up to 6 hours")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        args.duration_s = harness.parse_duration(args.duration)
        args.window_s = harness.parse_duration(args.window)
        args.settle_s = (
            harness.parse_duration(args.settle) if args.settle else min(args.duration_s / 10, 300.0)
        )
    except ValueError as err:
        p.error(str(err))
    limit = FORCED_MAX_DURATION_S if args.force else MAX_DURATION_S
    if not 0 < args.duration_s <= limit:
        p.error(f"--duration must be at most {limit / 3600:.0f} h (--force allows 6 h)")
    if not 1 <= args.users <= MAX_USERS:
        p.error(f"--users must be 1..{MAX_USERS}")
    if args.sample_s <= 0 or args.window_s <= 0 or not 0 < args.reload_at < 1:
        p.error("--sample-s and --window must be positive, --reload-at in (0, 1)")
    try:
        args.memory_limit_bytes = memory_limit(args.memory_limit)
    except ValueError as err:
        p.error(str(err))
    return args


DEPLOYMENT = Path(__file__).resolve().parent.parent / "deploy" / "base" / "deployment.yaml"
_LIMIT = re.compile(r"limits:\s*\n(?:\s+\w+:.*\n)*?\s+memory:\s*(\S+)")
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9, "": 1}


def memory_limit(spec: str) -> int | None:
    """Bytes of a Kubernetes memory quantity, of the deployment's container limit ('deploy'), or
    None ('none')."""
    if spec == "none":
        return None
    if spec == "deploy":
        found = _LIMIT.search(DEPLOYMENT.read_text(encoding="utf-8"))
        if found is None:
            raise ValueError(f"no container memory limit in {DEPLOYMENT}")
        spec = found.group(1)
    number = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G|)", spec)
    if number is None:
        raise ValueError(f"cannot read the memory limit {spec!r}: use e.g. 2Gi or 1500Mi")
    return int(float(number.group(1)) * _UNITS[number.group(2)])


def load_factory(spec: str) -> MixFactory:
    module, _, name = spec.partition(":")
    factory: MixFactory = getattr(importlib.import_module(module), name)
    return factory


def model_texts(target: str) -> dict[str, Sequence[str]]:
    """Every served model with texts in its domain (workload.model_texts: G2P models get words,
    the Greek models Greek verses, the others the numbers sentences)."""
    with grpc.insecure_channel(target) as channel:
        listed = pb_grpc.TranslatorStub(channel).ListModels(pb.ListModelsRequest(), timeout=30)
    return {n: workload.model_texts(n) for n in sorted({m.name for m in listed.models})}


# --- sampling --------------------------------------------------------------------------------------


def open_fds(pid: int) -> int | None:
    """Open file descriptors of the server: the process and its children summed."""
    counts = []
    for member in soak.process_tree(pid):
        try:
            counts.append(len(os.listdir(f"/proc/{member}/fd")))
        except OSError:
            continue
    return sum(counts) if counts else None


@dataclass
class Sample:
    t_s: float
    rss_bytes: int | None  # every process of the server summed
    fds: int | None
    sent: int
    finished: int
    processes: dict[str, int] = field(default_factory=dict)  # each process's RSS, by its label


class Sampler(threading.Thread):
    """Every `every_s` seconds: the server's RSS and fds and the client's counts, into a CSV."""

    def __init__(self, pid: int, load: closed_loop.ClosedLoop, every_s: float, path: Path) -> None:
        super().__init__(name="soak-hour-sampler", daemon=True)
        self.pid, self.load, self.every_s, self.path = pid, load, every_s, path
        self.samples: list[Sample] = []
        self.halt = threading.Event()
        self.started_at = time.monotonic()

    def take(self) -> Sample:
        sent, outcomes = self.load.tally.snapshot()
        t = time.monotonic() - self.started_at
        each = soak.rss_by_process(self.pid)
        total = sum(each.values()) if each else None
        return Sample(t, total, open_fds(self.pid), sent, len(outcomes), each)

    def run(self) -> None:
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(
                f, fieldnames=[f.name for f in Sample.__dataclass_fields__.values()]
            )
            writer.writeheader()
            last = False
            while not last:
                next_at = self.started_at + len(self.samples) * self.every_s
                last = self.halt.wait(max(0.0, next_at - time.monotonic()))
                sample = self.take()
                self.samples.append(sample)
                writer.writerow(asdict(sample) | {"processes": json.dumps(sample.processes)})
                f.flush()

    def stop(self) -> list[Sample]:
        self.halt.set()
        self.join(30.0)
        return self.samples


def translate_counts(url: str) -> dict[str, float]:
    """s2s_request_duration_seconds_count{method="Translate" or "Align"} by code (every protocol
    summed): the requests the load sends."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode("utf-8")
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "s2s_request_duration_seconds_count" and s.labels.get("method") in (
                "Translate",
                "Align",
            ):
                code = s.labels.get("code", "")
                counts[code] = counts.get(code, 0.0) + float(s.value)
    return counts


# --- windows and checks ----------------------------------------------------------------------------


def windows(
    outcomes: Sequence[closed_loop.Outcome], t0: float, window_s: float, duration_s: float
) -> list[dict[str, Any]]:
    """Per window of the run (by the time each request started): answered, errors, cancelled,
    p50/p99 of the answered (ms); `full` says whether the window lies wholly inside the run."""
    n = max(1, math.ceil(duration_s / window_s))
    rows = []
    for w in range(n):
        mine = [o for o in outcomes if w * window_s <= o.started - t0 < (w + 1) * window_s]
        ok = [o.seconds for o in mine if o.code == "OK"]
        rows.append(
            {
                "window": w,
                "start_s": w * window_s,
                "full": (w + 1) * window_s <= duration_s + 1e-9,
                "answered": len(ok),
                "errors": sum(
                    1 for o in mine if o.code not in ("OK", closed_loop.CANCELLED_BY_CLIENT)
                ),
                "cancelled": sum(1 for o in mine if o.code == closed_loop.CANCELLED_BY_CLIENT),
                "p50_ms": round(1000 * closed_loop.quantile(ok, 0.5), 2),
                "p99_ms": round(1000 * closed_loop.quantile(ok, 0.99), 2),
            }
        )
    return rows


def thirds(values: Sequence[float]) -> tuple[Sequence[float], Sequence[float]]:
    k = max(1, len(values) // 3)
    return values[:k], values[-k:]


@dataclass
class Check:
    ok: bool
    detail: str


@dataclass
class Report:
    args: dict[str, str]
    sent: int = 0
    answered: int = 0
    cancelled: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    server_counts: dict[str, float] = field(default_factory=dict)
    drained: dict[str, float] = field(default_factory=dict)
    reload_s: float | None = None
    reloaded: bool = False
    samples: list[dict[str, Any]] = field(default_factory=list)
    peak_rss_bytes: int = 0  # the largest sum over every process
    peak_by_process: dict[str, int] = field(default_factory=dict)  # each label's largest
    memory_limit_bytes: int | None = None
    windows: list[dict[str, Any]] = field(default_factory=list)
    server_exit: int | None = None
    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks.values())


def check(report: Report, args: argparse.Namespace) -> None:
    c = report.checks
    n_errors = sum(report.errors.values())
    c["errors"] = Check(
        n_errors == 0, f"{n_errors} failed: {report.errors}" if n_errors else "none"
    )
    finished = report.answered + report.cancelled + n_errors
    c["answered"] = Check(
        report.sent == report.answered + report.cancelled and finished == report.sent,
        f"sent {report.sent}, answered {report.answered}, cancelled by the client {report.cancelled}",
    )
    total = sum(report.server_counts.values())
    ok = report.server_counts.get("OK", 0.0)
    c["server"] = Check(
        report.answered <= total <= report.sent and ok >= report.answered,
        f"server counted {total:.0f} Translate and Align ({ok:.0f} OK) for {report.sent} sent, "
        f"{report.answered} answered",
    )
    c["drained"] = Check(
        all(v == 0 for v in report.drained.values()), f"gauges at the end {report.drained}"
    )
    c["reload"] = Check(
        report.reloaded, f"SIGHUP at {report.reload_s} s, reloaded: {report.reloaded}"
    )
    settled = [s for s in report.samples if s["t_s"] >= args.settle_s]
    rss = [float(s["rss_bytes"]) for s in settled if s["rss_bytes"] is not None]
    if len(rss) >= 2:
        first, last = thirds(rss)
        growth = statistics.median(last) / statistics.median(first) - 1
        c["rss"] = Check(
            growth <= args.max_rss_growth,
            f"RSS median {statistics.median(first) / 2**20:.1f} -> "
            f"{statistics.median(last) / 2**20:.1f} MiB ({100 * growth:+.1f}%)",
        )
    else:
        c["rss"] = Check(False, f"{len(rss)} RSS samples after the settle time: run longer")
    fds = [float(s["fds"]) for s in settled if s["fds"] is not None]
    if len(fds) >= 2:
        first_fd, last_fd = thirds(fds)
        c["fds"] = Check(
            max(last_fd) <= max(first_fd) + args.max_fd_growth,
            f"open fds {max(first_fd):.0f} -> {max(last_fd):.0f}",
        )
    else:
        c["fds"] = Check(False, f"{len(fds)} fd samples after the settle time: run longer")
    full = [
        w for w in report.windows if w["full"] and w["start_s"] >= args.settle_s and w["answered"]
    ]
    if args.max_p99_growth > 0 and len(full) >= 2:
        ratio = full[-1]["p99_ms"] / full[0]["p99_ms"]
        c["latency"] = Check(
            ratio <= args.max_p99_growth,
            f"p99 {full[0]['p99_ms']:.0f} -> {full[-1]['p99_ms']:.0f} ms (x{ratio:.2f})",
        )
    if report.memory_limit_bytes is not None:
        c["limit"] = Check(
            0 < report.peak_rss_bytes <= report.memory_limit_bytes,
            f"peak {report.peak_rss_bytes / 2**20:.0f} MiB of every process summed, limit "
            f"{report.memory_limit_bytes / 2**20:.0f} MiB",
        )
    c["exit"] = Check(
        report.server_exit == 0, f"the server exited with status {report.server_exit}"
    )


def reloaded_after(log: Path, since_wall: float) -> bool:
    """A "reloaded" JSON line in the server's log written after `since_wall` (time.time())."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(math.floor(since_wall)))
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("message") == "reloaded" and entry.get("time", "") >= stamp:
            return True
    return False


# --- the run ---------------------------------------------------------------------------------------


def soak_hour(args: argparse.Namespace) -> Report:
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args={k: str(v) for k, v in vars(args).items()})
    server = harness.LocalServer.start(
        "", args.policy, args.out, 180.0, models=args.models, extra=shlex.split(args.server_flags)
    )
    try:
        mix = load_factory(args.mix_factory)(model_texts(server.target), server.target)
        before = translate_counts(server.metrics_url)
        load = closed_loop.ClosedLoop(server.target, mix, args.users, args.timeout_s, args.seed)
        sampler = Sampler(server.process.pid, load, args.sample_s, args.out / "samples.csv")
        t0 = time.monotonic()
        load.start()
        sampler.start()
        reload_at = t0 + args.reload_at * args.duration_s
        time.sleep(max(0.0, reload_at - time.monotonic()))
        report.reload_s = round(time.monotonic() - t0, 1)
        sighup_wall = time.time()
        server.process.send_signal(signal.SIGHUP)
        time.sleep(max(0.0, t0 + args.duration_s - time.monotonic()))
        load.stop(timeout_s=args.timeout_s + 10)
        samples = sampler.stop()
        report.drained = soak.wait_drained(server.metrics_url)
        after = translate_counts(server.metrics_url)
        report.reloaded = reloaded_after(server.log, sighup_wall)
    finally:
        report.server_exit = server.stop()
    sent, outcomes = load.tally.snapshot()
    report.sent = sent
    report.answered = sum(1 for o in outcomes if o.code == "OK")
    report.cancelled = sum(1 for o in outcomes if o.code == closed_loop.CANCELLED_BY_CLIENT)
    for o in outcomes:
        if o.code not in ("OK", closed_loop.CANCELLED_BY_CLIENT):
            report.errors[o.code] = report.errors.get(o.code, 0) + 1
    report.server_counts = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    report.samples = [asdict(s) for s in samples]
    report.peak_rss_bytes = max((s.rss_bytes or 0 for s in samples), default=0)
    for s in samples:
        for label, rss in s.processes.items():
            report.peak_by_process[label] = max(rss, report.peak_by_process.get(label, 0))
    report.memory_limit_bytes = args.memory_limit_bytes
    report.windows = windows(outcomes, t0, args.window_s, args.duration_s)
    with open(args.out / "windows.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(report.windows[0]))
        writer.writeheader()
        writer.writerows(report.windows)
    check(report, args)
    return report


def summary_line(report: Report) -> str:
    verdict = (
        "PASS"
        if report.passed
        else "FAIL: " + ", ".join(k for k, c in report.checks.items() if not c.ok)
    )
    details = "; ".join(f"{k} {c.detail}" for k, c in report.checks.items())
    return f"soak {report.args['duration']} u{report.args['users']}: {verdict} ({details})"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = soak_hour(args)
    except (harness.RunFailed, grpc.RpcError, OSError) as err:
        print(f"soak run failed: {err}", file=sys.stderr)
        return 3
    data = asdict(report) | {"passed": report.passed}
    (args.out / "soak.json").write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    for row in report.windows:
        print(
            f"window {row['window']} ({row['start_s']:.0f} s): {row['answered']} answered, "
            f"{row['errors']} errors, {row['cancelled']} cancelled, p50 {row['p50_ms']:.0f} ms, "
            f"p99 {row['p99_ms']:.0f} ms"
        )
    print(memory_table(report))
    print(summary_line(report))
    return 0 if report.passed else 1


def memory_table(report: Report) -> str:
    """Each process's peak resident memory and the pod's, beside its limit."""
    limit = report.memory_limit_bytes
    rows = ["| process | peak RSS (MiB) |", "|---|---|"]
    rows += [f"| {k} | {v / 2**20:.0f} |" for k, v in sorted(report.peak_by_process.items())]
    rows.append(f"| every process, summed | {report.peak_rss_bytes / 2**20:.0f} |")
    if limit is not None:
        rows.append(f"| the pod's limit | {limit / 2**20:.0f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
