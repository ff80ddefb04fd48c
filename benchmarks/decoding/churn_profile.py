"""Where a Transformer's step goes under continuous batching, beside the same sentences decoded
offline: the step's wall time split into the graph, the cache's upkeep, the encoder rows' changes
and the search's host work, and ONNX Runtime's own profile of the graph by kind of node.

    python -m benchmarks.decoding.churn_profile --bundle models/grc-en-nt-transformer \
        --texts data/grc-en/dev.grc --sentences 200 --threads 2 [--json out.json]

Two runs of the same sentences (beam 5, n-best 2, word alignment, the bundle's decoding rules):

- churn: one running batch that keeps `--inflight` sentences (64: the served figure's clients),
  a new one joining for each that finishes, as the served engine's batch does under load;
- offline: batches of 32 sorted by length, each run to its end (Engine.translate).

Per run: sentences/s, steps, ms a step, and each part's ms a step: `graph` (the decoder-step
session's runs), `cache` (the caches' upkeep outside the graph: CachesInPlace.arrange), `rows`
(the batch's changes before a step: joins, leaves, the encoder rows and their layer parts),
`encode` (the encoder's calls) and `host` (the rest of a step: the search's bookkeeping and
the results). Then the graph's kernels by kind, as % of the kernel time: the self-attentions
(MultiHeadAttention with a past, or GroupQueryAttention), their caches' Gathers (those reading
`self_*`), the cross-attentions, the matrix products (Gemm, MatMul) and the rest.

Runs on any checkout whose engine has the device search (a worktree of an older commit runs it
with `--cache-in-place` left out of its config).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.decode.engine.engine import Engine
from service.decode.runtime import runtime
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.preparation import DecodeRequest

BEAM, BEST, BATCH = 5, 2, 32
PARTS = ("graph", "cache", "rows", "encode")


@contextmanager
def timed(owner: Any, name: str, key: str, totals: defaultdict[str, float]) -> Iterator[None]:
    """Sum the wall time of `owner.name`'s calls into totals[key] (and count them in
    totals[key + "_calls"]) while the block runs."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - started
            totals[key + "_calls"] += 1

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def parts_timed(totals: defaultdict[str, float]) -> Iterator[None]:
    from service.decode.engine import engine
    from service.decode.search import device_search

    patches: list[tuple[Any, str, str]] = [
        (runtime.OnnxModel, "run_step", "graph"),
        (device_search.DeviceSearch, "_bind_changes", "rows"),
        (engine.Engine, "encode", "encode"),
    ]
    try:
        from service.decode.runtime.cache_in_place import CachesInPlace

        patches.append((CachesInPlace, "arrange", "cache"))
    except ImportError:  # a checkout from before the caches in place
        pass
    with _all(patches, totals):
        yield


@contextmanager
def _all(patches: list[tuple[Any, str, str]], totals: defaultdict[str, float]) -> Iterator[None]:
    if not patches:
        yield
        return
    owner, name, key = patches[0]
    with timed(owner, name, key, totals), _all(patches[1:], totals):
        yield


def options_of(engine: Engine) -> SearchOptions:
    rules = {k: v for k, v in engine.decoding_defaults.items() if k not in ("beam_size", "n_best")}
    return SearchOptions(beam_size=BEAM, n_best=BEST, **rules)


def churn(engine: Engine, texts: list[str], inflight: int) -> int:
    """Keep `inflight` sentences in one running batch until every text is done; returns steps."""
    options, batch = options_of(engine), engine.new_batch(BEAM)
    waiting, done, steps = list(enumerate(texts)), 0, 0

    def join(n: int) -> None:
        joining = [waiting.pop(0) for _ in range(min(n, len(waiting)))]
        if joining:
            batch.add([DecodeRequest(i, engine.prepare(t), options, "word") for i, t in joining])

    join(inflight)
    while done < len(texts):
        finished = batch.step()
        steps += 1
        done += len(finished)
        join(len(finished))
    return steps


def offline(engine: Engine, texts: list[str]) -> None:
    """Batches of 32 sorted by length, each to its end."""
    options = options_of(engine)
    order = sorted(texts, key=len)
    for start in range(0, len(order), BATCH):
        engine.translate(order[start : start + BATCH], options, "word")


def measure(engine: Engine, run: Callable[[], object], texts: int) -> dict[str, Any]:
    totals: defaultdict[str, float] = defaultdict(float)
    with parts_timed(totals):
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    steps = max(1, int(totals["graph_calls"]))
    row: dict[str, Any] = {
        "sentences_per_s": round(texts / seconds, 2),
        "steps": steps,
        "ms_a_step": round(1000 * seconds / steps, 2),
    }
    for part in PARTS:
        row[f"{part}_ms"] = round(1000 * totals[part] / steps, 2)
    row["host_ms"] = round(row["ms_a_step"] - sum(row[f"{p}_ms"] for p in PARTS), 2)
    return row


def kernels(path: str) -> dict[str, float]:
    """ONNX Runtime's profile of the search graph: % of kernel time by kind of node."""
    events = json.loads(Path(path).read_text())
    kinds: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        op, inputs = event["args"]["op_name"], event["args"].get("input_type_shape", [])
        kinds[kind_of(op, inputs)] += event["dur"]
    total = sum(kinds.values()) or 1
    return {k: round(100 * v / total, 1) for k, v in kinds.most_common()}


def kind_of(op: str, inputs: list[Any]) -> str:
    """A kernel's kind: self-attention (a past, or GroupQueryAttention), cross-attention, the
    caches' Gathers (4-d data: (rows, heads, entries, d)), products, the rest."""
    if op == "GroupQueryAttention" or (op == "MultiHeadAttention" and len(inputs) > 5):
        return "self-attention"
    if op == "MultiHeadAttention":
        return "cross-attention"
    if op == "Gather" and inputs and len(next(iter(inputs[0].values()))) == 4:
        return "cache gathers"
    if op in ("Gemm", "MatMul", "MatMulInteger", "DynamicQuantizeMatMul"):
        return "products"
    return "other"


def profile_graph(bundle: Path, config: dict[str, Any], texts: list[str], inflight: int,
                  prefix: str) -> dict[str, float]:  # fmt: skip
    """The churn run once more, its search sessions under ONNX Runtime's profiler."""
    engine = Engine.load(bundle, RuntimeConfig(**config))
    engine.model.profile_prefix = prefix
    churn(engine, texts, inflight)
    paths = [s.end_profiling() for s in engine.model._searches.values()]
    biggest = max(paths, key=lambda p: Path(p).stat().st_size)
    return kernels(biggest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt-transformer"))
    parser.add_argument("--texts", type=Path, default=Path("data/grc-en/dev.grc"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--config", type=json.loads, default={},
                        help='more RuntimeConfig fields, e.g. \'{"cache_in_place": false}\'')  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    texts = args.texts.read_text(encoding="utf-8").splitlines()[: args.sentences]
    config = {"providers": ("CPUExecutionProvider",), "intra_op_threads": args.threads,
              **args.config}  # fmt: skip
    engine = Engine.load(args.bundle, RuntimeConfig(**config))
    offline(engine, texts[:BATCH])  # warm-up: the sessions made
    report: dict[str, Any] = {"bundle": str(args.bundle), "sentences": len(texts),
                              "inflight": args.inflight, "config": args.config}  # fmt: skip
    report["churn"] = measure(engine, lambda: churn(engine, texts, args.inflight), len(texts))
    report["offline"] = measure(engine, lambda: offline(engine, texts), len(texts))
    report["churn_kernels"] = profile_graph(args.bundle, config, texts, args.inflight,
                                            "/tmp/churn_profile")  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
