"""Forced alignment (`Align`) against gold word alignments: AER, precision and recall per link mode.

    python -m benchmarks.alignment.align_modes --bundle /work/data/grc-en-model --data /work/data/grc-en --split dev

Reads SPLIT.grc, SPLIT.en and SPLIT.pharaoh (one sentence a line; Pharaoh `i-j`, source word i,
target word j, 0-based over `split(" ")`; an empty gold line means no gold for that sentence, which
is then not scored), teacher-forces every pair once through the engine's Align pass and reads the
links of every mode (service/decode/align/links.py) from the same word matrices. Prints one table and the
pass's throughput. AER is Och and Ney's with every gold link sure, over the gold words (a link counts
only when its target word has a gold link), counts summed over the corpus; export/metrics/aer.py's
(pure Python, no torch).

Choose modes on a dev split; the default mode (service/decode/align/forced.py DEFAULT_LINKS) was chosen so,
docs/align.md has the figures.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from export.metrics.aer import AlignmentCounts, score_sentence
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.links import LINK_MODES, Link, extract_links, parse_pharaoh
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig

THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5)


def read_split(
    data: Path, split: str, src: str, tgt: str
) -> tuple[list[tuple[str, str]], list[set[Link]]]:
    """The split's pairs and gold links; ValueError when the files' line counts differ."""
    sources = (data / f"{split}.{src}").read_text(encoding="utf-8").split("\n")
    targets = (data / f"{split}.{tgt}").read_text(encoding="utf-8").split("\n")
    golds = (data / f"{split}.pharaoh").read_text(encoding="utf-8").split("\n")
    if sources and sources[-1] == "" and targets[-1] == "" and golds[-1] == "":
        sources, targets, golds = sources[:-1], targets[:-1], golds[:-1]
    if not len(sources) == len(targets) == len(golds):
        raise ValueError(
            f"{split}: {len(sources)} source, {len(targets)} target and {len(golds)} gold lines"
        )
    return list(zip(sources, targets, strict=True)), [parse_pharaoh(g) for g in golds]


def mode_names() -> list[tuple[str, str, float]]:
    """(label, mode, threshold) for every row of the table: the modes read from the attention (the
    link head's, "head", is measured by benchmarks/alignment/grc_en.py)."""
    rows = [(m, m, 0.0) for m in LINK_MODES if m not in ("threshold", "head")]
    return rows + [(f"threshold {t:g}", "threshold", t) for t in THRESHOLDS]


def evaluate(
    engine: Engine, pairs: Sequence[tuple[str, str]], golds: Sequence[set[Link]], batch: int
) -> tuple[dict[str, AlignmentCounts], float]:
    """Counts per mode, and the Align pass's pairs per second (static batches of `batch`)."""
    matrices = []
    started = time.perf_counter()
    for i in range(0, len(pairs), batch):
        chunk = pairs[i : i + batch]
        matrices += [a.word for a in align(engine, chunk, AlignOptions(matrices="word"))]
    seconds = time.perf_counter() - started
    counts = {label: AlignmentCounts() for label, _, _ in mode_names()}
    for matrix, gold in zip(matrices, golds, strict=True):
        assert matrix is not None
        for label, mode, threshold in mode_names():
            links = extract_links(matrix.matrix, mode, threshold or 0.3)
            counts[label].add(score_sentence(links, gold))
    return counts, len(pairs) / seconds


def table(counts: dict[str, AlignmentCounts]) -> str:
    lines = ["| links | AER | precision | recall |", "|---|---|---|---|"]
    for label, c in counts.items():
        lines.append(f"| {label} | {c.aer:.3f} | {c.precision:.3f} | {c.recall:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.alignment.align_modes", description=__doc__
    )
    p.add_argument("--bundle", required=True, help="the model bundle (or an embedded name)")
    p.add_argument("--data", type=Path, required=True, help="folder of SPLIT.SRC/TGT/pharaoh")
    p.add_argument("--split", default="dev", help="the split to score (default: %(default)s)")
    p.add_argument("--src", default="grc", help="source file suffix (default: %(default)s)")
    p.add_argument("--tgt", default="en", help="target file suffix (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="pairs per forced batch")
    p.add_argument("--threads", type=int, default=0, help="decoder threads (0: one per core)")
    p.add_argument("--limit", type=int, default=0, help="score the first N pairs only (0: all)")
    args = p.parse_args(argv)
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=args.threads),
        EngineLimits(max_source_tokens=1024, max_length=1024),
    )
    pairs, golds = read_split(args.data, args.split, args.src, args.tgt)
    if args.limit:
        pairs, golds = pairs[: args.limit], golds[: args.limit]
    counts, rate = evaluate(engine, pairs, golds, args.batch)
    scored = sum(1 for g in golds if g)
    print(f"{args.split}: {len(pairs)} pairs, {scored} with gold links; model {args.bundle}")
    print(table(counts))
    print(f"Align pass: {rate:.1f} pairs/s (static batches of {args.batch}, CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
