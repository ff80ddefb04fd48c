"""The embedded Transformer offline beside CTranslate2 on the same weights and texts, at 1 and 2
threads: the ceiling the served figure (benchmarks/serving/transformer_served.py) is held to.

    python -m benchmarks.importing.transformer_offline --threads 1 2 --rounds 2 \
        [--json docs/benchmarks/transformer-offline-embedded.json]

The texts are the Greek dev verses (`python -m export.data.bible --out data/grc-en`), sorted by
length and decoded in batches of 32 (beam 5, two hypotheses, attention returned) on each side:
ours by Engine.translate with word alignments and the bundle's rules, CTranslate2 on the bundle
written back as Marian's npz and converted by its MarianConverter (transformer_served's setup).
Per thread count and round, one side after the other: sentences/s, and the tokens of the best
hypotheses (the two search rules differ a little: see transformer_served). The ratio is ours /
CTranslate2.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
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


def ours_offline(setup: Setup, threads: int, more: dict[str, Any]) -> dict[str, float]:
    """Our engine's offline rate over every text, batches of 32 in length order; `more`: more
    RuntimeConfig fields."""
    from service.decode.config import RuntimeConfig
    from service.decode.engine import Engine
    from service.decode.options import SearchOptions

    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=threads, **more)
    engine = Engine.load(setup.bundle, config)
    rules = {k: v for k, v in engine.decoding_defaults.items() if k not in ("beam_size", "n_best")}
    options = SearchOptions(beam_size=BEAM, n_best=BEST, **rules)
    engine.translate(setup.texts[:BATCH], options, "word")  # warm-up: the sessions made
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(setup.texts), BATCH):
        for result in engine.translate(setup.texts[i : i + BATCH], options, "word"):
            tokens += len(result.hypotheses[0].tokens)
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
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
