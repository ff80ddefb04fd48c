"""The memory a loaded model version's graphs take, beside the bound: at most twice the bytes of
its graph files and 30 MB (issue 49: one copy of a model's weights, whatever the number of its
sessions).

    python -m benchmarks.serving.model_memory [--models models] [--variants] [--json PATH]

For each bundle of `--models`, three fresh processes (CPU provider, one thread, as an engine loads
it), each paying ONNX Runtime's one-time start-up first (a probe session: counted once a process,
not per model): one reads the bundle's text side alone (tokenizers, a memory table such as
CMUdict's, glossary: `TextSide.of_bundle`), one its link head's lexicon (a table too), one loads
and warms up the whole engine as the server does (`Engine.load`, `warm_up`). The graphs' memory
is the engine's growth less the two tables'. With `--variants`, the model's device search is then made for every beam
size from 1 to 5 and every combination of what its sentences may need (up to its
max_search_sessions), and the growth read again: what a long mixed load can add.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MB = 1_000_000
SLACK_BYTES = 30 * MB

PROBE = r"""
import itertools, json, os, sys
from pathlib import Path

import onnxruntime as ort
from onnx import TensorProto, helper

from service.decode.shared.config import RuntimeConfig
from service.decode.engine.engine import Engine
from service.decode.engine.text_side import TextSide
from service.decode.runtime.graph_bytes import graph_bytes
from service.decode.runtime.lexicon import Lexicon
from service.decode.runtime.search_variant import SearchVariant


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


bundle, part = Path(sys.argv[1]), sys.argv[2]
x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "xy")
add = graph_bytes([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
ort.InferenceSession(add, providers=["CPUExecutionProvider"])  # ONNX Runtime's one-time start-up
start = rss()
out = {}
if part == "text":  # tokenizers, memory table, glossary: what a front holds too
    side = TextSide.of_bundle(bundle, None)
    out["bytes"] = rss() - start
elif part == "lexicon":  # the link head's lookup table
    lexicon = bundle / "link_lexicon.json"
    kept = Lexicon.load(lexicon) if lexicon.exists() else None
    out["bytes"] = rss() - start
else:  # the engine as the server loads it, warmed up
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1))
    engine.warm_up()
    out["bytes"] = rss() - start
    if part == "variants":
        loaded = rss()
        model, cfg = engine.model, engine.cfg
        for K in range(1, 6):
            for coverage, controls, attention, wide in itertools.product([False, True], repeat=4):
                shape = SearchVariant(K, K + 1, cfg.bos_id, cfg.eos_id, cfg.toolkit != "native",
                                    attention=attention, coverage=coverage, controls=controls,
                                    wide=wide)
                try:
                    model.search_session(shape)
                except ValueError:
                    pass
        out["variants"] = rss() - loaded
        out["sessions"] = len(model.search_sessions)
print(json.dumps(out))
"""


def run(bundle: Path, part: str) -> dict[str, Any]:
    """One part measured in a fresh process (ONNX Runtime started first)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(bundle), part], capture_output=True, text=True, check=True
    )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def graph_bytes(bundle: Path) -> int:
    return sum(f.stat().st_size for f in bundle.glob("*.onnx"))


def measure(bundle: Path, variants: bool) -> dict[str, Any]:
    """A bundle's parts, each in its own process: the graphs' memory is the engine's less its
    text side and its link head's lexicon (tables, counted apart)."""
    text, lexicon = run(bundle, "text")["bytes"], run(bundle, "lexicon")["bytes"]
    engine = run(bundle, "variants" if variants else "engine")
    files = graph_bytes(bundle)
    graphs = engine["bytes"] - text - lexicon
    bound = 2 * files + SLACK_BYTES
    row = {
        "bundle": str(bundle),
        "graph_file_bytes": files,
        "engine_bytes": engine["bytes"],
        "text_side_bytes": text,
        "lexicon_bytes": lexicon,
        "graphs_bytes": graphs,
        "bound_bytes": bound,
        "within": graphs <= bound,
    }
    if variants:
        row["every_variant_bytes"] = engine["variants"]
        row["variant_sessions"] = engine["sessions"]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    variants = "every_variant_bytes" in rows[0]
    head = (
        "| bundle | graph files (MB) | engine loaded (MB) | its text side, its lexicon (MB) "
        "| graphs (MB) | bound 2x + 30 (MB) | within |"
    )
    extra = " + every variant (MB, sessions) |" if variants else ""
    lines = [head + extra, "|" + "---|" * (8 if variants else 7)]
    for r in rows:
        line = (
            f"| {Path(r['bundle']).name} | {r['graph_file_bytes'] / MB:.1f} | "
            f"{r['engine_bytes'] / MB:.1f} | {r['text_side_bytes'] / MB:.1f}, "
            f"{r['lexicon_bytes'] / MB:.1f} | {r['graphs_bytes'] / MB:.1f} | "
            f"{r['bound_bytes'] / MB:.1f} | {'yes' if r['within'] else 'NO'} |"
        )
        if variants:
            line += f" {r['every_variant_bytes'] / MB:.1f} ({r['variant_sessions']}) |"
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bundles = sorted(p.parent for p in args.models.glob("*/manifest.json"))
    rows = [measure(b, args.variants) for b in bundles]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        args.json.with_suffix(".txt").write_text(table(rows) + "\n")
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
