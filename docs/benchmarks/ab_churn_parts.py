"""Where `ab_churn.py`'s loop spends its time, per runtime call: joins, leaves, steps.

    PYTHONPATH=<checkout> python docs/benchmarks/ab_churn_parts.py LABEL [--runs 4] [--row-ops host]

Runs ab_churn's workload (300 test sentences joining a beam-5 running batch 0-3 at a time, the
server's runtime settings) and times each `OnnxDecoder.add_sentences`, `keep_sentences` and `step`
call, and the decoder session's `run_with_iobinding` inside the steps, with `perf_counter`. Prints
the medians over the runs of each total, in ms. Run it from two checkouts in turns to compare.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import service.decode.runtime as runtime
from service.decode.beam import SearchOptions
from service.decode.config import RuntimeConfig
from service.decode.engine import DecodeRequest, Engine

REPO = Path(__file__).resolve().parent.parent.parent
totals: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started

    return wrapper


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("label")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument(
        "--row-ops", default="", help="RuntimeConfig.row_ops (a checkout that has it); '' = default"
    )
    args = p.parse_args()
    config: dict[str, Any] = {"providers": ("CPUExecutionProvider",)}
    if args.row_ops:
        config["row_ops"] = args.row_ops
    for name in ("add_sentences", "keep_sentences", "step"):
        setattr(runtime.OnnxDecoder, name, timed(name, getattr(runtime.OnnxDecoder, name)))
    engine = Engine.load(REPO / "models" / "default", RuntimeConfig(**config))
    decoder = engine.model.decoder
    decoder.run_with_iobinding = timed("ort_run", decoder.run_with_iobinding)  # type: ignore[method-assign]
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()[:300]
    sentences = [engine.prepare(line.split("\t")[0]) for line in lines]

    def run() -> float:
        rng = random.Random(0)
        batch = engine.new_batch(5)
        pending = list(enumerate(sentences))
        started = time.perf_counter()
        while pending or len(batch):
            joining = [
                pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 2, 3])))
            ]
            batch.add([DecodeRequest(i, s, SearchOptions(beam_size=5), "none") for i, s in joining])
            if len(batch):
                batch.step()
        return time.perf_counter() - started

    run()  # warm-up
    figures: dict[str, list[float]] = {}
    for _ in range(args.runs):
        totals.clear()
        whole = run()
        for name, seconds in [*totals.items(), ("whole run", whole)]:
            figures.setdefault(name, []).append(1000 * seconds)
    print(args.label, ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
