"""What each decoding control costs under each search, on a real model: the device search (the
controls it applies in the step's graph, and the numpy search for the others) beside the numpy
search for all.

    python -m benchmarks.decoding.controls [--bundle models/grc-en-nt] [--limit 160] [--rounds 3]
        [--json docs/benchmarks/controls-search.json]

The bundle's dev verses (benchmarks/sample_texts.py; the Greek bundles': loadtest/grc_sources.txt),
the first `--limit`, decoded in batches of 32 sorted by length, beam 5, the bundle's own defaults
(its penalties and stopping rule), one thread, with each control on (alone), and off. Seconds are
CPU time (`time.thread_time`: the shared 2-core machine's other processes left out), the median of
`--rounds` rounds after an untimed one, the settings and searches interleaved. Which path each
control takes: docs/decoding.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from service.decode.engine.engine import Engine
from service.decode.shared.config import SEARCHES, RuntimeConfig
from service.decode.shared.options import SearchOptions, merge_options

BATCH = 32
CONTROLS: dict[str, dict[str, Any]] = {
    "off": {},
    "target_prefix (1 word)": {"target_prefix": ("And",)},
    "suppress (1 token)": {"suppress": ("Then",)},
    "min_length=3": {"min_length": 3},
    "no_repeat_ngram_size=3": {"no_repeat_ngram_size": 3},
    "repetition_penalty=1.2": {"repetition_penalty": 1.2},
    "suppress (a sequence)": {"suppress": ("Jerusalem",)},
    "sampling_topk=10": {"sampling_topk": 10, "seed": 1},
    "return_alternatives=5": {"return_alternatives": 5},
    "glossary (1 term)": {"glossary": (("", "Jesus"),)},
}


def decode(engine: Engine, texts: Sequence[str], options: SearchOptions) -> float:
    """CPU seconds to decode `texts` in batches of BATCH sorted by length."""
    order = sorted(texts, key=len)
    started = time.thread_time()
    for start in range(0, len(order), BATCH):
        chunk = order[start : start + BATCH]
        batch_options = options
        if options.target_prefix:  # the same prefix for every text of the batch
            batch_options = replace(options, target_prefix=options.target_prefix[:1] * len(chunk))
        engine.translate(list(chunk), batch_options, "none")
    return time.thread_time() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    engines = {
        search: Engine.load(
            args.bundle,
            RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search=search),
        )
        for search in args.searches
    }
    first = next(iter(engines.values()))
    defaults = SearchOptions(
        **{
            **merge_options(SearchOptions().values(), first.decoding_defaults),
            "beam_size": 5,
            "n_best": 1,
        }
    )
    texts = bundle_texts(args.bundle)[: args.limit]
    times: dict[tuple[str, str], list[float]] = {}
    for changes in CONTROLS.values():  # a warm-up: each search's graphs made, untimed
        for engine in engines.values():
            decode(engine, texts[:BATCH], replace(defaults, **changes))
    for _ in range(args.rounds):
        for name, changes in CONTROLS.items():
            options = replace(defaults, **changes)
            for search, engine in engines.items():
                times.setdefault((name, search), []).append(decode(engine, texts, options))
    rows = []
    for name in CONTROLS:
        row: dict[str, Any] = {"control": name}
        for search in args.searches:
            seconds = statistics.median(times[(name, search)])
            off = statistics.median(times[("off", search)])
            row[search] = {"seconds": round(seconds, 3), "x_off": round(seconds / off, 3)}
        rows.append(row)
    return {"bundle": str(args.bundle), "texts": len(texts), "rounds": args.rounds, "rows": rows}


def table(report: dict[str, Any], searches: Sequence[str]) -> list[str]:
    head = " | ".join(f"{s} s | {s} × off" for s in searches)
    lines = [
        f"| control | {head} | device / host |",
        "|---|" + "---:|" * (2 * len(searches) + 1),
    ]
    for row in report["rows"]:
        cells = " | ".join(f"{row[s]['seconds']:.2f} | {row[s]['x_off']:.2f}" for s in searches)
        ratio = (
            f"{row['device']['seconds'] / row['host']['seconds']:.2f}"
            if "device" in row and "host" in row
            else "-"
        )
        lines.append(f"| {row['control']} | {cells} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--limit", type=int, default=160)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--searches", nargs="+", default=["host", "device"], choices=SEARCHES)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(table(report, args.searches)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
