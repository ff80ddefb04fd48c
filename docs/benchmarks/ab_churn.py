"""The serving loop's decode path without its threads, timed in wall and CPU seconds, for A/B runs.

    PYTHONPATH=<checkout> python docs/benchmarks/ab_churn.py [--runs 5]

300 test sentences of the default model join a beam-5 running batch 0-3 at a time before each step
(seeded) and leave when they finish: joins and leaves on most steps, as under iteration-level
batching, through `RunningBatch` (the worker's calls) with the server's runtime settings. CPU
seconds (`time.process_time`, every thread of the process) are what the work costs; wall seconds
also carry what the shared machine took from it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from service.decode.beam import SearchOptions
from service.decode.config import RuntimeConfig
from service.decode.engine import DecodeRequest, Engine

REPO = Path(__file__).resolve().parent.parent.parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--label", default="")
    args = p.parse_args()
    engine = Engine.load(
        REPO / "models" / "default", RuntimeConfig(providers=("CPUExecutionProvider",))
    )
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()[:300]
    sentences = [engine.prepare(line.split("\t")[0]) for line in lines]

    def run() -> tuple[float, float, int]:
        rng = random.Random(0)
        batch = engine.new_batch(5)
        pending = list(enumerate(sentences))
        steps = 0
        wall, cpu = time.perf_counter(), time.process_time()
        while pending or len(batch):
            joining = [
                pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 2, 3])))
            ]
            batch.add([DecodeRequest(i, s, SearchOptions(beam_size=5), "none") for i, s in joining])
            if len(batch):
                batch.step()
                steps += 1
        return time.perf_counter() - wall, time.process_time() - cpu, steps

    run()  # warm-up
    walls, cpus = [], []
    for _ in range(args.runs):
        wall, cpu, steps = run()
        walls.append(wall)
        cpus.append(cpu)
    print(
        f"{args.label} {steps} steps: wall median {statistics.median(walls):.3f} s "
        f"(min {min(walls):.3f}), CPU median {statistics.median(cpus):.3f} s (min {min(cpus):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
