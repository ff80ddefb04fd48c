"""CPU throughput before and after in one process: the previous runtime module loaded from a file
beside this one, the two engines taking turns (so the shared machine's phases fall on both).

    git show 06fd911:service/decode/runtime.py > /tmp/runtime_06fd911.py
    python docs/benchmarks/ab_inprocess.py --base-runtime /tmp/runtime_06fd911.py [--rounds 6]

Per round, in alternating order: variant (a) of benchmarks.decode (`onnx_batched`, 128 test
sentences, 30 target tokens, beam 1 and 5, the benchmark's runtime settings) and the serving loop
(`benchmarks.serving_loop.run_policy`, iteration policy, 32 users, 8 s, the server's settings).
Prints each figure's median and range over the rounds, and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import serving_loop
from benchmarks.decode import onnx_batched
from loadtest import workload
from service.decode.config import EngineLimits, RuntimeConfig
from service.decode.engine import Engine
from service.decode.runtime import OnnxModel
from service.decode.transfers import TransferLedger
from service.model.bundle import load_bundle
from service.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent.parent


def load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("base_runtime", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-runtime", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    base_runtime = load_module(args.base_runtime)
    bundle = load_bundle(REPO / "models" / "default")
    offline = RuntimeConfig(providers=("CPUExecutionProvider",), spin_wait=True, encoder_threads=0)
    server = RuntimeConfig(providers=("CPUExecutionProvider",))
    models = {
        "before": base_runtime.OnnxModel(bundle, offline),
        "after": OnnxModel(bundle, offline),
    }
    engines = {
        "before": Engine(bundle, base_runtime.OnnxModel(bundle, server), EngineLimits()),
        "after": Engine(bundle, OnnxModel(bundle, server), EngineLimits()),
    }
    engines["before"].model.transfers = TransferLedger()  # the worker watches one; stays at zero
    tok = Tokenizer.load(bundle.file("source.model"))
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()[:128]
    sources = [tok.encode(line.split("\t")[0]) for line in lines]
    texts, _ = workload.load_sources("")
    short, long = workload.split_by_length(texts)
    pools = {
        side: {
            name: [engine.prepare(t) for t in group]
            for name, group in (("short", short), ("long", long), ("all", texts))
        }
        for side, engine in engines.items()
    }
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for m in models.values():
        for beam in (1, 5):
            onnx_batched(m, sources, beam, 30, bundle.architecture.tgt_vocab_size)  # warm-up
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for side in order:
            for beam in (1, 5):
                time.sleep(0.1)
                started = time.perf_counter()
                onnx_batched(models[side], sources, beam, 30, bundle.architecture.tgt_vocab_size)
                seconds = time.perf_counter() - started
                figures[side].setdefault(f"decode (a) beam {beam}", []).append(
                    len(sources) / seconds
                )
            row = serving_loop.run_policy(
                engines[side], "iteration", "mixed", 32, args.seconds, pools[side]
            )
            figures[side].setdefault("serving loop", []).append(float(row["sentences_per_s"]))  # type: ignore[arg-type]
    print(f"sentences/s over {args.rounds} interleaved rounds: median [min-max]")
    for name in figures["after"]:
        before, after = figures["before"][name], figures["after"][name]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        print(
            f"{name}: before {statistics.median(before):.1f} [{min(before):.1f}-{max(before):.1f}], "
            f"after {statistics.median(after):.1f} [{min(after):.1f}-{max(after):.1f}], "
            f"after/before per round: median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
