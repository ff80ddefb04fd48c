"""The decode loop alone: closed-loop users submitting the load test's requests straight to a Worker.

    python -m benchmarks.serving.serving_loop [--users 32] [--mix mixed] [--seconds 15] [--policy P ...]

No gRPC, no locust, no tokenizer on the clock's critical path (texts are tokenized before the run):
it measures what the batching policies get out of the engine on this machine, so that a load test's
figures can be split into the engine's capacity and what the network layer and the load generator
take. Each policy runs in the same process on the same engine, one after the other; users submit
their next request as soon as the previous one completes (no think time), with the request kinds
and weights of `loadtest/workload.py`.

It also prints the host↔device bytes per decoder step from the model's transfer ledger
(`service/decode/runtime/transfers.py`): everything the runtime copied during the run (encoder outputs, joining
rows, tokens, top-k, attention) divided by the steps taken, and the part of it per reason.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadtest import workload
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.text.preparation import Prepared
from service.decode.text.translation import Translation
from service.serve.jobs import Job
from service.serve.metrics import Metrics
from service.serve.scheduler import POLICIES, BatchingConfig
from service.serve.worker import Worker

REPO = Path(__file__).resolve().parent.parent.parent


@dataclass
class Tally:
    """Completed requests and their latencies, per request kind."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    sentences: int = 0
    errors: int = 0

    def record(self, kind: str, seconds: float, sentences: int, ok: bool) -> None:
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)
            self.sentences += sentences if ok else 0
            self.errors += 0 if ok else 1


class ClosedLoopUser:
    """Submits one request, and the next from its completion callback, until the run ends."""

    def __init__(
        self,
        worker: Worker,
        pools: dict[str, list[Prepared]],
        weights: dict[str, int],
        tally: Tally,
        stop_at: float,
        seed: int,
    ) -> None:
        self.worker, self.pools, self.tally, self.stop_at = worker, pools, tally, stop_at
        self.kinds = [workload.REQUEST_KINDS[name] for name, w in weights.items() for _ in range(w)]
        self.rng = random.Random(seed)
        self.done = threading.Event()

    def submit_next(self) -> None:
        if time.monotonic() >= self.stop_at:
            self.done.set()
            return
        kind = self.rng.choice(self.kinds)
        pool = self.pools[kind.pool]
        sentences = (
            [self.rng.choice(pool)] if kind.texts == 1 else self.rng.choices(pool, k=kind.texts)
        )
        options = SearchOptions(beam_size=kind.beam, max_length_a=2.0, max_length_b=10)
        started = time.monotonic()

        def on_done(results: list[Translation] | None, error: Exception | None) -> None:
            self.tally.record(kind.name, time.monotonic() - started, len(sentences), error is None)
            self.submit_next()

        self.worker.submit(Job("bench", sentences, options, "none", on_done))


def run_policy(
    engine: Engine,
    policy: str,
    mix: str,
    users: int,
    seconds: float,
    pools: dict[str, list[Prepared]],
) -> dict[str, object]:
    metrics = Metrics()
    worker = Worker(engine, BatchingConfig(policy=policy), metrics)  # type: ignore[arg-type]
    moved_before = engine.model.transfers.snapshot()
    worker.start()
    tally = Tally()
    stop_at = time.monotonic() + seconds
    group = [
        ClosedLoopUser(worker, pools, workload.mix_weights(mix), tally, stop_at, seed)
        for seed in range(users)
    ]
    started = time.monotonic()
    for user in group:
        user.submit_next()
    for user in group:
        user.done.wait(seconds + 60)
    elapsed = time.monotonic() - started
    worker.stop(30)
    moved = engine.model.transfers.snapshot().minus(moved_before)
    steps = metrics.registry.get_sample_value("s2s_decoder_step_duration_seconds_count") or 0.0
    row: dict[str, object] = {
        "policy": policy,
        "sentences_per_s": tally.sentences / elapsed,
        "requests": sum(len(v) for v in tally.latencies.values()),
        "errors": tally.errors,
        "steps": int(steps),
        "bytes_per_step": moved.total_bytes / max(steps, 1.0),
        "bytes_per_step_by_reason": {
            reason: n / max(steps, 1.0) for reason, n in moved.by_reason().items()
        },
    }
    for kind, values in sorted(tally.latencies.items()):
        row[f"{kind} p50/p99 ms"] = "{:.0f}/{:.0f}".format(
            *(1000 * np.percentile(values, [50, 99]))
        )
    return row


def format_transfers(row: dict[str, object]) -> str:
    """'N steps, B bytes/step (reason b, ...)': the ledger's bytes per decoder step."""
    by_reason = row["bytes_per_step_by_reason"]
    assert isinstance(by_reason, dict)
    parts = ", ".join(f"{reason} {n:,.0f}" for reason, n in by_reason.items() if n)
    return f"{row['steps']} steps, {row['bytes_per_step']:,.0f} host<->device bytes/step ({parts})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", default=str(REPO / "models" / "default"))
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--mix", default="mixed", choices=tuple(workload.MIXES))
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--policy", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--threads", type=int, default=0, help="decoder intra-op threads (0: default)")
    p.add_argument("--spin", action="store_true", help="let ONNX Runtime's threads spin-wait")
    args = p.parse_args(argv)
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(
            providers=("CPUExecutionProvider",), intra_op_threads=args.threads, spin_wait=args.spin
        ),
    )
    sources, _ = workload.load_sources("")
    short, long = workload.split_by_length(sources)
    pools = {
        name: [engine.prepare(t) for t in texts]
        for name, texts in (("short", short), ("long", long), ("all", sources))
    }
    rows = [
        run_policy(engine, policy, args.mix, args.users, args.seconds, pools)
        for policy in args.policy
    ]
    base = next((r["sentences_per_s"] for r in rows if r["policy"] == "none"), None)
    for row in rows:
        ratio = f" ({row['sentences_per_s'] / base:.2f}x none)" if base else ""  # type: ignore[operator]
        details = ", ".join(f"{k} {v}" for k, v in row.items() if "p50" in k)
        print(
            f"{args.mix} u{args.users} {row['policy']:9s}: {row['sentences_per_s']:.1f} sentences/s"
            f"{ratio}, {row['requests']} requests, {row['errors']} errors; {details}"
        )
        print(f"  {format_transfers(row)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
