"""The chaos soak: the mixed load while processes die, with what a platform team asks afterwards.

    python -m loadtest.chaos --duration 10m --users 32 \
        --server-flags "--fronts 1 --engines 2 --intra-op-threads 1" --out runs/chaos/deploy
    python -m loadtest.chaos --duration 10m --users 32 --out runs/chaos/default

It starts the server on 127.0.0.1 with free ports on the repository `--models` (every embedded model
by default) in the layout `--server-flags` gives, and runs loadtest/mixes.py's every-option mix on
every served model (plain, n-best with matrices, markup, a glossary term, a prefix with n-gram
blocking, seeded sampling, coverage penalties, Align, client-cancelled requests) from `--users`
closed-loop users. Its clients wait for a server to listen (`wait_for_ready`, as a production client
is configured: a call made while the only front restarts waits for it within its deadline). Every
`--every` seconds (drawn between its two bounds) it SIGKILLs an engine or a front process drawn at
random, or, one time in `--reload-share`, SIGHUPs the server (a reload). Every `--sample-s` seconds it
reads each process's resident memory. After the load it asks up to `--recheck` of the requests it saw
answered again, one at a time, and compares. It checks

    held       every failed request was in flight when an engine or a front was killed (the
               requests a killed process held), and failed UNAVAILABLE;
    hangs      no request took more than its deadline (+1 s), and every user stopped;
    alone      each re-asked request gets the answer it got under the load (its hypotheses' texts;
               scores within 1e-3);
    memory     the peak of every process's RSS summed stays under the pod's limit (--memory-limit,
               deploy/base/deployment.yaml's by default), and over the last half of the run the
               median of its last third is within --max-rss-growth of its first third's;
    metrics    the server's /metrics counted the requests the clients saw answered: its OK count of
               Translate and Align within [answered - what a killed front may lose, answered + the
               client's own cancels] (a process killed takes the counts it made since the
               supervisor's last reading of it, service/serve/pod_metrics.py's GATHER_S);
    exit       the server exits 0 on SIGTERM,

and writes OUT/chaos.json, OUT/samples.csv and a table. Exit status 0 when every check passed, 1 when
one failed, 3 when the run could not be made. Bounded: at most 2 hours, 256 users, loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from loadtest import closed_loop, harness, soak, soak_hour
from loadtest.mixes import every_option_mix
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc

MAX_DURATION_S = 2 * 3600
GATHER_S = 5.0  # service/serve/pod_metrics.py's: what a killed process's counts may lag by
SCORE_TOLERANCE = 1e-3
DEADLINE_SLACK_S = 1.0
# A request a client sends on its connection to a front in the moment that front is killed fails
# with the transport's reset before the client has seen the connection close: the front died
# holding it. How long after the kill (as this tool reads its clock), and what the reset says:
FRONT_RESET_S = 1.0
TRANSPORT_RESETS = ("Stream removed", "Connection reset", "Socket closed", "failed to connect")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.chaos", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--duration", "-t", default="10m", help="how long to load (default: 10m)")
    p.add_argument("--users", "-u", type=int, default=32)
    p.add_argument("--models", default="models", help="the repository to serve (default: models)")
    p.add_argument("--server-flags", default="", help="more server flags: the layout")
    p.add_argument("--every", type=float, nargs=2, default=(30.0, 90.0), metavar=("MIN_S", "MAX_S"))
    p.add_argument("--reload-share", type=float, default=0.25, help="a reload instead of a kill")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=30.0, help="each call's deadline")
    p.add_argument("--recheck", type=int, default=300, help="answers asked again alone")
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--memory-limit", default="deploy", help="as loadtest.soak_hour's")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        args.duration_s = harness.parse_duration(args.duration)
        args.memory_limit_bytes = soak_hour.memory_limit(args.memory_limit)
    except ValueError as err:
        p.error(str(err))
    if not 0 < args.duration_s <= MAX_DURATION_S or not 1 <= args.users <= 256:
        p.error("--duration must be at most 2 h and --users 1..256")
    if not 0 < args.every[0] <= args.every[1] or not 0 <= args.reload_share <= 1:
        p.error("--every needs 0 < MIN_S <= MAX_S, --reload-share a share in [0, 1]")
    return args


# --- what happens to the server ------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    at: float  # monotonic seconds
    what: str  # "engine-0", "front-0", ... (killed) or "reload" (SIGHUP)
    pid: int


class Chaos(threading.Thread):
    """Every so often: SIGKILL an engine or a front of the server's processes, or SIGHUP it."""

    def __init__(self, root: int, every: tuple[float, float], reload_share: float, seed: int):
        super().__init__(name="chaos", daemon=True)
        self.root, self.every, self.reload_share = root, every, reload_share
        self.rng = random.Random(seed)
        self.events: list[Event] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(*self.every)):
            if self.rng.random() < self.reload_share:
                self.send(signal.SIGHUP, "reload", self.root)
                continue
            children = {
                soak.process_label(pid, self.root): pid
                for pid in soak.process_tree(self.root)
                if pid != self.root
            }
            killable = sorted(k for k in children if k.startswith(("engine-", "front-")))
            if killable:
                what = self.rng.choice(killable)
                self.send(signal.SIGKILL, what, children[what])

    def send(self, sig: signal.Signals, what: str, pid: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        self.events.append(Event(time.monotonic(), what, pid))

    def stop(self) -> list[Event]:
        self.halt.set()
        self.join(10.0)
        return self.events


# --- the answers, seen and asked again -------------------------------------------------------------


class Answers:
    """The first answer to each distinct request (its kind and bytes), up to `limit` of them."""

    def __init__(self, limit: int = 5000) -> None:
        self.limit = limit
        self.seen: dict[tuple[str, bytes], tuple[Any, Any]] = {}
        self.lock = threading.Lock()

    def keep(self, kind: str, request: Any, answer: Any) -> None:
        key = (kind, request.SerializeToString(deterministic=True))
        with self.lock:
            if key not in self.seen and len(self.seen) < self.limit:
                self.seen[key] = (request, answer)


def summary(answer: Any) -> list[list[tuple[str, float]]]:
    """An answer's hypotheses (Translate) or pairs (Align): (text or links, score)."""
    if hasattr(answer, "translations"):
        return [[(h.text, h.score) for h in t.hypotheses] for t in answer.translations]
    return [[(p.pharaoh, p.log_prob)] for p in answer.alignments]


def differs(before: Any, after: Any) -> str:
    """'' when the two answers agree (texts equal, scores within SCORE_TOLERANCE), else how not."""
    a, b = summary(before), summary(after)
    if [[t for t, _ in x] for x in a] != [[t for t, _ in x] for x in b]:
        return f"texts {a} then {b}"
    gaps = [
        abs(s - r) for x, y in zip(a, b, strict=True) for (_, s), (_, r) in zip(x, y, strict=True)
    ]
    if gaps and max(gaps) > SCORE_TOLERANCE:
        return f"scores differ by {max(gaps):.2e}"
    return ""


def recheck(target: str, answers: Answers, n: int, seed: int, timeout_s: float) -> dict[str, Any]:
    """Up to n seen requests asked again one at a time: how many, and those that differ."""
    items = sorted(answers.seen.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    random.Random(seed).shuffle(items)
    wrong = []
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for (kind, _), (request, answer) in items[:n]:
            method = stub.Align if isinstance(request, pb.AlignRequest) else stub.Translate
            found = differs(answer, method(request, timeout=timeout_s, wait_for_ready=True))
            if found:
                wrong.append({"kind": kind, "how": found[:500]})
    return {"asked": min(n, len(items)), "distinct_seen": len(items), "different": wrong}


# --- the checks --------------------------------------------------------------------------------


@dataclass
class Check:
    ok: bool
    detail: str


@dataclass
class Report:
    layout: str
    duration_s: float
    users: int
    sent: int = 0
    answered: int = 0
    cancelled: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    longest_s: float = 0.0
    users_stopped: bool = False
    rechecked: dict[str, Any] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    peak_by_process: dict[str, int] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    last_half_growth: float | None = None
    server_ok: float = 0.0
    lost_bound: int = 0
    server_exit: int | None = None
    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks.values())


def held(outcome: closed_loop.Outcome, kills: Sequence[Event]) -> bool:
    """Whether the request was in flight when a process was killed, or sent on the connection of a
    front killed a moment before and failed by the transport's reset."""
    end = outcome.started + outcome.seconds
    return any(outcome.started <= k.at <= end or reset_by_front_kill(outcome, k) for k in kills)


def reset_by_front_kill(outcome: closed_loop.Outcome, kill: Event) -> bool:
    return (
        kill.what.startswith("front-")
        and kill.at <= outcome.started <= kill.at + FRONT_RESET_S
        and any(reset in outcome.details for reset in TRANSPORT_RESETS)
    )


def lost_by_kills(outcomes: Sequence[closed_loop.Outcome], kills: Sequence[Event]) -> int:
    """Answered requests a killed front may have counted and taken with it: those that ended in
    the GATHER_S before its kill."""
    fronts = [k.at for k in kills if k.what.startswith("front-")]
    return sum(
        1
        for o in outcomes
        if o.code == "OK" and any(t - GATHER_S <= o.started + o.seconds <= t for t in fronts)
    )


def check(report: Report, args: argparse.Namespace, samples: Sequence[soak_hour.Sample]) -> None:
    c = report.checks
    unexplained = [f for f in report.failed if not f["held"] or f["code"] != "UNAVAILABLE"]
    c["held"] = Check(
        not unexplained,
        f"{len(report.failed)} failed, each in flight at a kill and UNAVAILABLE"
        if not unexplained
        else f"{len(unexplained)} not: {unexplained[:5]}",
    )
    c["hangs"] = Check(
        report.users_stopped and report.longest_s <= args.timeout_s + DEADLINE_SLACK_S,
        f"longest request {report.longest_s:.1f} s (deadline {args.timeout_s:.0f} s); users "
        f"stopped: {report.users_stopped}",
    )
    wrong = report.rechecked.get("different", [])
    c["alone"] = Check(
        bool(report.rechecked.get("asked")) and not wrong,
        f"{report.rechecked.get('asked', 0)} of {report.rechecked.get('distinct_seen', 0)} "
        f"distinct requests asked again: {len(wrong)} differ {wrong[:3]}",
    )
    rss = [float(s.rss_bytes) for s in samples if s.rss_bytes is not None]
    half = rss[len(rss) // 2 :]
    if len(half) >= 3:
        first, last = soak_hour.thirds(half)
        report.last_half_growth = statistics.median(last) / statistics.median(first) - 1
    limit = report.memory_limit_bytes
    c["memory"] = Check(
        report.last_half_growth is not None
        and report.last_half_growth <= args.max_rss_growth
        and (limit is None or 0 < report.peak_rss_bytes <= limit),
        f"peak {report.peak_rss_bytes / 2**20:.0f} MiB (limit "
        f"{'none' if limit is None else f'{limit / 2**20:.0f} MiB'}), last half's growth "
        f"{100 * (report.last_half_growth or 0):+.1f}%",
    )
    low = report.answered - report.lost_bound
    c["metrics"] = Check(
        low <= report.server_ok <= report.answered + report.cancelled,
        f"/metrics counted {report.server_ok:.0f} OK; the clients saw {report.answered} answered "
        f"({report.lost_bound} of them in the {GATHER_S:.0f} s before a front's kill), "
        f"{report.cancelled} cancelled by themselves",
    )
    c["exit"] = Check(
        report.server_exit == 0, f"the server exited with status {report.server_exit}"
    )


# --- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> Report:
    args.out.mkdir(parents=True, exist_ok=True)
    flags = shlex.split(args.server_flags)
    report = Report(" ".join(flags) or "default", args.duration_s, args.users)
    server = harness.LocalServer.start(
        "", "iteration", args.out, 300.0, models=args.models, extra=flags
    )
    answers = Answers()
    try:
        mix = every_option_mix(soak_hour.model_texts(server.target), server.target)
        before = soak_hour.translate_counts(server.metrics_url)
        load = closed_loop.ClosedLoop(
            server.target, mix, args.users, args.timeout_s, args.seed, True, answers.keep
        )
        sampler = soak_hour.Sampler(
            server.process.pid, load, args.sample_s, args.out / "samples.csv"
        )
        chaos = Chaos(server.process.pid, tuple(args.every), args.reload_share, args.seed)
        t0 = time.monotonic()
        load.start()
        sampler.start()
        chaos.start()
        time.sleep(args.duration_s)
        events = chaos.stop()
        load.stop(timeout_s=args.timeout_s + 10)
        report.users_stopped = not any(t.is_alive() for t in load.threads)
        samples = sampler.stop()
        soak.wait_drained(server.metrics_url)
        after = soak_hour.translate_counts(server.metrics_url)
        report.rechecked = recheck(server.target, answers, args.recheck, args.seed, args.timeout_s)
    finally:
        report.server_exit = server.stop()
    sent, outcomes = load.tally.snapshot()
    kills = [e for e in events if e.what != "reload"]
    report.events = [asdict(e) | {"at": round(e.at - t0, 1)} for e in events]
    report.sent = sent
    report.answered = sum(1 for o in outcomes if o.code == "OK")
    report.cancelled = sum(1 for o in outcomes if o.code == closed_loop.CANCELLED_BY_CLIENT)
    report.failed = [
        {
            "kind": o.kind,
            "code": o.code,
            "details": o.details[:200],
            "at": round(o.started - t0, 2),
            "held": held(o, kills),
        }
        for o in outcomes
        if o.code not in ("OK", closed_loop.CANCELLED_BY_CLIENT)
    ]
    report.longest_s = max((o.seconds for o in outcomes), default=0.0)
    report.peak_rss_bytes = max((s.rss_bytes or 0 for s in samples), default=0)
    for s in samples:
        for label, rss in s.processes.items():
            report.peak_by_process[label] = max(rss, report.peak_by_process.get(label, 0))
    report.memory_limit_bytes = args.memory_limit_bytes
    report.server_ok = after.get("OK", 0.0) - before.get("OK", 0.0)
    report.lost_bound = lost_by_kills(outcomes, kills)
    check(report, args, samples)
    return report


def table(report: Report) -> str:
    kills = [e["what"] for e in report.events if e["what"] != "reload"]
    reloads = sum(1 for e in report.events if e["what"] == "reload")
    lines = [
        f"chaos soak, layout: {report.layout}; {report.duration_s / 60:.0f} min, {report.users} "
        f"users; {len(kills)} kills ({', '.join(kills)}), {reloads} reloads",
        "",
        "| sent | answered | client cancels | failed (all held) | peak RSS (MiB) | limit (MiB) |",
        "|---|---|---|---|---|---|",
        f"| {report.sent} | {report.answered} | {report.cancelled} | {len(report.failed)} "
        f"({all(f['held'] for f in report.failed)}) | {report.peak_rss_bytes / 2**20:.0f} | "
        f"{(report.memory_limit_bytes or 0) / 2**20:.0f} |",
        "",
    ]
    lines += [
        f"- {name}: {'PASS' if c.ok else 'FAIL'}: {c.detail}" for name, c in report.checks.items()
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except (harness.RunFailed, grpc.RpcError, OSError) as err:
        print(f"chaos run failed: {err}", file=sys.stderr)
        return 3
    data = asdict(report) | {"passed": report.passed}
    (args.out / "chaos.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    (args.out / "chaos.txt").write_text(table(report) + "\n", encoding="utf-8")
    print(table(report))
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
