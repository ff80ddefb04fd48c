"""The host's microseconds a decode step, with a model that costs nothing: today's search beside the
device search, in the same run.

    python -m benchmarks.decoding.search_host [--batches 1 16 64 256 1024] [--rounds 5]
        [--searches device host] [--json docs/benchmarks/search-host.json]

Through the real runtime and search over the instant bundle (benchmarks/decoding/instant.py), on
the CPU provider with one thread, at beam 5: the engine's model (`Engine.load`, its encoder) and a
running batch's search, `DeviceSearch` (search "device") or today's `BeamSearch` over an
`OnnxDecoder` (search "host"), as `RunningBatch` drives them (the engine's conversion of each
finished sentence to text and alignment, the same for both, is left out):

- **static**: B sentences join together and decode 30 steps (each would end later, so all reach
  the maximum length together and finish there): µs a step = the whole run (the join, 30 steps,
  the n-best lists) / 30;
- **churn**: B sentences running, each ending at its own length (drawn between L/2 and 3L/2
  steps, L = min(B, 256): about one sentence leaves a step up to 256 sentences, as in
  benchmarks.gpu.decode_loop's churn, and four at 1,024, whose sentences would otherwise live a
  thousand steps); before each step the batch is filled up to B again from a pool of encoded
  sentences: µs a step over `--steps` steps, after B warm-up steps.

The host's µs are CPU time (`time.thread_time`: the search runs in this thread, ONNX Runtime's
single intra-op thread included): on this shared 2-core machine the wall clock also counts the
other processes' turns (both are reported; the load average moved the wall figures 2-3x between
runs). Each figure is the median of `--rounds` rounds, the searches interleaved round by round.
"in run" is the part of a step inside ONNX Runtime's `run_with_iobinding` (every session's: the
decoder step with its search graph, the row updates), the rest is Python, numpy and binding.
Sentences are encoded before the clock starts, as the server's encode-ahead thread does.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.decoding.instant import build_instant_bundle, instant_text
from service.decode.engine.engine import Engine
from service.decode.runtime.encoded import EncodedSentence
from service.decode.search.beam import BeamSearch
from service.decode.search.device_search import DeviceSearch
from service.decode.search.search import Joining
from service.decode.shared.config import SEARCHES, RuntimeConfig
from service.decode.shared.options import SearchOptions

BEAM = 5
STATIC_STEPS = 30
STATIC_LENGTH = 40  # every static sentence would end after 40 tokens: all reach the 30-step cap
FLOORS = {(256, "static"): 150.0, (256, "churn"): 250.0, (1024, "static"): 400.0}


class RunClock:
    """CPU time spent inside every session's run_with_iobinding while it is installed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[RunClock]:
        original = ort.InferenceSession.run_with_iobinding

        def timed(session: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return original(session, *args, **kwargs)
            finally:
                self.seconds += time.thread_time() - started

        ort.InferenceSession.run_with_iobinding = timed  # type: ignore[method-assign]
        try:
            yield self
        finally:
            ort.InferenceSession.run_with_iobinding = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Timing:
    """µs a step: CPU time, wall time, CPU time inside run."""

    cpu: float
    wall: float
    run: float


def load(bundle: Path, search: str, threads: int) -> Engine:
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",),
        intra_op_threads=threads,
        encoder_threads=1,
        search=search,
    )
    return Engine.load(bundle, config)


class Runner:
    """One running batch's search, as RunningBatch drives it: joining sentences' encoder rows,
    then steps."""

    def __init__(self, engine: Engine) -> None:
        cfg, model = engine.cfg, engine.model
        self.device: DeviceSearch | None = None
        self.search: BeamSearch | None = None
        if model.config.search == "device":
            self.device = DeviceSearch(model, BEAM, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size)
        else:
            self.decoder = model.new_decoder()
            self.search = BeamSearch(
                self.decoder, BEAM, cfg.bos_id, cfg.eos_id, vocab_size=cfg.tgt_vocab_size
            )

    def __len__(self) -> int:
        return len(self.device) if self.device is not None else len(self.search or ())

    def add(self, keys: list[int], encoded: list[EncodedSentence], options: SearchOptions) -> None:
        if self.device is not None:
            self.device.add(
                [
                    Joining(key, sentence, options)
                    for key, sentence in zip(keys, encoded, strict=True)
                ]
            )
            return
        assert self.search is not None
        row = self.decoder.add_sentences(encoded)
        for i, (key, sentence) in enumerate(zip(keys, encoded, strict=True)):
            self.search.add(key, sentence.length, options, row + i)

    def step(self) -> int:
        """One step; returns the sentences done."""
        search = self.device if self.device is not None else self.search
        assert search is not None
        return len(search.step())


class Pool:
    """Sentences encoded once, handed out in turn (the same order for every search)."""

    def __init__(self, engine: Engine, texts: list[str], options: SearchOptions) -> None:
        prepared = [engine.prepare(t) for t in texts]
        self.encoded = [rows[0] for rows in engine.encode(prepared)]
        self.options = options
        self.keys = itertools.count()
        self.next = itertools.cycle(range(len(texts)))

    def take(self, n: int) -> tuple[list[int], list[EncodedSentence], SearchOptions]:
        picks = [next(self.next) for _ in range(n)]
        return [next(self.keys) for _ in picks], [self.encoded[i] for i in picks], self.options


def static_round(engine: Engine, pool: Pool, B: int) -> Timing:
    """B sentences decoding STATIC_STEPS steps together."""
    keys, encoded, options = pool.take(B)
    runner = Runner(engine)
    steps = 0
    with RunClock().installed() as clock:
        cpu, wall = time.thread_time(), time.perf_counter()
        runner.add(keys, encoded, options)
        while len(runner):
            runner.step()
            steps += 1
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert steps == STATIC_STEPS, steps
    return Timing(cpu / steps * 1e6, wall / steps * 1e6, clock.seconds / steps * 1e6)


def churn_round(engine: Engine, pool: Pool, B: int, steps: int) -> tuple[Timing, float]:
    """B sentences running, the batch filled up to B before every step, over `steps` steps after
    B warm-up steps; and the sentences joining a step."""
    runner = Runner(engine)
    joined = 0

    def step() -> int:
        n = B - len(runner)
        if n:
            runner.add(*pool.take(n))
        runner.step()
        return n

    for _ in range(max(B, 8)):
        step()
    with RunClock().installed() as clock:
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(steps):
            joined += step()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    timing = Timing(cpu / steps * 1e6, wall / steps * 1e6, clock.seconds / steps * 1e6)
    return timing, joined / steps


MAX_LIFETIME = 256  # churn sentences live at most ~1.5x this many steps


def churn_texts(B: int, n: int) -> list[str]:
    """n sources whose sentences live between L/2 and 3L/2 steps (at least 2), evenly spread,
    L = min(B, MAX_LIFETIME): about B/L sentences leave a step."""
    L = min(B, MAX_LIFETIME)
    low = max(2, L // 2)
    high = max(low + 1, 3 * L // 2)
    rng = np.random.default_rng(B)
    return [instant_text(int(rng.integers(low, high)), seed) for seed in range(n)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    bundle = build_instant_bundle(Path(tempfile.mkdtemp(prefix="instant-")))
    engines = {s: load(bundle, s, args.threads) for s in args.searches}
    static_options = SearchOptions(
        beam_size=BEAM,
        max_length_a=0.0,
        max_length_b=STATIC_STEPS,
        max_length=STATIC_STEPS,
        return_attention=args.attention,
    )
    report: dict[str, Any] = {
        "beam": BEAM,
        "threads": args.threads,
        "attention": args.attention,
        "rounds": args.rounds,
        "rows": [],
    }
    static_texts = [instant_text(STATIC_LENGTH, seed) for seed in range(max(args.batches))]
    for B in args.batches:
        churn_options = SearchOptions(
            beam_size=BEAM,
            max_length_a=0.0,
            max_length_b=2 * MAX_LIFETIME + 8,
            max_length=2 * MAX_LIFETIME + 8,
            return_attention=args.attention,
        )
        texts = churn_texts(B, 2 * B + args.steps + 64)
        pools = {
            s: (Pool(e, static_texts, static_options), Pool(e, texts, churn_options))
            for s, e in engines.items()
        }
        samples: dict[str, dict[str, list[float]]] = {s: {} for s in args.searches}
        for _ in range(args.rounds):
            for search, engine in engines.items():
                static_pool, churn_pool = pools[search]
                timings = {"static": static_round(engine, static_pool, B)}
                timings["churn"], joining = churn_round(engine, churn_pool, B, args.steps)
                got = samples[search]
                got.setdefault("joining", []).append(joining)
                for kind, t in timings.items():
                    for field in ("cpu", "wall", "run"):
                        got.setdefault(f"{kind}_{field}", []).append(getattr(t, field))
        for search in args.searches:
            row: dict[str, Any] = {"search": search, "sentences": B, "hypotheses": BEAM * B}
            row.update({k: statistics.median(v) for k, v in samples[search].items()})
            row["samples"] = samples[search]
            report["rows"].append(row)
            print(line(row), flush=True)
    return report


def line(row: dict[str, Any]) -> str:
    return (
        f"{row['search']:6s} B {row['sentences']:5d}: static {row['static_cpu']:8.0f} us/step "
        f"(wall {row['static_wall']:6.0f}, in run {row['static_run']:6.0f}) | churn "
        f"{row['churn_cpu']:8.0f} us/step (wall {row['churn_wall']:6.0f}, in run "
        f"{row['churn_run']:6.0f}, {row['joining']:.1f} joining a step)"
    )


def table(report: dict[str, Any]) -> list[str]:
    """The report as a Markdown table, each search's row beside the other's, with the floors."""
    lines = [
        "| sentences × beam | search | static µs/step: CPU | in run | wall | churn µs/step: CPU "
        "| in run | wall | joining/step | floor (CPU) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["rows"]:
        B = row["sentences"]
        floors = [
            f"{kind} ≤ {FLOORS[(B, kind)]:.0f}"
            for kind in ("static", "churn")
            if (B, kind) in FLOORS
        ]
        lines.append(
            f"| {B} × {BEAM} | {row['search']} | {row['static_cpu']:,.0f} "
            f"| {row['static_run']:,.0f} | {row['static_wall']:,.0f} | {row['churn_cpu']:,.0f} "
            f"| {row['churn_run']:,.0f} | {row['churn_wall']:,.0f} | {row['joining']:.1f} "
            f"| {', '.join(floors) if row['search'] == 'device' else ''} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    p.add_argument("--searches", nargs="+", default=list(SEARCHES[::-1]), choices=SEARCHES)
    p.add_argument("--rounds", type=int, default=5, help="rounds per figure (the median counts)")
    p.add_argument("--steps", type=int, default=40, help="churn steps timed (after B warm-up ones)")
    p.add_argument("--threads", type=int, default=1, help="the decoder session's threads")
    p.add_argument(
        "--attention",
        action="store_true",
        help="every sentence asks for its attention (return_attention: an alignment)",
    )
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = p.parse_args(argv)
    report = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(["", *table(report)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
