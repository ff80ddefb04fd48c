"""Per-call cost of a join and a leave: the runtime before (a file), graph row ops, host row ops.

    git show a0a0af5:service/decode/runtime.py > /tmp/runtime_before.py
    PYTHONPATH=. python docs/benchmarks/ab_rowops_calls.py /tmp/runtime_before.py

A 32-sentence batch of the default model; one sentence joins and one leaves (the last row fills
the hole, as the search's compaction does) 400 times; the three take turns over 7 rounds; prints
the medians in µs per call.
"""

import importlib.util
import statistics
import sys
import time

import numpy as np

import service.decode.runtime as new_rt
from service.decode.config import RuntimeConfig
from service.model.bundle import load_bundle

spec = importlib.util.spec_from_file_location("base_runtime", sys.argv[1])
assert spec is not None and spec.loader is not None
old_rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_rt)
bundle = load_bundle("models/default")
cfg = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
models = {
    "before": old_rt.OnnxModel(bundle, cfg),
    "host": new_rt.OnnxModel(bundle, cfg),
    "graph": new_rt.OnnxModel(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, row_ops="graph"),
    ),
}
rng = np.random.default_rng(0)
ids = [list(rng.integers(4, 300, size=rng.integers(10, 40))) for _ in range(64)]
enc = {k: m.encode_sentences(ids) for k, m in models.items()}


def churn(name, reps=400):
    m = models[name]
    d = m.new_decoder()
    S = enc[name]
    d.add_sentences(S[:32])
    n = 32
    t_add = t_keep = 0.0
    for i in range(reps):
        t0 = time.perf_counter()
        d.add_sentences([S[32 + i % 32]])
        t1 = time.perf_counter()
        n += 1
        keep = np.arange(n)
        drop = (i * 7) % n
        keep = np.concatenate([keep[:drop], keep[drop + 1 :]])
        # compaction like the search: last row fills the hole
        order = np.arange(n - 1)
        if drop < n - 1:
            order[drop] = n - 1
        t2 = time.perf_counter()
        d.keep_sentences(order)
        t3 = time.perf_counter()
        n -= 1
        t_add += t1 - t0
        t_keep += t3 - t2
    return t_add / reps * 1e6, t_keep / reps * 1e6


res = {k: [] for k in models}
for r in range(7):
    for k in ["before", "host", "graph"] if r % 2 == 0 else ["graph", "host", "before"]:
        res[k].append(churn(k))
for k, v in res.items():
    print(
        k,
        "join µs median",
        round(statistics.median(a for a, _ in v), 1),
        "leave µs median",
        round(statistics.median(b for _, b in v), 1),
    )
