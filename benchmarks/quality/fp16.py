"""The float16 decoder step's quality beside float32's on John: `Align`'s AER (each link mode) and
`Translate`'s BLEU and chrF, through the serving engine, as benchmarks/alignment/grc_en.py measures
them.

    python -m benchmarks.quality.fp16 [--bundle models/grc-en-nt] [--data data/grc-en]
        [--limit N] [--json docs/benchmarks/fp16-quality-john.json]

RuntimeConfig.fp16_decoder converts the decoder step with onnxruntime's own float16 converter
(service/decode/runtime/runtime.py's float16_decoder: inputs, outputs, log-softmax and top k kept
float32). On the CPU provider ONNX Runtime runs it with casts to float32 around the nodes it has no
float16 kernel for: every value between nodes is rounded to float16 as on a GPU, the arithmetic
inside a node is float32 (a GPU's float16 matrix products accumulate in float32 too). The quality
figures stand for a GPU's; its speed on the CPU means nothing (it is not measured here). The
encoder and the link head stay float32.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from benchmarks.alignment.grc_en import Row, ensure_data, read_split, served_rows, translate_row
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig


def load(bundle: Path, fp16: bool, threads: int) -> Engine:
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=threads, fp16_decoder=fp16
    )
    engine = Engine.load(bundle, config, EngineLimits(max_source_tokens=1024, max_length=1024))
    engine.warm_up()
    return engine


def table(rows: dict[str, list[Row]]) -> list[str]:
    """fp32's and fp16's rows side by side."""
    lines = [
        "| system | AER fp32 | AER fp16 | BLEU fp32 | BLEU fp16 | chrF fp32 | chrF fp16 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for r32, r16 in zip(rows["fp32"], rows["fp16"], strict=True):
        lines.append(
            f"| {r32.system} | {cell(r32.aer, 3)} | {cell(r16.aer, 3)} | {cell(r32.bleu, 2)} "
            f"| {cell(r16.bleu, 2)} | {cell(r32.chrf, 2)} | {cell(r16.chrf, 2)} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--limit", type=int, help="only the first N verses of John")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    ensure_data(args.data)
    test = read_split(args.data, "test", args.limit)
    rows: dict[str, list[Row]] = {}
    seconds: dict[str, float] = {}
    for name, fp16 in (("fp32", False), ("fp16", True)):
        started = time.perf_counter()
        engine = load(args.bundle, fp16, args.threads)
        rows[name] = [*served_rows(engine, test), translate_row(engine, test, args.beam)]
        seconds[name] = time.perf_counter() - started
        print(f"{name}: {seconds[name]:.0f} s", flush=True)
    title = f"John: {len(test)} verses ({args.bundle}), CPU provider, beam {args.beam}"
    print("\n".join(["", title, "", *table(rows)]))
    if args.json:
        report = {
            "title": title,
            "rows": {k: [asdict(r) for r in v] for k, v in rows.items()},
            "seconds": seconds,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
