"""What one front process costs per request: its CPU time per Translate, with an engine that answers
at once behind the real channel (benchmarks/serving/instant_engine.py).

    python -m benchmarks.serving.front_cost --bundle models/grc-en-nt --users 16 --seconds 10 \
        [--repeat 3] [--channels 16 1] [--log-level INFO] [--profile OUT.prof] [--json PATH]

The front is started exactly as the supervisor starts one (`python -m service.serve.server --role
front`), on one engine: the instant one. The request is benchmarks.serving.served's: one text of the
bundle's sample texts, beam 5, n-best 2, word alignment. Closed-loop clients in another process
(grpc.aio, the request serialized once, the answer left as bytes: the client costs little) send
one at a time each, over `--channels` HTTP/2 connections. Over the measured window the front's
CPU time (utime + stime from /proc) divided by the requests answered is its cost per request; the
rate it answered is its requests/s at that concurrency (the client shares the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from loadtest.harness import free_port, is_serving

REPO = Path(__file__).resolve().parent.parent.parent
METHOD = "/translation.v1.Translator/Translate"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_bytes(texts: list[str], i: int) -> bytes:
    from proto.translation.v1 import translation_pb2 as pb

    request = pb.TranslateRequest(
        texts=[texts[i % len(texts)]],
        options=pb.DecodingOptions(beam_size=5, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD),
    )
    return request.SerializeToString()


def clients(
    target: str, texts: list[str], users: int, channels: int, seconds: float, out: Any
) -> None:
    """`users` closed-loop callers over `channels` connections for `seconds`: (sent, ok, errors)
    counted within the window (after 1 s of warm-up)."""
    import grpc

    async def run() -> tuple[int, int]:
        pool = [
            grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(channels)
        ]
        calls = [c.unary_unary(METHOD) for c in pool]
        bodies = [request_bytes(texts, i) for i in range(64)]
        ok = errors = 0
        start = time.monotonic()
        window = (start + 1.0, start + 1.0 + seconds)

        async def user(k: int) -> None:
            nonlocal ok, errors
            call, n = calls[k % channels], k
            while time.monotonic() < window[1]:
                began = time.monotonic()
                try:
                    await call(bodies[n % 64], timeout=30)
                    good = True
                except grpc.RpcError:
                    good = False
                n += 1
                if began >= window[0] and time.monotonic() <= window[1]:
                    ok, errors = ok + good, errors + (not good)

        await asyncio.gather(*(user(k) for k in range(users)))
        for c in pool:
            await c.close()
        return ok, errors

    out.put(asyncio.run(run()))


def measure(
    bundle: str,
    users: int,
    channels: int,
    seconds: float,
    profile: str | None,
    tokens: int,
    log_level: str = "WARNING",
) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="s2s-front-cost-"))
    (run_dir / "metrics").mkdir()
    address = f"ipc://{run_dir}/engine"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    env["OMP_NUM_THREADS"] = "1"
    engine = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.serving.instant_engine", address, bundle,
         "--tokens", str(tokens)],
        cwd=REPO, env=env,
    )  # fmt: skip
    prefix = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else [])]
    front = subprocess.Popen(
        [*prefix, "-m", "service.serve.server", "--role", "front", "--run-dir", str(run_dir),
         "--channel", address, "--parent", str(os.getpid()), "--bundle", bundle,
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "-1",
         "--log-level", log_level],
        cwd=REPO, env=env,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not is_serving(target):
            assert front.poll() is None and time.monotonic() < deadline, "the front did not start"
            time.sleep(0.1)
        texts = bundle_texts(Path(bundle))
        queue: Any = multiprocessing.get_context("spawn").Queue()
        load = multiprocessing.get_context("spawn").Process(
            target=clients, args=(target, texts, users, channels, seconds, queue)
        )
        load.start()
        time.sleep(1.0)  # the clients' warm-up
        cpu0, t0 = cpu_seconds(front.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = cpu_seconds(front.pid), time.monotonic()
        ok, errors = queue.get(timeout=120)
        load.join(30)
    finally:
        front.terminate()
        engine.terminate()
        front.wait(30)
        engine.wait(30)
    rate = ok / (t1 - t0)
    return {
        "users": users,
        "channels": channels,
        "log_level": log_level,
        "seconds": round(t1 - t0, 2),
        "requests": ok,
        "errors": errors,
        "requests_per_s": round(rate, 1),
        "front_cpu_us_per_request": round((cpu1 - cpu0) / max(ok, 1) * 1e6, 1),
        "front_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", default=str(REPO / "models" / "grc-en-nt"))
    parser.add_argument("--users", type=int, nargs="+", default=[16])
    parser.add_argument("--channels", type=int, nargs="+", default=[16])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=16, help="target tokens per hypothesis")
    parser.add_argument("--profile", help="cProfile the front into this file (one run)")
    parser.add_argument(
        "--log-level", default="WARNING", help="the front's (INFO writes a line per request)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for users in args.users:
        for channels in args.channels:
            for _ in range(args.repeat):
                row = measure(args.bundle, users, min(channels, users), args.seconds,
                              args.profile, args.tokens, args.log_level)  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bundle": args.bundle, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
