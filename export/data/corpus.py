"""The parallel corpus: TSV I/O, the generated English→French demo corpus and its gold sidecar.

Every pair is built from real library output, never hand-written sentences: each phrase comes
from a named value family in `export/data/families.py` (num2words and Babel, both languages), and a
sentence joins 1..N phrases with connectors. The French side reorders (`ninety-seven` →
`quatre-vingt-dix-sept`, `March 5, 2021` → `5 mars 2021`, `$3.50` → `3,50 $US`), which makes the
attention alignments worth looking at. Beside every `<split>.tsv` the CLI writes
`<split>.gold.jsonl` (export/data/gold.py): each sentence's family, phrase spans and sure word links.

    python -m export.data.corpus --out data/numbers --seed 1 \
        --train 40000 --dev 500 --test 1000 --test-long 200
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from export.data.families import (
    FAMILIES,
    Pair,
    Phrase,
    cardinal_pair,
    currency_pair,
    date_pair,
    decimal_digits_pair,
    decimal_words_pair,
    family_weights,
    normalize_spaces,
    ordinal_pair,
    random_phrase,
    time_pair,
    year_pair,
)
from export.data.gold import GoldLinks, write_gold

__all__ = [
    "FAMILIES",
    "Pair",
    "cardinal_pair",
    "currency_pair",
    "date_pair",
    "decimal_digits_pair",
    "decimal_words_pair",
    "normalize_spaces",
    "ordinal_pair",
    "time_pair",
    "year_pair",
]

# Sentence shape: train, dev and regular test sentences.
PART_WEIGHTS: tuple[float, ...] = (4, 3, 2, 1)  # weight of 1, 2, 3, 4 expressions
MAX_PARTS = len(PART_WEIGHTS)
MAX_SOURCE_CHARS = 160  # cap on the English side of train/dev/test sentences

# Sentence shape: the long test sentences, all longer than any train sentence.
LONG_PART_WEIGHTS: dict[int, float] = {5: 1, 6: 1}
MIN_LONG_SOURCE_CHARS = MAX_SOURCE_CHARS + 1
MAX_LONG_SOURCE_CHARS = 220  # ~1.4x the train cap: longer, not absurdly long

# Rejection sampling gives up after this many draws per requested sentence.
MAX_DRAWS_PER_SENTENCE = 200

CONNECTORS: tuple[Pair, ...] = ((" and ", " et "), (", then ", ", puis "), (", ", ", "))
# num2words' English writes "one thousand, two hundred and five": after a scale word, " and " or
# ", " before another number word would read as one number, so only ", then " is used there.
UNAMBIGUOUS_CONNECTORS: tuple[Pair, ...] = ((", then ", ", puis "),)
_ENDS_WITH_SCALE = re.compile(r"\b(?:hundred|thousand|million)$")
# Connector words that are each other's translation (word-level gold links).
CONNECTOR_LINKS: dict[str, str] = {"and": "et", "then": "puis"}


@dataclass(frozen=True)
class Example:
    """One sentence pair and its gold alignment."""

    source: str
    target: str
    gold: GoldLinks

    @property
    def pair(self) -> Pair:
        return self.source, self.target

    def lowercased(self) -> Example:
        """The source lower-cased (the gold's word indices do not change: no space moves)."""
        return Example(self.source.lower(), self.target, self.gold)


# --- TSV I/O -----------------------------------------------------------------


def read_tsv(path: str | Path) -> list[Pair]:
    """Read `source<TAB>target` lines (UTF-8), skipping blank lines.

    Raises ValueError naming the file and 1-based line number for a line
    without exactly one tab or with an empty side.
    """
    pairs: list[Pair] = []
    with open(path, encoding="utf-8", newline="\n") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            pairs.append(_parse_tsv_line(line, path, lineno))
    return pairs


def _parse_tsv_line(line: str, path: str | Path, lineno: int) -> Pair:
    """Split one non-blank TSV line into (source, target), or raise ValueError."""
    fields = line.split("\t")
    if len(fields) != 2:
        raise ValueError(f"{path}:{lineno}: expected exactly one tab, found {len(fields) - 1}")
    source, target = fields
    if not source.strip() or not target.strip():
        raise ValueError(f"{path}:{lineno}: empty source or target")
    return source, target


def write_tsv(path: str | Path, pairs: Iterable[Pair]) -> None:
    """Write pairs as `source<TAB>target` lines (UTF-8); rejects tabs/newlines inside a side."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i, (source, target) in enumerate(pairs):
            for side in (source, target):
                if "\t" in side or "\n" in side or "\r" in side:
                    raise ValueError(f"pair {i}: tab or newline inside {side!r}")
            f.write(f"{source}\t{target}\n")


def write_split(folder: Path, name: str, examples: Sequence[Example]) -> Path:
    """Write `<name>.tsv` and its `<name>.gold.jsonl` sidecar; returns the TSV's path."""
    path = folder / f"{name}.tsv"
    write_tsv(path, [e.pair for e in examples])
    write_gold(folder / f"{name}.gold.jsonl", [e.gold for e in examples])
    return path


# --- Sentences -------------------------------------------------------------------


def pick_connector(rng: random.Random, left_en: str, right_en: str) -> Pair:
    """A random (English, French) connector that keeps `left_en` and `right_en` apart.

    "one thousand" + " and " + "five" would read as 1005, so after a scale word
    and before a spelled number only UNAMBIGUOUS_CONNECTORS are allowed.
    """
    if _ENDS_WITH_SCALE.search(left_en) and right_en[:1].islower():
        return rng.choice(UNAMBIGUOUS_CONNECTORS)
    return rng.choice(CONNECTORS)


class _Side:
    """One language's words as a sentence grows, with each phrase's word span."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.spans: list[tuple[int, int]] = []
        self.connectors: list[int] = []  # index of each connector's word, -1 for ", "

    def add_phrase(self, text: str) -> None:
        start = len(self.words)
        self.words += text.split(" ")
        self.spans.append((start, len(self.words)))

    def add_connector(self, join: str) -> None:
        """`join` is ", then ", " and " or ", ": a comma sticks to the previous word."""
        if join.startswith(","):
            self.words[-1] += ","
        words = join.strip(" ,").split()
        self.connectors.append(len(self.words) if words else -1)
        self.words += words


def sentence_from_phrases(phrases: Sequence[Phrase], joins: Sequence[Pair]) -> Example:
    """Join phrases with (English, French) connectors; the gold comes from the pieces' spans."""
    src, tgt = _Side(), _Side()
    for k, phrase in enumerate(phrases):
        if k:
            src.add_connector(joins[k - 1][0])
            tgt.add_connector(joins[k - 1][1])
        src.add_phrase(phrase.en)
        tgt.add_phrase(phrase.fr)
    words: list[tuple[int, int]] = []
    for phrase, (s0, _), (t0, _) in zip(phrases, src.spans, tgt.spans, strict=True):
        words += [(s0 + s, t0 + t) for s, t in phrase.links or ()]
    for s, t in zip(src.connectors, tgt.connectors, strict=True):
        if s >= 0 and t >= 0 and CONNECTOR_LINKS.get(src.words[s]) == tgt.words[t]:
            words.append((s, t))
    families = [p.family for p in phrases]
    gold = GoldLinks(
        family=families[0] if len(set(families)) == 1 else "mixed",
        parts=len(phrases),
        phrases=[(*s, *t) for s, t in zip(src.spans, tgt.spans, strict=True)],
        words=sorted(words),
        families=families if len(phrases) > 1 else None,
    )
    return Example(" ".join(src.words), " ".join(tgt.words), gold)


def random_example(
    rng: random.Random, n_parts: int, weights: dict[str, float] | None = None
) -> Example:
    """`n_parts` phrases joined by randomly chosen connectors, the same ones in both languages."""
    phrases = [random_phrase(rng, weights)]
    joins: list[Pair] = []
    source = phrases[0].en
    for _ in range(n_parts - 1):
        phrase = random_phrase(rng, weights)
        joins.append(pick_connector(rng, source, phrase.en))
        phrases.append(phrase)
        source = source + joins[-1][0] + phrase.en
    return sentence_from_phrases(phrases, joins)


def random_sentence(rng: random.Random, n_parts: int) -> Pair:
    """`n_parts` expressions joined by connectors: the pair of `random_example`."""
    return random_example(rng, n_parts).pair


# --- Splits --------------------------------------------------------------------


def _draw_unique(
    rng: random.Random,
    n: int,
    seen: set[str],
    part_weights: dict[int, float],
    min_chars: int,
    max_chars: int,
    weights: dict[str, float] | None = None,
) -> list[Example]:
    """Draw `n` sentences with unseen sources of `min_chars..max_chars` source characters.

    Adds their sources to `seen`. Raises RuntimeError if the constraints reject
    too many draws.
    """
    counts, part_w = list(part_weights), list(part_weights.values())
    examples: list[Example] = []
    for _ in range(n * MAX_DRAWS_PER_SENTENCE):
        if len(examples) == n:
            break
        example = random_example(rng, rng.choices(counts, weights=part_w)[0], weights)
        if min_chars <= len(example.source) <= max_chars and example.source not in seen:
            seen.add(example.source)
            examples.append(example)
    if len(examples) < n:
        raise RuntimeError(
            f"drew only {len(examples)} of {n} unique sentences of {min_chars}-{max_chars} chars"
        )
    return examples


def generate_examples(
    seed: int,
    n_train: int,
    n_dev: int,
    n_test: int,
    n_test_long: int,
    *,
    part_weights: Sequence[float] = PART_WEIGHTS,
    weights: dict[str, float] | None = None,
) -> dict[str, list[Example]]:
    """Deterministic train/dev/test splits with their gold, disjoint by source sentence.

    Train, dev and the first `n_test` test pairs have 1..len(part_weights) expressions
    (`part_weights[k]` is the weight of k+1 expressions) and at most MAX_SOURCE_CHARS source
    characters; the last `n_test_long` test pairs have more parts and
    MIN_LONG_SOURCE_CHARS..MAX_LONG_SOURCE_CHARS source characters, so they are longer than every
    train sentence. `weights` are the value families' draw weights (default: FAMILIES').
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    regular = dict(enumerate(part_weights, start=1))
    table = family_weights(weights)

    def draw(n: int) -> list[Example]:
        return _draw_unique(rng, n, seen, regular, 1, MAX_SOURCE_CHARS, table)

    train, dev, test = draw(n_train), draw(n_dev), draw(n_test)
    test += _draw_unique(
        rng,
        n_test_long,
        seen,
        LONG_PART_WEIGHTS,
        MIN_LONG_SOURCE_CHARS,
        MAX_LONG_SOURCE_CHARS,
        table,
    )
    return {"train": train, "dev": dev, "test": test}


def generate_splits(
    seed: int,
    n_train: int,
    n_dev: int,
    n_test: int,
    n_test_long: int,
    *,
    part_weights: Sequence[float] = PART_WEIGHTS,
    weights: dict[str, float] | None = None,
) -> dict[str, list[Pair]]:
    """The pairs of `generate_examples` (same arguments, same sentences)."""
    examples = generate_examples(
        seed, n_train, n_dev, n_test, n_test_long, part_weights=part_weights, weights=weights
    )
    return {name: [e.pair for e in split] for name, split in examples.items()}


# --- CLI -----------------------------------------------------------------------


def _length_stats(pairs: Sequence[Pair]) -> str:
    """'min-max' source length in characters, or '-' when empty."""
    if not pairs:
        return "-"
    lengths = [len(source) for source, _ in pairs]
    return f"{min(lengths)}-{max(lengths)}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The CLI flags."""
    parser = argparse.ArgumentParser(
        prog="python -m export.data.corpus",
        description="Generate the English→French numbers/dates/currency corpus as train/dev/test TSV files.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", type=int, default=40_000, help="train pairs")
    parser.add_argument("--dev", type=int, default=500, help="dev pairs")
    parser.add_argument("--test", type=int, default=1000, help="test pairs drawn like train")
    parser.add_argument(
        "--test-long", type=int, default=200, help="extra test pairs longer than any train pair"
    )
    parser.add_argument(
        "--part-weights",
        type=_float_list,
        default=PART_WEIGHTS,
        help="comma-separated weights of 1, 2, 3, ... phrases per sentence (default 4,3,2,1)",
    )
    return parser.parse_args(argv)


def _float_list(text: str) -> tuple[float, ...]:
    """'4,3,2,1' -> (4.0, 3.0, 2.0, 1.0)."""
    return tuple(float(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    """Write train/dev/test .tsv and .gold.jsonl into --out and print per-split stats."""
    args = _parse_args(argv)
    splits = generate_examples(
        args.seed, args.train, args.dev, args.test, args.test_long, part_weights=args.part_weights
    )
    args.out.mkdir(parents=True, exist_ok=True)
    for name, examples in splits.items():
        path = write_split(args.out, name, examples)
        pairs = [e.pair for e in examples]
        print(f"{name}: {len(pairs)} pairs, source chars {_length_stats(pairs)} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
