"""One long-lived gRPC channel (HTTP/2) beside many: does one busy connection get the engines'
speed?

    python -m benchmarks.serving.grpc_channels --bundle models/grc-en-nt --users 64 --seconds 15 \
        --repeat 2 --flags "--fronts 2 --engines 2 --intra-op-threads 1" [--json PATH]

One server, laid out by `--flags`; `--users` closed-loop callers send benchmarks.serving.served's
request (one text, beam 5, n-best 2, word alignment) over one channel, then over `--users` channels,
in turns. SO_REUSEPORT gives a connection to one front: over one channel every call goes through
that front, over many they spread over all of them.

The channel between a front and an engine (ZeroMQ) is benchmarks/serving/zmq_channel.py's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from benchmarks.serving.front_cost import clients
from loadtest.harness import LocalServer

REPO = Path(__file__).resolve().parent.parent.parent


def rate(target: str, texts: list[str], users: int, channels: int, seconds: float) -> float:
    queue: Any = multiprocessing.get_context("spawn").Queue()
    load = multiprocessing.get_context("spawn").Process(
        target=clients, args=(target, texts, users, channels, seconds, queue)
    )
    load.start()
    ok, errors = queue.get(timeout=seconds + 120)
    load.join(30)
    assert not errors, f"{errors} errors"
    return ok / seconds


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", type=Path, default=REPO / "models" / "grc-en-nt")
    p.add_argument("--flags", default="--fronts 2 --engines 2 --intra-op-threads 1")
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    flags = ["--http-port", "-1", "--log-level", "WARNING", "--providers", "CPUExecutionProvider",
             *args.flags.split()]  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="channels-"))
    server = LocalServer.start(str(args.bundle), "iteration", out, 180, extra=flags, env=env)
    texts = bundle_texts(args.bundle)
    rows = []
    try:
        for _ in range(args.repeat):
            for channels in (1, args.users):
                sent = rate(server.target, texts, args.users, channels, args.seconds)
                rows.append({"channels": channels, "users": args.users,
                             "sentences_per_s": round(sent, 1)})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    report = {"bundle": str(args.bundle), "flags": flags, "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
