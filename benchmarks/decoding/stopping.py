"""The stopping rules and the decoding controls, timed side by side on one engine (issue 31).

Part 1: John decoded with the bundle's penalties under each stopping rule, against the same decode
without penalties (the exact rule), in interleaved rounds: seconds (median), the ratio to no
penalties, BLEU/chrF, and how many answers differ from the exact rule's with the same penalties
(the exact rule's answer is the search run to the end, so the others' differences are what their
early stop costs).

Part 2: what each decoding control costs at batch 32: the same verses with the option on against
off (the bundle's defaults otherwise), in the same rounds.

    python -m benchmarks.decoding.stopping --bundle models/grc-en-nt --data data/grc-en --threads 1 \
        [--limit 160] [--rounds 3] [--json out.json]
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

import sacrebleu

from benchmarks.alignment.grc_en import ensure_data, read_split
from export.data import bible
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.options import SearchOptions

BATCH = 32


def decode(
    engine: Engine, sources: Sequence[str], options: SearchOptions
) -> tuple[list[str], float]:
    """Best hypothesis per source in batches of BATCH sorted by length; seconds taken."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out = [""] * len(sources)
    started = time.perf_counter()
    for start in range(0, len(order), BATCH):
        idx = order[start : start + BATCH]
        texts = [sources[i] for i in idx]
        batch_options = options
        if options.target_prefix:  # the same prefix for every text of the batch
            batch_options = replace(options, target_prefix=options.target_prefix[:1] * len(texts))
        for i, t in zip(idx, engine.translate(texts, batch_options, "none"), strict=True):
            out[i] = t.hypotheses[0].text
    return out, time.perf_counter() - started


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    stripped = [bible.strip_punctuation(h) for h in hypotheses]
    return {
        "bleu": round(sacrebleu.corpus_bleu(stripped, [list(references)]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(stripped, [list(references)]).score, 2),
    }


def timed_settings(
    engine: Engine, sources: Sequence[str], settings: dict[str, SearchOptions], rounds: int
) -> dict[str, dict[str, Any]]:
    """Each setting decoded `rounds` times, interleaved; outputs of the first round."""
    times: dict[str, list[float]] = {name: [] for name in settings}
    outputs: dict[str, list[str]] = {}
    for _ in range(rounds):
        for name, options in settings.items():
            out, seconds = decode(engine, sources, options)
            times[name].append(seconds)
            outputs.setdefault(name, out)
    return {
        name: {"seconds": statistics.median(times[name]), "outputs": outputs[name]}
        for name in settings
    }


def stopping_table(
    engine: Engine, sources: Sequence[str], references: Sequence[str], beam: int, rounds: int
) -> list[dict[str, Any]]:
    defaults = SearchOptions(**{**engine.decoding_defaults, "beam_size": beam})
    # the penalties alone: the bundle's length and coverage penalties, no other control
    penalties = SearchOptions(
        beam_size=beam,
        length_penalty=defaults.length_penalty,
        coverage_penalty=defaults.coverage_penalty,
    )
    plain = replace(penalties, length_penalty=0.0, coverage_penalty=0.0)
    settings = {
        "no penalties, exact": plain,
        "penalties, exact": penalties,
        "penalties, first": replace(penalties, stopping="first"),
        "penalties, patience 1": replace(penalties, stopping="patience", patience=1.0),
        "penalties, patience 1.25": replace(penalties, stopping="patience", patience=1.25),
        "penalties, patience 1.5": replace(penalties, stopping="patience", patience=1.5),
        "penalties, patience 2": replace(penalties, stopping="patience", patience=2.0),
        "the bundle's defaults": defaults,
    }
    got = timed_settings(engine, sources, settings, rounds)
    base, exact = got["no penalties, exact"], got["penalties, exact"]["outputs"]
    rows = []
    for name, result in got.items():
        differ = sum(a != b for a, b in zip(result["outputs"], exact, strict=True))
        rows.append(
            {
                "setting": name,
                "seconds": round(result["seconds"], 3),
                "ratio_to_no_penalties": round(result["seconds"] / base["seconds"], 3),
                "differ_from_exact": differ if name != "no penalties, exact" else None,
                **scores(result["outputs"], references),
            }
        )
    return rows


def control_costs(
    engine: Engine, sources: Sequence[str], beam: int, rounds: int
) -> list[dict[str, Any]]:
    defaults = SearchOptions(**{**engine.decoding_defaults, "beam_size": beam, "n_best": 1})
    on: dict[str, dict[str, Any]] = {
        "no_repeat_ngram_size=3": {"no_repeat_ngram_size": 3},
        "repetition_penalty=1.2": {"repetition_penalty": 1.2},
        "min_length=3": {"min_length": 3},
        "target_prefix (1 word)": {"target_prefix": ("And",)},
        "return_alternatives=5": {"return_alternatives": 5},
        "sampling_topk=10": {"sampling_topk": 10, "seed": 1},
        "replace_unknowns": {"replace_unknowns": True},
        "suppress (2 words)": {"suppress": ("Then", "and")},
    }
    settings = {"off": defaults} | {
        name: replace(defaults, **values) for name, values in on.items()
    }
    got = timed_settings(engine, sources, settings, rounds)
    off = got["off"]["seconds"]
    return [
        {
            "option": name,
            "seconds": round(r["seconds"], 3),
            "ratio_to_off": round(r["seconds"] / off, 3),
        }
        for name, r in got.items()
    ]


def markdown(report: dict[str, Any]) -> str:
    """The report's tables as docs/decoding.md shows them."""
    head = (
        f"{report['split']}, {report['verses']} verses, beam {report['beam']}, batch "
        f"{report['batch']}, {report['threads']} thread(s); {report['bundle']}"
    )
    lines = []
    if "stopping" in report:
        lines += [
            f"Stopping rules ({head}; medians of interleaved rounds):",
            "",
            "| setting | seconds | × no penalties | answers ≠ exact | BLEU | chrF |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["stopping"]:
            differ = "" if r["differ_from_exact"] is None else str(r["differ_from_exact"])
            lines.append(
                f"| {r['setting']} | {r['seconds']:.2f} | {r['ratio_to_no_penalties']:.3f} "
                f"| {differ} | {r['bleu']:.2f} | {r['chrf']:.2f} |"
            )
        lines.append("")
    if "costs" in report:
        lines += [
            f"Each control on against off, the bundle's defaults otherwise ({head}, the first "
            "verses):",
            "",
            "| option | seconds | × off |",
            "|---|---:|---:|",
        ]
        for r in report["costs"]:
            lines.append(f"| {r['option']} | {r['seconds']:.2f} | {r['ratio_to_off']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--split", default="test", help="test (John) or dev")
    p.add_argument("--limit", type=int, help="only the first N verses")
    p.add_argument("--cost-limit", type=int, default=160, help="verses for the options' costs")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="stopping,costs")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path, help="print the tables of a saved --json report")
    args = p.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    ensure_data(args.data)
    split = read_split(args.data, args.split, args.limit)
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=args.threads),
        EngineLimits(max_source_tokens=1024, max_length=1024),
    )
    engine.warm_up()
    report: dict[str, Any] = {
        "bundle": str(args.bundle),
        "split": args.split,
        "verses": len(split),
        "threads": args.threads,
        "beam": args.beam,
        "batch": BATCH,
        "defaults": engine.decoding_defaults,
    }
    parts = args.parts.split(",")
    if "stopping" in parts:
        report["stopping"] = stopping_table(
            engine, split.sources, split.targets, args.beam, args.rounds
        )
        for row in report["stopping"]:
            print(json.dumps(row))
    if "costs" in parts:
        report["costs"] = control_costs(
            engine, split.sources[: args.cost_limit], args.beam, args.rounds
        )
        for row in report["costs"]:
            print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
