"""Exact match on long inputs, decoded whole and cut at the bundle's declared boundaries, side by side.

    python -m benchmarks.quality.segmentation --bundle models/default \
        --segmentation configs/numbers-segmentation.json --sentences 200 --min-parts 6 --max-parts 10

The bundle is copied into a temporary folder twice: once without a "segmentation" section and once
with the given one (the manifest only; its checksums cover the other files, so nothing else
changes). Both copies decode the same freshly generated sentences (export.data.corpus, --seed) through the
serving Engine; the script prints exact match, and per number of phrases, as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from export.data import corpus
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.model.bundle import MANIFEST


def bundle_copy(bundle: Path, into: Path, segmentation: dict[str, Any] | None) -> Path:
    """A copy of `bundle` whose manifest has `segmentation` (None: no such section)."""
    out = into / ("segmented" if segmentation else "whole")
    shutil.copytree(bundle, out)
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    manifest.pop("segmentation", None)
    if segmentation:
        manifest["segmentation"] = segmentation
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return out


def exact_match(
    engine: Engine, pairs: list[tuple[str, str]], beam: int, batch_size: int
) -> tuple[list[bool], float]:
    options = SearchOptions(beam_size=beam)
    right: list[bool] = []
    started = time.perf_counter()
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        got = engine.translate([s for s, _ in batch], options, "none")
        right += [t.hypotheses[0].text == ref for t, (_, ref) in zip(got, batch, strict=True)]
    return right, time.perf_counter() - started


def fits(engine: Engine, text: str) -> bool:
    try:
        engine.prepare(text)
    except InvalidInput:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--segmentation", type=Path, default=Path("configs/numbers-segmentation.json"))
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--min-parts", type=int, default=6)
    p.add_argument("--max-parts", type=int, default=10)
    p.add_argument("--seed", type=int, default=1414)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    parts = [rng.randint(args.min_parts, args.max_parts) for _ in range(args.sentences)]
    pairs = [corpus.random_sentence(rng, n) for n in parts]
    segmentation = json.loads(args.segmentation.read_text(encoding="utf-8"))
    results: dict[str, Any] = {
        "bundle": str(args.bundle),
        "sentences_drawn": len(pairs),
        "phrases": f"{args.min_parts}-{args.max_parts}",
        "seed": args.seed,
        "beam": args.beam,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, section in (("whole", None), ("segmented", segmentation)):
            engine = Engine.load(
                bundle_copy(args.bundle, Path(tmp), section),
                RuntimeConfig(intra_op_threads=args.threads),
            )
            if name == "whole":  # inputs over the engine's token limit are refused: leave them out
                keep = [i for i, (s, _) in enumerate(pairs) if fits(engine, s)]
                results["left_out_over_limit"] = len(pairs) - len(keep)
                results["max_source_tokens"] = max(
                    len(engine.prepare(pairs[i][0]).ids) for i in keep
                )
                pairs, parts = [pairs[i] for i in keep], [parts[i] for i in keep]
            right, seconds = exact_match(engine, pairs, args.beam, args.batch_size)
            by_parts = {
                n: round(
                    sum(r for r, k in zip(right, parts, strict=True) if k == n) / parts.count(n), 3
                )
                for n in sorted(set(parts))
            }
            results["sentences"] = len(pairs)
            results[name] = {
                "exact_match": round(sum(right) / len(right), 4),
                "by_phrases": by_parts,
                "seconds": round(seconds, 1),
            }
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
