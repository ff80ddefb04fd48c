"""Where a bundle's decoding time goes: the engine's wall time split between ONNX Runtime's encoder
calls, its decoder-step calls and the rest (the search in numpy, tokenization), then ONNX Runtime's
own profile of the decoder step, node by node (docs/import.md: a Marian bi-LSTM/GRU model with a
6,000-word output layer).

    OMP_NUM_THREADS=1 python -m benchmarks.decoding.step_profile --bundle BUNDLE --source test.grc \
        --limit 160 --threads 1 [--json out.json]

The first `--limit` lines at beam 5 in batches of 32 with the bundle's decoding defaults, as
served; a warm-up pass, then one timed pass under cProfile and one with the decoder session
profiled (`SessionOptions.enable_profiling`, kernel times summed per node and per operator type).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import onnxruntime as ort

from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions

BATCH, BEAM = 32, 5
ORT_RUN = "run_with_iobinding"


def decode_all(engine: Engine, lines: Sequence[str]) -> None:
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": BEAM})
    for start in range(0, len(lines), BATCH):
        engine.translate(lines[start : start + BATCH], options, "none")


def wall_split(engine: Engine, lines: Sequence[str]) -> dict[str, float]:
    """Seconds under cProfile in the encoder's ONNX Runtime calls, the decoder's, and the rest."""
    profile = cProfile.Profile()
    profile.enable()
    decode_all(engine, lines)
    profile.disable()
    stats = cast(Any, pstats.Stats(profile)).stats  # {(file, line, name): (..., callers)}
    encoder = decoder = total = 0.0
    for (file, _, name), (_, _, _, cumulative, callers) in stats.items():
        if name == "translate" and file.endswith("engine.py"):
            total += cumulative
        if name == ORT_RUN and "onnxruntime" in file:  # the session's method, called by ours
            for (_, _, caller), timing in callers.items():
                if caller == "encode":
                    encoder += timing[3]
                else:
                    decoder += timing[3]
    return {
        "profiled_s": round(total, 3),
        "encoder_s": round(encoder, 3),
        "decoder_step_s": round(decoder, 3),
        "rest_s": round(total - encoder - decoder, 3),
    }


def step_profile(engine: Engine, lines: Sequence[str], threads: int) -> dict[str, Any]:
    """The decoder step's kernel time per operator type and per node (the top 12), in ms."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "step")
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        engine.model.decoder = ort.InferenceSession(
            str(engine.model.decoder_file), options, providers=["CPUExecutionProvider"]
        )
        decode_all(engine, lines)
        events = json.loads(Path(engine.model.decoder.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    by_node: dict[str, float] = defaultdict(float)
    runs = 0
    for event in events:
        if event.get("cat") == "Session" and event["name"] == "model_run":
            runs += 1
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            by_op[op] += event["dur"] / 1e3
            by_node[f"{op} {event['name'].removesuffix('_kernel_time')}"] += event["dur"] / 1e3
    total = sum(by_op.values())

    def table(times: dict[str, float], top: int) -> dict[str, list[float]]:
        ranked = sorted(times.items(), key=lambda kv: -kv[1])[:top]
        return {name: [round(ms, 1), round(100 * ms / total, 1)] for name, ms in ranked}

    return {
        "decoder_runs": runs,
        "kernel_ms": round(total, 1),
        "by_op_ms_percent": table(by_op, 10),
        "by_node_ms_percent": table(by_node, 12),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--source", type=Path, required=True, help="one sentence a line")
    p.add_argument("--limit", type=int, default=160)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    lines = args.source.read_text(encoding="utf-8").splitlines()[: args.limit]
    runtime = RuntimeConfig(
        providers=("CPUExecutionProvider",),
        intra_op_threads=args.threads,
        encoder_threads=args.threads,
    )
    engine = Engine.load(args.bundle, runtime)
    decode_all(engine, lines)  # warm-up
    report = {
        "bundle": str(args.bundle),
        "lines": len(lines),
        "threads": args.threads,
        "wall": wall_split(engine, lines),
        "step": step_profile(engine, lines, args.threads),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
