"""Aligning the Greek New Testament without gold: the silver bundle against eflomal and the gold one.

    python -m benchmarks.alignment.grc_en_silver --silver models/grc-en-nt-silver --gold models/grc-en-nt \\
        --data data/grc-en [--json docs/eval/grc-en-nt-silver/john.json]

Gold links are read here only to score (data/grc-en/{dev,test}.pharaoh, written by
`python -m export.data.bible --out data/grc-en`); the silver bundle was trained without any
(configs/grc-en-nt-silver.toml). Rows, on John (the test split):
- eflomal 2.0.0 run the usual way: over the text of train, dev and John at once, folded, both
  directions, grow-diag-final-and, and its wall time;
- the silver bundle's teacher as its manifest records it (export/train/teacher.py: eflomal over
  word prefixes, several runs voting, unaligned target words attached), over the same text, and
  its wall time;
- the silver bundle's attention in the link mode with the lowest AER on dev (every attention
  mode is scored on dev; the mode is chosen there, then applied to John);
- the silver bundle's link head (trained on eflomal's links);
- the gold bundle's link head (trained on Biblica's links).
Then the time to align every pair of the three splits with the silver bundle's head (`Align`,
one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.alignment.align_modes import evaluate, read_split
from export.metrics.aer import AlignmentCounts, score_corpus
from export.train.teacher import AlignmentConfig, eflomal_gdfa, silver_links
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.links import Link, parse_pharaoh
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.model.bundle import load_bundle

SPLITS = ("train", "dev", "test")


def load(bundle: Path) -> Engine:
    return Engine.load(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1),
        EngineLimits(max_source_tokens=4096, max_length=4096),
    )


def head_links(engine: Engine, pairs: Sequence[tuple[str, str]]) -> list[set[Link]]:
    out: list[set[Link]] = []
    for i in range(0, len(pairs), 64):
        results = align(engine, pairs[i : i + 64], AlignOptions(links="head", matrices="none"))
        out += [parse_pharaoh(r.pharaoh) for r in results]
    return out


def row(system: str, counts: AlignmentCounts, **extra: Any) -> dict[str, Any]:
    return {
        "system": system,
        "aer": round(counts.aer, 4),
        "precision": round(counts.precision, 4),
        "recall": round(counts.recall, 4),
        **extra,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    splits = {name: read_split(args.data, name, "grc", "en") for name in SPLITS}
    if args.limit:  # a smoke run: the first pairs of each split
        splits = {k: (p[: args.limit], g[: args.limit]) for k, (p, g) in splits.items()}
    test_pairs, test_gold = splits["test"]
    rows = []
    everything = [p for name in SPLITS for p in splits[name][0]]
    sources, targets = [s for s, _ in everything], [t for _, t in everything]
    recorded = load_bundle(args.silver).info["link_head"]["links_source"]
    teacher = AlignmentConfig.from_record(recorded)
    aligners: dict[str, Callable[[], list[set[Link]]]] = {
        "eflomal 2.0.0, grow-diag-final-and (train + dev + John text)": lambda: eflomal_gdfa(
            sources, targets
        ),
        "the silver bundle's teacher: eflomal as its manifest records (train + dev + John text)": (
            lambda: silver_links(sources, targets, teacher, say=lambda _: None)[0]
        ),
    }
    for system, aligner in aligners.items():
        start = time.perf_counter()
        links = aligner()
        seconds = round(time.perf_counter() - start, 1)
        rows.append(
            row(system, score_corpus(links[-len(test_pairs) :], test_gold), seconds=seconds)
        )
    silver = load(args.silver)
    dev_counts, _ = evaluate(silver, *splits["dev"], 64)
    best = min(dev_counts, key=lambda label: dev_counts[label].aer)
    test_counts, _ = evaluate(silver, test_pairs, test_gold, 64)
    rows.append(
        row(
            f"Align, attention ({best}: lowest dev AER {dev_counts[best].aer:.3f})",
            test_counts[best],
            dev_modes={k: round(v.aer, 4) for k, v in dev_counts.items()},
        )
    )
    rows.append(
        row("Align, link head on silver", score_corpus(head_links(silver, test_pairs), test_gold))
    )
    gold_engine = load(args.gold)
    rows.append(
        row(
            f"Align, link head on gold ({args.gold.name})",
            score_corpus(head_links(gold_engine, test_pairs), test_gold),
        )
    )
    start = time.perf_counter()
    head_links(silver, everything)
    align_s = time.perf_counter() - start
    return {
        "rows": rows,
        "align_all_pairs": {"pairs": len(everything), "seconds": round(align_s, 1)},
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| system | AER | precision | recall |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['system']} | {r['aer']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} |"
        )
    a = result["align_all_pairs"]
    lines.append(f"\nAlign with the silver head, {a['pairs']} pairs: {a['seconds']} s (1 thread)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.alignment.grc_en_silver", description=__doc__
    )
    p.add_argument("--silver", type=Path, default=Path("models/grc-en-nt-silver"))
    p.add_argument("--gold", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--json", type=Path, help="write the figures here too")
    p.add_argument("--limit", type=int, default=0, help="the first N pairs of each split only")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
