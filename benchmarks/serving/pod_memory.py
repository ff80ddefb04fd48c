"""Resident memory of a server's processes, idle and after load: what a pod's memory limit covers.

    python -m benchmarks.serving.pod_memory --models models --users 64 --seconds 30 \
        [--flags "--fronts 1 --engines 2 --intra-op-threads 1"] [--json PATH]

Starts the server on the repository (every model loaded, as the images serve it), reads each
process's VmRSS (the supervisor and its children, by role from its log), loads it with
benchmarks.serving.served's closed loop on the Greek model (the largest: beam 5, n-best 2, word
alignment), and reads them again.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from benchmarks.serving.served import measure
from loadtest.harness import LocalServer

REPO = Path(__file__).resolve().parent.parent.parent


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def processes(server: LocalServer) -> dict[str, int]:
    """The supervisor and its live children, by role and index (from its log)."""
    out = {"supervisor": server.process.pid}
    for line in server.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("message") == "process started":
            out[f"{entry['role']}-{entry['index']}"] = entry["pid"]
    return {name: pid for name, pid in out.items() if Path(f"/proc/{pid}").exists()}


def reading(server: LocalServer) -> dict[str, float]:
    found = {name: round(rss_mib(pid), 1) for name, pid in processes(server).items()}
    found["total"] = round(sum(found.values()), 1)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default=str(REPO / "models"))
    p.add_argument("--flags", default="--fronts 1 --engines 2 --intra-op-threads 1")
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    out = Path(tempfile.mkdtemp(prefix="pod-memory-"))
    flags = ["--http-port", "-1", "--log-level", "INFO", "--providers", "CPUExecutionProvider",
             *args.flags.split()]  # fmt: skip
    server = LocalServer.start("", "iteration", out, 300, models=args.models, extra=flags, env=env)
    try:
        idle = reading(server)
        texts = bundle_texts(REPO / "models" / "grc-en-nt")
        load = measure(server.target, texts, args.users, 1, 5.0, args.seconds, "grc-en-nt")
        loaded = reading(server)
    finally:
        server.stop()
    report: dict[str, Any] = {"flags": flags, "models": args.models, "idle_mib": idle,
                              "after_load_mib": loaded, "load": load}  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
