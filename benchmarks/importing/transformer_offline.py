"""The embedded Transformer offline beside CTranslate2 on the same weights and texts, at 1 and 2
threads: the ceiling the served figure (benchmarks/serving/transformer_served.py) is held to.

    python -m benchmarks.importing.transformer_offline --threads 1 2 --rounds 2 \
        [--json docs/benchmarks/transformer-offline-embedded.json]

The texts are the Greek dev verses (`python -m export.data.bible --out data/grc-en`), sorted by
length and decoded in batches of 32 (beam 5, two hypotheses, attention returned) on each side:
ours by Engine.translate with word alignments and the bundle's rules, CTranslate2 on the bundle
written back as Marian's npz and converted by its MarianConverter (transformer_served's setup).
Per thread count and round, one side after the other: sentences/s, and the tokens of the best
hypotheses (the two search rules differ a little: see transformer_served). At more than one
thread, ours also as that many lanes of one thread each (engines taking the next batch when free,
as `s2s-translate --lanes`; CTranslate2's inter_threads). The ratios are ours / CTranslate2.
"""

from __future__ import annotations

import argparse
import json
import queue
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.serving.transformer_served import (
    BATCH,
    BEAM,
    BEST,
    Setup,
    ctranslate2_rows,
    prepare_embedded,
)


def ours_offline(
    setup: Setup, threads: int, more: dict[str, Any], lanes: int = 1
) -> dict[str, float]:
    """Our engine's offline rate over every text, batches of 32 in length order; `more`: more
    RuntimeConfig fields; with `lanes`, that many engines of threads / lanes threads each take the
    next batch when free (s2s-translate --lanes)."""
    from service.decode.engine.engine import Engine
    from service.decode.shared.config import RuntimeConfig
    from service.decode.shared.options import SearchOptions

    per_lane = max(1, threads // lanes)
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=per_lane, **more)
    engines = [Engine.load(setup.bundle, config) for _ in range(lanes)]
    rules = {k: v for k, v in engines[0].decoding_defaults.items()
             if k not in ("beam_size", "n_best")}  # fmt: skip
    options = SearchOptions(beam_size=BEAM, n_best=BEST, **rules)
    free: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for engine in engines:
        engine.translate(setup.texts[:BATCH], options, "word")  # warm-up: the sessions made
        free.put(engine)

    def on_a_lane(texts: list[str]) -> int:
        engine = free.get()
        try:
            return sum(
                len(r.hypotheses[0].tokens) for r in engine.translate(texts, options, "word")
            )
        finally:
            free.put(engine)

    batches = [setup.texts[i : i + BATCH] for i in range(0, len(setup.texts), BATCH)]
    started = time.perf_counter()
    with ThreadPoolExecutor(lanes) as pool:
        tokens = sum(pool.map(on_a_lane, batches))
    return {
        "offline_sentences_per_s": len(setup.texts) / (time.perf_counter() - started),
        "offline_target_tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=Path, default=Path("data/grc-en/dev.grc"))
    parser.add_argument("--sentences", type=int, default=418)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--config", type=json.loads, default={},
                        help='more RuntimeConfig fields, e.g. \'{"spin_wait": true}\'')  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"model": "grc-en-nt-transformer", "config": args.config, "rows": []}
    with tempfile.TemporaryDirectory(prefix="transformer-offline-") as work:
        setup = prepare_embedded(Path(work), args.texts, args.sentences)
        report["sentences"] = len(setup.texts)
        for _ in range(args.rounds):
            for threads in args.threads:
                peer = ctranslate2_rows(setup, threads, singles=1)
                ours = ours_offline(setup, threads, args.config)
                row = {
                    "threads": threads,
                    "ours_sentences_per_s": round(ours["offline_sentences_per_s"], 2),
                    "ours_target_tokens": ours["offline_target_tokens"],
                    "ctranslate2_sentences_per_s": round(peer["offline_sentences_per_s"], 2),
                    "ctranslate2_target_tokens": peer["offline_target_tokens"],
                    "ratio": round(
                        ours["offline_sentences_per_s"] / peer["offline_sentences_per_s"], 3
                    ),
                }
                if threads > 1:  # the same threads as lanes of one thread each
                    lanes = ours_offline(setup, threads, args.config, lanes=threads)
                    row["ours_lanes_sentences_per_s"] = round(lanes["offline_sentences_per_s"], 2)
                    row["lanes_ratio"] = round(
                        lanes["offline_sentences_per_s"] / peer["offline_sentences_per_s"], 3
                    )
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
