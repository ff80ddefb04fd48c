"""The HTTP/JSON face's overhead against gRPC: the same locust load on one server, interleaved.

    python -m loadtest.protocols --users 8 --duration 20s --rounds 2 --alignment word \
        --out runs/loadtest/protocols

Starts one server (gRPC and HTTP ports, 127.0.0.1), then runs locust headless against it by turns,
grpc then http, then http then grpc, ... (`--rounds` of each), so that drifts in the shared
machine's load fall on both protocols alike. Each run's aggregated p50/p99 and throughput are
printed as one line and saved in OUT/summary.json, with the medians over the rounds and the
ratios http/grpc. Each run's locust files are in OUT/<protocol>-<round>/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest import workload
from loadtest.harness import (
    AGGREGATED,
    CSV_PREFIX,
    LOCUSTFILE,
    REPO,
    RunFailed,
    free_port,
    is_serving,
    parse_duration,
    read_stats,
    tail,
)

PROTOCOLS = ("grpc", "http")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.protocols", description=__doc__)
    p.add_argument("--users", "-u", type=int, default=8, help="concurrent users (default: 8)")
    p.add_argument("--duration", "-t", default="20s", help="each run's length (default: 20s)")
    p.add_argument("--rounds", type=int, default=2, help="runs per protocol (default: 2)")
    p.add_argument("--mix", default=workload.DEFAULT_MIX, choices=tuple(workload.MIXES))
    p.add_argument("--alignment", default="word", choices=workload.ALIGNMENTS)
    p.add_argument("--bundle", default="models/default")
    p.add_argument("--policy", default="iteration")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    args.duration_s = parse_duration(args.duration)
    return args


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str, str]:
    port, http_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "service.serve.server", "--bundle", args.bundle, "--policy", args.policy,
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "-1",
        "--http-port", str(http_port), "--log-level", "WARNING",
    ]  # fmt: skip
    log = args.out / "server.log"
    with open(log, "wb") as f:
        process = subprocess.Popen(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not is_serving(target):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RunFailed(f"the server did not start: {tail(log)}")
        time.sleep(0.25)
    return process, target, f"http://127.0.0.1:{http_port}"


def run_once(args: argparse.Namespace, protocol: str, host: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(args.users), "-r", str(args.users), "-t", f"{math.ceil(args.duration_s)}s",
        "--host", host, "--stop-timeout", "11s", "--csv", str(out / CSV_PREFIX),
        "--only-summary", "--exit-code-on-error", "0",
    ]  # fmt: skip
    env = dict(os.environ)
    env.update(
        {
            "S2S_LOADTEST_PROTOCOL": protocol,
            workload.ENV_MIX: args.mix,
            workload.ENV_ALIGNMENT: args.alignment,
        }
    )
    with open(out / "locust.log", "wb") as f:
        done = subprocess.run(
            command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600
        )
    if done.returncode != 0:
        raise RunFailed(f"locust exited with {done.returncode}: {tail(out / 'locust.log')}")
    row = read_stats(out / f"{CSV_PREFIX}_stats.csv")[AGGREGATED]
    return {
        "protocol": protocol,
        "requests": row.requests,
        "failures": row.failures,
        "requests_per_s": row.requests_per_s,
        "p50_ms": row.p50_ms,
        "p99_ms": row.p99_ms,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    process, target, url = start_server(args)
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            order = PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]
            for protocol in order:
                host = target if protocol == "grpc" else url
                result = run_once(args, protocol, host, args.out / f"{protocol}-{r + 1}")
                result["round"] = r + 1
                runs.append(result)
                print(
                    f"round {r + 1} {protocol:4s}: {result['requests_per_s']:.1f} req/s, "
                    f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, "
                    f"{result['failures']}/{result['requests']} failed",
                    flush=True,
                )
    finally:
        process.terminate()
        process.wait(30)
    medians = {
        protocol: {
            key: statistics.median(run[key] for run in runs if run["protocol"] == protocol)
            for key in ("requests_per_s", "p50_ms", "p99_ms")
        }
        for protocol in PROTOCOLS
    }
    ratios = {key: medians["http"][key] / medians["grpc"][key] for key in medians["grpc"]}
    for protocol in PROTOCOLS:
        m = medians[protocol]
        print(
            f"median {protocol:4s}: {m['requests_per_s']:.1f} req/s, p50 {m['p50_ms']:.0f} ms, "
            f"p99 {m['p99_ms']:.0f} ms"
        )
    print(
        f"http/grpc: throughput x{ratios['requests_per_s']:.2f}, p50 x{ratios['p50_ms']:.2f}, "
        f"p99 x{ratios['p99_ms']:.2f}"
    )
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    summary.update({"medians": medians, "ratios": ratios})
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
