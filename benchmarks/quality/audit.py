"""The audit: a bundle as served (service.decode.engine.engine.Engine, beam 5) on the audit set, exact match and
BLEU per value family, per number of phrases and per source-token length, plus a case table.

    python -m export.data.audit_set --bundle models/default --out runs/audit --seed 101 \
        --per-family 100 --per-bucket 100
    python -m benchmarks.quality.audit --bundle models/default --audit runs/audit/audit.tsv \
        --json docs/eval/audit.json --markdown docs/eval/audit.md

The value-family table uses the single-phrase sentences; the phrase-count and length tables use
every sentence. Lengths are the whole input's source tokens (after the bundle's input rule), as the
engine's limit counts them. An input the engine refuses (over its token limit) counts as wrong, with
an empty hypothesis. The case table decodes each single-phrase source as generated, lower-cased and
upper-cased.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu

from export.data.audit_set import PARTS_BUCKETS, bucket_label, find_bucket, length_buckets
from export.data.corpus import read_tsv
from export.data.gold import GoldLinks, read_gold
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.errors import InvalidInput


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Any]:
    """Exact match %, BLEU and chrF of a group. BLEU uses sacrebleu's effective order (only the
    n-gram orders the references have): most single phrases are shorter than 4 words, and plain
    corpus BLEU is 0 for them even when every answer is right."""
    bleu = sacrebleu.metrics.BLEU(effective_order=True).corpus_score(list(hyps), [list(refs)])
    chrf = sacrebleu.corpus_chrf(list(hyps), [list(refs)])
    exact = sum(h.strip() == r.strip() for h, r in zip(hyps, refs, strict=True))
    return {
        "n": len(hyps),
        "exact_match": round(100.0 * exact / len(hyps), 2),
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
    }


CASES: tuple[tuple[str, Any], ...] = (
    ("as generated", lambda s: s),
    ("lower", str.lower),
    ("UPPER", str.upper),
)


def decode_all(
    engine: Engine, sources: Sequence[str], beam: int, batch_size: int
) -> tuple[list[str], list[int]]:
    """Best hypothesis per source ("" when the engine refuses it) and its source length in the
    engine's tokens (0 when refused). Similar lengths are batched together."""
    options = SearchOptions(beam_size=beam)
    lengths = [0] * len(sources)
    ok: list[int] = []
    for i, text in enumerate(sources):
        try:
            engine.prepare(text)
        except InvalidInput:
            continue
        # the whole input's tokens, as the engine's limit counts them (a segmented input's own
        # ids leave its separators out)
        lengths[i] = len(engine.src_tok.encode(engine.normalize(text)))
        ok.append(i)
    hyps = [""] * len(sources)
    order = sorted(ok, key=lambda i: lengths[i])
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        answers = engine.translate([sources[i] for i in idx], options, "none")
        for i, answer in zip(idx, answers, strict=True):
            hyps[i] = answer.hypotheses[0].text
    return hyps, lengths


def grouped(
    keys: Sequence[str | None], hyps: Sequence[str], refs: Sequence[str], order: Sequence[str]
) -> list[dict[str, Any]]:
    """One row of scores per key in `order` (rows without members are left out)."""
    rows = []
    for key in order:
        idx = [i for i, k in enumerate(keys) if k == key]
        if idx:
            rows.append({"group": key, **score([hyps[i] for i in idx], [refs[i] for i in idx])})
    return rows


def audit(
    engine: Engine,
    pairs: Sequence[tuple[str, str]],
    gold: Sequence[GoldLinks],
    beam: int,
    batch_size: int,
    limit: int,
) -> dict[str, Any]:
    """The tables (see the module docstring) as JSON-ready rows."""
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    started = time.perf_counter()
    hyps, lengths = decode_all(engine, sources, beam, batch_size)
    seconds = time.perf_counter() - started
    families = [g.family if g.parts == 1 else None for g in gold]
    family_order = sorted({f for f in families if f is not None})
    parts_keys = [bucket_label(find_bucket(g.parts, PARTS_BUCKETS) or (0, 0)) for g in gold]
    buckets = length_buckets(limit)
    length_keys = [
        bucket_label(b) if (b := find_bucket(n, buckets)) else f">{limit} or refused"
        for n in lengths
    ]
    single = [i for i, g in enumerate(gold) if g.parts == 1]
    case_rows = []
    for name, change in CASES:
        texts = [change(sources[i]) for i in single]
        case_hyps, _ = decode_all(engine, texts, beam, batch_size)
        case_rows.append({"group": name, **score(case_hyps, [refs[i] for i in single])})
    return {
        "overall": score(hyps, refs),
        "refused": sum(1 for n in lengths if n == 0),
        "decode_seconds": round(seconds, 1),
        "families": grouped(families, hyps, refs, family_order),
        "parts": grouped(parts_keys, hyps, refs, [bucket_label(b) for b in PARTS_BUCKETS]),
        "lengths": grouped(
            length_keys, hyps, refs, [*map(bucket_label, buckets), f">{limit} or refused"]
        ),
        "case": case_rows,
        "examples_wrong": [
            {"source": sources[i], "reference": refs[i], "hypothesis": hyps[i]}
            for i in range(len(pairs))
            if hyps[i].strip() != refs[i].strip()
        ][:20],
    }


def table(rows: Sequence[dict[str, Any]], title: str) -> str:
    lines = [f"| {title} | n | exact match % | BLEU | chrF |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['group']} | {r['n']} | {r['exact_match']:.1f} | {r['bleu']:.1f} | {r['chrf']:.1f} |"
        )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    o = report["overall"]
    head = (
        f"Audit of `{report['bundle']}` on `{report['audit']}` ({o['n']} sentences, beam "
        f"{report['beam']}, serving engine): exact match {o['exact_match']:.1f}%, BLEU "
        f"{o['bleu']:.1f}; {report['refused']} refused by the engine."
    )
    parts = [
        head,
        "By value family (single-phrase sentences):\n\n" + table(report["families"], "family"),
        "By number of phrases:\n\n" + table(report["parts"], "phrases"),
        "By source length (the whole input's tokens):\n\n" + table(report["lengths"], "tokens"),
        "Case (single-phrase sources as generated, lower-cased, upper-cased):\n\n"
        + table(report["case"], "source case"),
    ]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--audit", type=Path, required=True, help="audit.tsv (its .gold.jsonl beside)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    pairs = read_tsv(args.audit)
    gold = read_gold(args.audit.with_name(args.audit.name.removesuffix(".tsv") + ".gold.jsonl"))
    if len(gold) != len(pairs):
        print(f"{args.audit}: {len(pairs)} pairs but {len(gold)} gold lines", file=sys.stderr)
        return 2
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=args.threads),
    )
    report = {
        "bundle": str(args.bundle),
        "audit": str(args.audit),
        "beam": args.beam,
        **audit(engine, pairs, gold, args.beam, args.batch_size, engine.limits.max_source_tokens),
    }
    text = markdown(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
