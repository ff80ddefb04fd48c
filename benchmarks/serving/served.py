"""The served figure: one server, one model, closed-loop gRPC clients, on each provider in turn.

    python -m benchmarks.serving.served --bundle models/grc-en-nt --providers cuda cpu --users 32 256 \
        [--seconds 15] [--warmup-s 5] [--json PATH]

For each provider the server is started as users start it (`python -m service.serve.server`, the
CUDA one with `--require-provider cuda`, so a CPU fallback cannot pass for a GPU figure), then for
each concurrency `--users` clients each send one Translate at a time (one text, beam 5, n-best 2,
word alignment, the text drawn from the bundle's sample texts), back to back. The clients run in
several processes (`--client-processes`) so that Python's lock on one client process does not cap
the rate. After a warm-up, requests that start and end inside the measured window count:
sentences/s, p50/p99 latency, errors, and the GPU's utilization over the window (NVML through
nvidia-ml-py when it is installed, else `nvidia-smi`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.sample_texts import bundle_texts
from loadtest.harness import LocalServer, RunFailed, tail

REPO = Path(__file__).resolve().parent.parent.parent
PROVIDER_FLAGS = {
    "cuda": [
        "--providers",
        "CUDAExecutionProvider,CPUExecutionProvider",
        "--require-provider",
        "cuda",
    ],
    "cpu": ["--providers", "CPUExecutionProvider"],
}


def client_process(
    target: str, texts: list[str], users: int, seconds: float, seed: int, out: Any,
    model: str = "", max_length: int | None = None,
) -> None:  # fmt: skip
    """One process's share of the users: run for `seconds`, send back (start, seconds, code);
    `model`: the model asked for ("" the server's default); `max_length`: the requests' cap on
    target tokens (None: the model's rule)."""
    from loadtest.closed_loop import ClosedLoop, translate_kind

    kind = translate_kind("translate", 1, model, texts, max_length=max_length)
    loop = ClosedLoop(target, [kind], users, seed=seed)
    loop.start()
    time.sleep(seconds)
    loop.stop()
    _, outcomes = loop.tally.snapshot()
    out.put([(o.started, o.seconds, o.code) for o in outcomes])


class GpuSampler:
    """GPU utilization (%) every 0.1 s while running: NVML where nvidia-ml-py is installed, else
    nvidia-smi once a second; no samples on a machine without either."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.stopping = threading.Event()
        self.source = "none"
        self.read = self._reader()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _reader(self) -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "nvml"
            return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass
        if shutil.which("nvidia-smi"):
            self.source = "nvidia-smi"

            def smi() -> float:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                return float(out.split()[0])

            return smi
        return None

    def _run(self) -> None:
        period = 0.1 if self.source == "nvml" else 1.0
        while not self.stopping.wait(period):
            with contextlib.suppress(Exception):
                self.samples.append(self.read())

    def __enter__(self) -> GpuSampler:
        if self.read is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()

    def mean(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None


def measure(
    target: str,
    texts: list[str],
    users: int,
    processes: int,
    warmup_s: float,
    seconds: float,
    model: str = "",
    max_length: int | None = None,
) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    shares = [users // processes + (1 if i < users % processes else 0) for i in range(processes)]
    workers = [
        context.Process(
            target=client_process,
            args=(target, texts, share, warmup_s + seconds, i + 1, queue, model, max_length),
        )
        for i, share in enumerate(shares)
        if share
    ]
    for w in workers:
        w.start()
    time.sleep(warmup_s)
    window_start = time.monotonic()
    with GpuSampler() as gpu:
        time.sleep(seconds)
    window_end = time.monotonic()
    outcomes = [o for _ in workers for o in queue.get(timeout=warmup_s + seconds + 120)]
    for w in workers:
        w.join()
    # CLOCK_MONOTONIC is one clock for every process of the machine
    inside = [o for o in outcomes if o[0] >= window_start and o[0] + o[1] <= window_end]
    ok = [o[1] for o in inside if o[2] == "OK"]
    span = window_end - window_start
    # every answer that ended in the window, wherever it started: the rate when a request's
    # latency is a large part of the window (few start and end inside it)
    ended = [o for o in outcomes if window_start <= o[0] + o[1] <= window_end and o[2] == "OK"]
    return {
        "users": users,
        "window_s": round(span, 2),
        "sentences_per_s": len(ok) / span,
        "answered_per_s": len(ended) / span,
        "p50_ms": float(np.percentile(ok, 50) * 1000) if ok else None,
        "p99_ms": float(np.percentile(ok, 99) * 1000) if ok else None,
        "ok": len(ok),
        "errors": sorted({o[2] for o in inside if o[2] != "OK"}),
        "gpu_utilization_pct": gpu.mean(),
        "gpu_utilization_source": gpu.source,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = bundle_texts(args.bundle)
    report: dict[str, Any] = {"bundle": str(args.bundle), "rows": [], "errors": {}}
    # the flags alone configure the servers, not S2S_ variables of this process
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    for provider in args.providers:
        extra = list(args.server_args.get(provider, []))
        flags = ["--http-port", "-1", "--log-level", "WARNING", *PROVIDER_FLAGS[provider], *extra]
        out = Path(tempfile.mkdtemp(prefix=f"served-{provider}-"))
        started = time.monotonic()
        try:
            server = LocalServer.start(
                str(args.bundle.resolve()), "iteration", out, args.start_timeout_s, extra=flags,
                env=env, cwd=args.checkout,
            )  # fmt: skip
        except RunFailed as err:
            report["errors"][provider] = f"RunFailed: {err}"
            print(f"{provider}: failed: {err}")
            continue
        ready_s = time.monotonic() - started
        try:
            for users in args.users:
                row = measure(
                    server.target, texts, users, args.client_processes, args.warmup_s, args.seconds
                )
                row.update(provider=provider, server_args=extra, ready_s=round(ready_s, 1))
                report["rows"].append(row)
                print(json.dumps(row))
        except Exception as err:
            report["errors"][provider] = f"{type(err).__name__}: {err}\n{tail(server.log, 20)}"
            print(f"{provider}: failed: {report['errors'][provider]}")
        finally:
            server.stop()
    add_ratios(report["rows"])
    return report


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's sentences/s over the CPU provider's at the same concurrency."""
    cpu = {r["users"]: r["sentences_per_s"] for r in rows if r["provider"] == "cpu"}
    for r in rows:
        base = cpu.get(r["users"])
        r["x_cpu"] = r["sentences_per_s"] / base if base else None


def table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| provider | clients | sentences/s | ×CPU | p50 ms | p99 ms | GPU util % | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        ratio = "-" if r["x_cpu"] is None else f"{r['x_cpu']:.1f}"
        util = "-" if r["gpu_utilization_pct"] is None else f"{r['gpu_utilization_pct']:.0f}"
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.0f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.0f}"
        lines.append(
            f"| {r['provider']} | {r['users']} | {r['sentences_per_s']:,.1f} | {ratio} "
            f"| {p50} | {p99} | {util} | {', '.join(r['errors']) or '-'} |"
        )
    return lines


def parse_server_args(raw: Sequence[str]) -> dict[str, list[str]]:
    """`cuda=--max-batch-hypotheses 1280 ...` → {"cuda": [...]}."""
    out: dict[str, list[str]] = {}
    for item in raw:
        provider, _, flags = item.partition("=")
        out[provider] = flags.split()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=REPO / "models" / "grc-en-nt")
    p.add_argument("--providers", nargs="+", default=["cuda", "cpu"], choices=list(PROVIDER_FLAGS))
    p.add_argument("--users", type=int, nargs="+", default=[32, 256])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument(
        "--server-args",
        nargs="*",
        default=[],
        help="extra server flags per provider: cuda='--max-batch-hypotheses 1280'",
    )
    p.add_argument("--checkout", type=Path,
                   help="serve from this checkout (a worktree of another commit, its protos made)")  # fmt: skip
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.server_args = parse_server_args(args.server_args)
    report = run(args)
    print("\n".join(table(report)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
