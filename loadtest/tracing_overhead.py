"""What tracing costs: the same closed-loop load on a server with --tracing and one without, interleaved.

    python -m loadtest.tracing_overhead --users 8 --duration 20s --rounds 2 --out runs/loadtest/tracing

Starts two servers of one bundle on 127.0.0.1 (free ports; `--tracing` exporting over OTLP/gRPC to a
span sink this process runs, so the exporter's serialization and sending are paid as in production),
then loads them by turns, off, on, on, off, ... (`--rounds` of each), so that drifts in a shared
machine's load fall on both alike. The load is loadtest/closed_loop.py's: `--users` closed-loop
users, single texts of the bundle's sentences at beam 5 with word alignment. Each run's requests/s,
p50 and p99 go to stdout and OUT/summary.json, with the medians over the rounds, the ratios on/off
and the spans the sink received.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from loadtest import closed_loop, workload
from loadtest.harness import REPO, RunFailed, free_port, is_serving, parse_duration, tail

MODES = ("off", "on")


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that only counts what it gets."""

    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def start_sink() -> tuple[grpc.Server, SpanSink, int]:
    sink = SpanSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, sink, port


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.tracing_overhead", description=__doc__)
    p.add_argument("--users", "-u", type=int, default=8, help="closed-loop users (default: 8)")
    p.add_argument("--duration", "-t", default="20s", help="each run's length (default: 20s)")
    p.add_argument("--rounds", type=int, default=2, help="runs per mode (default: 2)")
    p.add_argument("--bundle", default="models/default")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    args.duration_s = parse_duration(args.duration)
    if not 1 <= args.users <= 256 or not 0 < args.duration_s <= 600 or args.rounds < 1:
        p.error("users must be 1..256, duration at most 10 minutes, rounds >= 1")
    return args


def start_server(
    bundle: str, mode: str, sink_port: int, out: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable, "-m", "service.serve.server", "--bundle", bundle,
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "-1",
        "--log-level", "WARNING", "--reload-interval-s", "0",
    ]  # fmt: skip
    if mode == "on":
        command.append("--tracing")
    env = dict(os.environ)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{sink_port}",
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
        }
    )
    log = out / f"server-{mode}.log"
    with open(log, "wb") as f:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not is_serving(target):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RunFailed(f"the {mode} server did not start: {tail(log)}")
        time.sleep(0.25)
    return process, target


def run_once(target: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    mix = [closed_loop.translate_kind("single-b5", 1, "", texts, beam=5)]
    load = closed_loop.ClosedLoop(target, mix, args.users).start()
    started = time.monotonic()
    time.sleep(args.duration_s)
    load.stop()
    seconds = time.monotonic() - started
    sent, outcomes = load.tally.snapshot()
    summary = closed_loop.latency_summary(outcomes, seconds)
    summary["errors"] = sum(1 for o in outcomes if o.code != "OK")
    summary["sent"] = sent
    return summary


def paired_ratios(runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """on/off of each figure within each round: the two runs of a round are back to back, so a
    drift in the machine's load between rounds cancels out."""
    rounds = sorted({run["round"] for run in runs})
    out: dict[str, list[float]] = {"rps": [], "p50_ms": [], "p99_ms": []}
    for r in rounds:
        on = next(run for run in runs if run["round"] == r and run["mode"] == "on")
        off = next(run for run in runs if run["round"] == r and run["mode"] == "off")
        for key, values in out.items():
            values.append(on[key] / off[key])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    texts, _ = workload.load_sources()
    sink_server, sink, sink_port = start_sink()
    servers = {mode: start_server(args.bundle, mode, sink_port, args.out) for mode in MODES}
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                result = run_once(servers[mode][1], texts, args) | {"mode": mode, "round": r + 1}
                runs.append(result)
                print(
                    f"round {r + 1} tracing {mode:3s}: {result['rps']:.1f} req/s, "
                    f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, "
                    f"{result['errors']}/{result['sent']} errors",
                    flush=True,
                )
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(30)
        sink_server.stop(1)
    medians = {
        mode: {
            key: statistics.median(run[key] for run in runs if run["mode"] == mode)
            for key in ("rps", "p50_ms", "p99_ms")
        }
        for mode in MODES
    }
    ratios = {key: medians["on"][key] / medians["off"][key] for key in medians["off"]}
    paired = paired_ratios(runs)
    for mode in MODES:
        m = medians[mode]
        print(
            f"median tracing {mode:3s}: {m['rps']:.1f} req/s, p50 {m['p50_ms']:.0f} ms, "
            f"p99 {m['p99_ms']:.0f} ms"
        )
    print(
        f"on/off of the medians: throughput x{ratios['rps']:.3f}, p50 x{ratios['p50_ms']:.3f}, "
        f"p99 x{ratios['p99_ms']:.3f}; spans exported: {sink.spans}"
    )
    print(
        "on/off within each round (median over rounds): "
        + ", ".join(f"{key} x{statistics.median(values):.3f}" for key, values in paired.items())
        + "; per round: "
        + ", ".join(f"{r:.3f}" for r in paired["rps"])
    )
    summary = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
        "medians": medians,
        "ratios": ratios,
        "paired_ratios": paired,
        "spans_exported": sink.spans,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
