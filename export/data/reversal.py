"""The reversal task: a task whose word alignment is known exactly, to measure where attention looks.

Source: 3..max_len words drawn with replacement from a small English vocabulary; target: the same
words in reverse order, each written as its French counterpart (a one-to-one dictionary), so the
model must both reorder and translate, and target word i comes from source word n-1-i and from no
other. The gold sidecar (export/data/gold.py) holds exactly those links; `s2s-evaluate` scores the
attention's argmax against them (export/evaluate/alignment_eval.py).

    python -m export.data.reversal --out data/reversal --seed 1     (writes the splits and their gold)

or train on it directly: `[data] task = "reversal"` in a training config (configs/reversal-*.toml).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from export.data.corpus import write_tsv
from export.data.gold import GoldLinks, write_gold

SOURCE_WORDS = (
    "red", "green", "blue", "black", "white", "cat", "dog", "bird",
    "fish", "tree", "house", "river", "stone", "cloud", "moon", "sun",
)  # fmt: skip
TARGET_WORDS = (
    "rouge", "vert", "bleu", "noir", "blanc", "chat", "chien", "oiseau",
    "poisson", "arbre", "maison", "rivière", "pierre", "nuage", "lune", "soleil",
)  # fmt: skip
DICTIONARY = dict(zip(SOURCE_WORDS, TARGET_WORDS, strict=True))
MIN_LEN = 3

Pair = tuple[str, str]


def reversal_pair(words: list[str]) -> Pair:
    """Source words → (source, reversed translation)."""
    return " ".join(words), " ".join(DICTIONARY[w] for w in reversed(words))


def reversal_gold(n: int) -> GoldLinks:
    """The exact links of an n-word sentence: target word i ↔ source word n-1-i."""
    return GoldLinks(
        family="reversal",
        parts=1,
        phrases=[(0, n, 0, n)],
        words=[(n - 1 - i, i) for i in range(n)],
    )


def generate(
    seed: int, n_train: int, n_dev: int, n_test: int, max_len: int
) -> dict[str, list[Pair]]:
    """Deterministic train/dev/test splits of distinct source sentences, MIN_LEN..max_len words."""
    if max_len < MIN_LEN:
        raise ValueError(f"reversal max_len must be >= {MIN_LEN}, got {max_len}")
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[Pair]] = {}
    for name, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        pairs: list[Pair] = []
        while len(pairs) < n:
            words = rng.choices(SOURCE_WORDS, k=rng.randint(MIN_LEN, max_len))
            pair = reversal_pair(words)
            if pair[0] not in seen:
                seen.add(pair[0])
                pairs.append(pair)
        splits[name] = pairs
    return splits


def write_splits(out: Path, splits: dict[str, list[Pair]]) -> None:
    """out/<split>.tsv and out/<split>.gold.jsonl for every split."""
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        write_tsv(out / f"{name}.tsv", pairs)
        write_gold(out / f"{name}.gold.jsonl", (reversal_gold(len(s.split(" "))) for s, _ in pairs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.data.reversal", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the splits (created)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--n-train", type=int, default=20000)
    p.add_argument("--n-dev", type=int, default=300)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--max-len", type=int, default=12, help="longest sentence in words")
    args = p.parse_args(argv)
    splits = generate(args.seed, args.n_train, args.n_dev, args.n_test, args.max_len)
    write_splits(args.out, splits)
    print(f"wrote {', '.join(f'{k} ({len(v)})' for k, v in splits.items())} into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
