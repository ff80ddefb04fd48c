"""Quality and speed of a bundle as served: the serving engine (not PyTorch) on a test split,
fp32 and int8 decoder graphs side by side.

    python -m benchmarks.quality.int8 --bundle models/default --test docs/eval/test.tsv --beam 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from export.data.corpus import read_tsv
from export.metrics.scoring import score
from service.decode.beam import SearchOptions
from service.decode.config import RuntimeConfig
from service.decode.engine import Engine


def evaluate_engine(
    engine: Engine, pairs: list[tuple[str, str]], beam: int, batch_size: int
) -> dict[str, Any]:
    options = SearchOptions(beam_size=beam)
    sources = [s for s, _ in pairs]
    order = sorted(
        range(len(sources)), key=lambda i: len(sources[i])
    )  # similar lengths batch together
    hyps = [""] * len(sources)
    started = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        for i, t in zip(
            idx, engine.translate([sources[i] for i in idx], options, "none"), strict=True
        ):
            hyps[i] = t.hypotheses[0].text
    seconds = time.perf_counter() - started
    result = score(hyps, [t for _, t in pairs])
    result.update({"seconds": round(seconds, 2), "sentences_per_s": round(len(pairs) / seconds, 1)})
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--test", type=Path, default=Path("docs/eval/test.tsv"))
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    pairs = read_tsv(args.test)
    report: dict[str, Any] = {
        "bundle": str(args.bundle),
        "test": str(args.test),
        "beam": args.beam,
        "sentences": len(pairs),
    }
    for name, int8 in (("fp32", False), ("int8", True)):
        runtime = RuntimeConfig(
            providers=("CPUExecutionProvider",), intra_op_threads=args.threads, int8_decoder=int8
        )
        report[name] = evaluate_engine(
            Engine.load(args.bundle, runtime), pairs, args.beam, args.batch_size
        )
        print(name, json.dumps(report[name]))
    fp32, int8 = report["fp32"], report["int8"]
    print(
        f"int8 vs fp32: BLEU {int8['bleu'] - fp32['bleu']:+.2f}, exact match {int8['exact_match'] - fp32['exact_match']:+.2f} points, "
        f"speed {fp32['seconds'] / int8['seconds']:.2f}x"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
