"""Common English words through the G2P model, with and without its memory (docs/memory.md).

A fixed list of 200 frequent English words (function words, everyday nouns, verbs and adjectives),
each counted right when the answer equals one of CMUdict's pronunciations (stress included). The
same engine answers each word twice: with the bundle's memory (CMUdict, every word) and with
`use_memory = false` (the model alone); words of the model's held-out splits are marked: the
memory holds them, the model never saw them.

`--held-out` adds the test split's WER/PER: the model alone (`use_memory = false`) is the model's
figure; with the memory, the dictionary answers its own words.

    python -m benchmarks.quality.g2p_common [--bundle models/g2p] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from export.data import g2p
from export.metrics.g2p_metrics import g2p_scores
from service.decode.engine.engine import Engine
from service.decode.requests import in_process
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions

_WORD_LIST = """
the of and to in is you that it he was for on are as with his they at be this have from or one
had by word but not what all were we when your can said there use an each which she do how their
if will up other about out many then them these so some her would make like him into time has look
two more write go see number no way could people my than first water been call who oil its now find
long down day did get come made may part over new sound take only little work know place year live
me back give most very after thing our just name good sentence man think say great where help
through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell
air away animal house point page letter mother answer found study still learn should america world
"""
WORDS = _WORD_LIST.split()


def correct(answer: str, references: Sequence[str]) -> bool:
    return answer in references


def run(engine: Engine, split: g2p.Split) -> dict[str, Any]:
    pronunciations = split.pronunciations
    held_out = set(split.dev) | set(split.test)
    words = [w for w in WORDS if w in pronunciations]
    refs = {w: [" ".join(p) for p in pronunciations[w]] for w in words}
    rows: dict[str, Any] = {"bundle": str(engine.bundle.path), "words": len(words)}
    for name, use_memory in (("model alone", False), ("memory, then model", True)):
        options = SearchOptions(beam_size=5, use_memory=use_memory)
        answers = [
            t.hypotheses[0]
            for t in in_process.translate_with_memory(engine, words, options, "none")
        ]
        right = [correct(a.text, refs[w]) for a, w in zip(answers, words, strict=True)]
        wrong = [
            (w, a.text, refs[w]) for a, w, r in zip(answers, words, right, strict=True) if not r
        ]
        rows[name] = {
            "right": sum(right),
            "accuracy": round(100 * sum(right) / len(words), 1),
            "from_memory": sum(a.origin == "memory" for a in answers),
            "wrong": wrong,
        }
    rows["held_out_words"] = sorted(w for w in words if w in held_out)
    return rows


def held_out(engine: Engine, split: g2p.Split, limit: int | None) -> dict[str, Any]:
    """WER/PER of the test split (words in no training split): the model alone, with the memory
    off, and, for comparison only, with the memory, which holds every dictionary word."""
    words = split.test[:limit]
    refs = {w: [" ".join(p) for p in split.pronunciations[w]] for w in words}
    in_memory = sum(1 for w in words if engine.recall(w))
    out: dict[str, Any] = {"test_words": len(words), "test_words_in_memory": in_memory}
    for name, use_memory in (("model alone", False), ("memory, then model", True)):
        options = SearchOptions(beam_size=5, use_memory=use_memory)
        answers: dict[str, str] = {}
        for start in range(0, len(words), 64):
            chunk = words[start : start + 64]
            for w, t in zip(
                chunk, in_process.translate_with_memory(engine, chunk, options, "none"), strict=True
            ):
                answers[w] = t.hypotheses[0].text
        out[name] = g2p_scores(refs, answers)["overall"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/g2p"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--held-out", action="store_true", help="also the test split's WER/PER")
    p.add_argument("--limit", type=int, help="with --held-out: the first N test words")
    args = p.parse_args(argv)
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=args.threads),
    )
    split = g2p.split_words(g2p.load_cmudict(), seed=1)
    report = run(engine, split)
    if args.held_out:
        report["held_out"] = held_out(engine, split, args.limit)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
