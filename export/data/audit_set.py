"""The audit set: held-out sentences spread over value families, phrase counts and source lengths.

The regular test split is drawn like the training data, so it says little about what lies just
outside it. The audit set has, from a fresh seed:

- `per_family` single-phrase sentences of every value family (export/data/families.py), and
- `per_bucket` sentences in every source-length bucket up to the bundle's token limit (lengths
  counted with the bundle's own source tokenizer after its input rule), made of as many phrases as
  it takes (1 to ~40), so every phrase-count bucket up to the limit is filled too.

    python -m export.data.audit_set --bundle models/default --out data/audit --seed 101 \
        --per-family 100 --per-bucket 100 --token-limit 256

writes `audit.tsv` and `audit.gold.jsonl` (the gold gives each sentence's family and parts).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from export.data.corpus import Example, random_example, read_tsv, write_split
from export.data.families import FAMILIES, family_weights

TokenCounter = Callable[[str], int]

# Source-token bucket edges: fine where most sentences are, then every 32 tokens.
SHORT_EDGES: tuple[int, ...] = (8, 16, 24, 32, 48, 64)
EDGE_STEP = 32
# Phrase-count buckets (inclusive ranges) for the audit tables.
PARTS_BUCKETS: tuple[tuple[int, int], ...] = (
    (1, 1),
    (2, 2),
    (3, 4),
    (5, 6),
    (7, 10),
    (11, 16),
    (17, 24),
    (25, 10_000),
)
MAX_DRAWS_PER_SENTENCE = 200


def length_buckets(limit: int) -> list[tuple[int, int]]:
    """Inclusive source-token ranges covering 1..limit: (1, 8), (9, 16), ..., (225, 256)."""
    edges = [e for e in SHORT_EDGES if e < limit]
    top = edges[-1] if edges else 0
    while top + EDGE_STEP < limit:
        top += EDGE_STEP
        edges.append(top)
    edges.append(limit)
    starts = [1, *(e + 1 for e in edges[:-1])]
    return list(zip(starts, edges, strict=True))


def bucket_label(bucket: tuple[int, int]) -> str:
    lo, hi = bucket
    return str(lo) if lo == hi else (f"{lo}+" if hi >= 10_000 else f"{lo}-{hi}")


def find_bucket(value: int, buckets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    for lo, hi in buckets:
        if lo <= value <= hi:
            return lo, hi
    return None


def family_examples(
    rng: random.Random, per_family: int, seen: set[str], count_tokens: TokenCounter, limit: int
) -> list[Example]:
    """`per_family` unseen single-phrase sentences of each family (fewer where a family has fewer);
    `seen` holds lower-cased sources."""
    out: list[Example] = []
    for name in FAMILIES:
        only = {n: 0.0 for n in FAMILIES} | {name: 1.0}
        found = 0
        for _ in range(per_family * MAX_DRAWS_PER_SENTENCE):
            if found == per_family:
                break
            example = random_example(rng, 1, only)
            key = example.source.lower()  # a model that lower-cases sees "PM" as "pm"
            if key in seen or count_tokens(example.source) > limit:
                continue
            seen.add(key)
            out.append(example)
            found += 1
    return out


def tokens_per_phrase(rng: random.Random, count_tokens: TokenCounter, n: int = 300) -> float:
    """The mean source tokens of one phrase and its connector, from `n` random two-phrase sentences."""
    weights = family_weights()
    total = sum(count_tokens(random_example(rng, 2, weights).source) for _ in range(n))
    return max(total / (2 * n), 1.0)


def length_examples(
    rng: random.Random,
    per_bucket: int,
    seen: set[str],
    count_tokens: TokenCounter,
    limit: int,
) -> list[Example]:
    """`per_bucket` unseen sentences per source-token bucket up to `limit`; the phrase count is
    drawn around what the bucket's lengths need. RuntimeError when a bucket cannot be filled."""
    per_phrase = tokens_per_phrase(rng, count_tokens)
    weights = family_weights()
    out: list[Example] = []
    for lo, hi in length_buckets(limit):
        found = 0
        for _ in range(per_bucket * MAX_DRAWS_PER_SENTENCE):
            if found == per_bucket:
                break
            parts = max(1, round(rng.uniform(lo, hi) / per_phrase))
            example = random_example(rng, parts, weights)
            key = example.source.lower()
            if key in seen or not lo <= count_tokens(example.source) <= hi:
                continue
            seen.add(key)
            out.append(example)
            found += 1
        if found < per_bucket:
            raise RuntimeError(f"found only {found} of {per_bucket} sentences of {lo}-{hi} tokens")
    return out


def generate_audit(
    seed: int,
    per_family: int,
    per_bucket: int,
    count_tokens: TokenCounter,
    limit: int,
    exclude: set[str] | None = None,
) -> list[Example]:
    """The audit set (see the module docstring); sources in `exclude` (e.g. the train split's,
    compared lower-cased) are never drawn."""
    rng = random.Random(seed)
    seen = {s.lower() for s in exclude or set()}
    return [
        *family_examples(rng, per_family, seen, count_tokens, limit),
        *length_examples(rng, per_bucket, seen, count_tokens, limit),
    ]


def bundle_token_counter(bundle_dir: Path) -> tuple[TokenCounter, int]:
    """Source tokens as the bundle counts them (its input rule, then its source tokenizer), and the
    limit the serving engine applies (service.decode.shared.config.EngineLimits.max_source_tokens)."""
    from service.decode.shared.config import EngineLimits
    from service.model.bundle import load_bundle
    from service.model.embedded import resolve_bundle
    from service.model.vocab import load_tokenizers

    bundle = load_bundle(resolve_bundle(bundle_dir))
    source, _ = load_tokenizers(bundle)
    rule = bundle.input_rule

    def count(text: str) -> int:
        return len(source.encode(rule.apply(text) if rule is not None else text))

    return count, EngineLimits().max_source_tokens


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m export.data.audit_set",
        description="Write the audit set (audit.tsv and audit.gold.jsonl) for a bundle's tokenizer.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument(
        "--bundle",
        type=Path,
        default=Path("models/default"),
        help="whose source tokenizer and input rule count the source tokens",
    )
    parser.add_argument("--per-family", type=int, default=100, help="single phrases per family")
    parser.add_argument("--per-bucket", type=int, default=100, help="sentences per length bucket")
    parser.add_argument(
        "--token-limit", type=int, help="longest source in tokens (default: the engine's limit)"
    )
    parser.add_argument(
        "--exclude", type=Path, action="append", default=[], help="TSV whose sources to skip"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Write the audit set for --bundle's tokenizer into --out."""
    args = _parse_args(argv)
    count, engine_limit = bundle_token_counter(args.bundle)
    limit = args.token_limit or engine_limit
    exclude = {s for path in args.exclude for s, _ in read_tsv(path)}
    examples = generate_audit(args.seed, args.per_family, args.per_bucket, count, limit, exclude)
    args.out.mkdir(parents=True, exist_ok=True)
    path = write_split(args.out, "audit", examples)
    parts = sorted({e.gold.parts for e in examples})
    print(
        f"audit: {len(examples)} pairs, {len(length_buckets(limit))} length buckets up to "
        f"{limit} tokens, {parts[0]}-{parts[-1]} phrases -> {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
