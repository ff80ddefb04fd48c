"""What a bundle's link head costs, beside another head on the same model, in one run.

    python -m benchmarks.alignment.link_head --bundle models/grc-en-nt \
        --baseline git:2328693:models/grc-en-nt/link_head.onnx \
        --json docs/benchmarks/link-head-cost.json

`--baseline` is a link head graph for the same bundle (a path, or `git:REV:PATH` read from the
repository at run time); it is put in a temporary copy of the bundle (the other files linked, the
manifest re-hashed), so that both heads run with the same encoder, decoder and thresholds. On the
split's pairs (John by default: speed only, no gold is read), one thread, rounds interleaved and
the best kept:

- **Align**: `align()` in static batches of 64 with links "head" (the served pass: encoder, the
  teacher-forced decoder, one head call per pair), and with links "grow" (the same pass without
  the head), in pairs/s;
- **the head alone**: one `LinkHead.logits` call per pair (its lexicon features, pooling and the
  graph), in ms per pair;
- **where the head's time goes**: ONNX Runtime's profile of the graph over the pairs, the share of
  each operator type;
- the graph's size in MB.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.alignment.align_modes import read_split
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.pair_answers import prepare_pair
from service.decode.engine.engine import Engine
from service.decode.runtime.link_head import GRAPH, head_inputs
from service.decode.shared.alignment import mean_pool
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.model.bundle import MANIFEST, add_files

BATCH = 64


def load(bundle: Path) -> Engine:
    return Engine.load(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1),
        EngineLimits(max_source_tokens=4096, max_length=4096),
    )


def read_graph(spec: str, into: Path) -> Path:
    """A head graph named by a path or `git:REV:PATH`, as a file (`into` for a git one)."""
    if not spec.startswith("git:"):
        return Path(spec)
    into.write_bytes(
        subprocess.run(["git", "show", spec[4:]], check=True, capture_output=True).stdout
    )
    return into


def with_head(bundle: Path, graph: Path, into: Path) -> Path:
    """A copy of `bundle` at `into` whose link head graph is `graph` (other files linked)."""
    into.mkdir(parents=True)
    for f in bundle.iterdir():
        if f.name not in (GRAPH, MANIFEST):
            (into / f.name).symlink_to(f.resolve())
    shutil.copyfile(bundle / MANIFEST, into / MANIFEST)
    shutil.copyfile(graph, into / GRAPH)
    add_files(into, [GRAPH])
    return into


def align_seconds(engine: Engine, pairs: list[tuple[str, str]], links: str) -> float:
    options = AlignOptions(links=links, matrices="none")
    started = time.perf_counter()
    for i in range(0, len(pairs), BATCH):
        align(engine, pairs[i : i + BATCH], options)
    return time.perf_counter() - started


HeadCall = tuple[Callable[[], Any], dict[str, np.ndarray]]


def head_calls(engine: Engine, pairs: list[tuple[str, str]]) -> list[HeadCall]:
    """Per pair: a call of the head as Align makes it, and the graph's inputs (for the profile)."""
    head = engine.link_head
    assert head is not None
    calls: list[HeadCall] = []
    for i in range(0, len(pairs), BATCH):
        prepared = [prepare_pair(engine, s, t) for s, t in pairs[i : i + BATCH]]
        encoded = engine.encode([p.source for p in prepared])
        for p, rows in zip(prepared, encoded, strict=True):
            states = rows[0].values  # (P_s, D)
            src, tgt = p.src, p.tgt
            args = (states, src.words, src.ids, src.word_of, tgt.words, tgt.ids, tgt.word_of)
            lexicon = head.lexicon
            assert lexicon is not None, "the link head is shipped with its lexicon"
            features = lexicon.features(src.words, tgt.words)
            word_states = mean_pool(src.word_of, len(src.words)) @ states
            inputs = head_inputs(word_states, src.ids, src.word_of, tgt.ids, tgt.word_of, features)
            calls.append((partial(head.logits, *args), inputs))
    return calls


def head_seconds(calls: list[HeadCall]) -> float:
    started = time.perf_counter()
    for call, _ in calls:
        call()
    return time.perf_counter() - started


def op_shares(graph: Path, calls: list[HeadCall], folder: Path) -> dict[str, float]:
    """The share of the graph's kernel time per operator type (ONNX Runtime's profile)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "profile")
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    for _, inputs in calls:
        session.run(None, inputs)
    events = json.loads(Path(session.end_profiling()).read_text())
    times: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["args"]["op_name"]] += e["dur"]
    total = sum(times.values())
    return {op: round(t / total, 3) for op, t in times.most_common(6)}


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    pairs, _ = read_split(args.data, args.split, "grc", "en")
    pairs = pairs[: args.limit or None]
    baseline_graph = read_graph(args.baseline, folder / "baseline.onnx")
    heads = {
        "bundle": args.bundle,
        "baseline": with_head(args.bundle, baseline_graph, folder / "baseline"),
    }
    engines = {name: load(path) for name, path in heads.items()}
    calls = {name: head_calls(engine, pairs) for name, engine in engines.items()}
    for engine in engines.values():  # warm-up, not timed: sessions' first runs allocate
        align_seconds(engine, pairs[:BATCH], "head")
    runs: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(args.rounds):  # interleaved: every run sees the same machine
        for name, engine in engines.items():
            runs[f"{name} align"].append(align_seconds(engine, pairs, "head"))
            runs[f"{name} head"].append(head_seconds(calls[name]))
        runs["no head align"].append(align_seconds(engines["bundle"], pairs, "grow"))
    best = {k: min(v) for k, v in runs.items()}
    n = len(pairs)
    rows = {
        name: {
            "graph": str(args.bundle / GRAPH) if name == "bundle" else args.baseline,
            "mb": round((heads[name] / GRAPH).stat().st_size / 1e6, 1),
            "align_pairs_per_s": round(n / best[f"{name} align"], 1),
            "head_ms_per_pair": round(1000 * best[f"{name} head"] / n, 3),
            "head_share_of_align": round(best[f"{name} head"] / best[f"{name} align"], 3),
            "op_shares": op_shares(heads[name] / GRAPH, calls[name], folder),
        }
        for name in heads
    }
    return {
        "split": args.split,
        "pairs": n,
        "rounds": args.rounds,
        "threads": 1,
        "no_head_align_pairs_per_s": round(n / best["no head align"], 1),
        "heads": rows,
        "align_speedup": round(
            rows["bundle"]["align_pairs_per_s"] / rows["baseline"]["align_pairs_per_s"], 3
        ),
        "seconds": {k: [round(x, 3) for x in v] for k, v in runs.items()},
    }


def table(r: dict[str, Any]) -> str:
    lines = [
        f"Link head cost, {r['split']} ({r['pairs']} pairs), 1 thread, best of {r['rounds']} "
        f"interleaved rounds; Align without a head (links grow): "
        f"{r['no_head_align_pairs_per_s']} pairs/s",
        "",
        "| head | MB | Align pairs/s | head ms/pair | head's share of Align | top operators |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, h in r["heads"].items():
        ops = ", ".join(f"{op} {share:.0%}" for op, share in list(h["op_shares"].items())[:3])
        lines.append(
            f"| {name}: {h['graph']} | {h['mb']} | {h['align_pairs_per_s']} | "
            f"{h['head_ms_per_pair']} | {h['head_share_of_align']:.0%} | {ops} |"
        )
    lines += ["", f"Align with the bundle's head: {r['align_speedup']:.2f}x the baseline's pairs/s"]
    return "\n".join(lines)


def report(
    args: argparse.Namespace,
    measure: Callable[[argparse.Namespace, Path], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """A benchmark of this group run as its main: `measure` at one OpenMP thread in a temporary
    folder, its table printed and, with --json, written beside the figures."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args, Path(tmp))
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        args.json.with_suffix(".txt").write_text(table(result) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.alignment.link_head", description=__doc__
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument(
        "--baseline",
        default="git:2328693:models/grc-en-nt/link_head.onnx",
        help="the head to compare with: a graph's path or git:REV:PATH (default: %(default)s)",
    )
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--split", default="test", help="whose pairs (speed only; default: John)")
    p.add_argument("--limit", type=int, default=0, help="the first N pairs only")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the figures here, and the table beside it")
    return report(p.parse_args(argv), measure, table)


if __name__ == "__main__":
    raise SystemExit(main())
