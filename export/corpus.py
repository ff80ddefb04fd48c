"""The parallel corpus: TSV I/O and the generated English→French demo corpus.

Every pair is built from real library output, never hand-written sentences:
`num2words` spells numbers, ordinals, years and decimals in both languages, and
Babel formats decimals, dates, times and currency amounts per locale. The
French side reorders (`ninety-seven` → `quatre-vingt-dix-sept`, `March 5, 2021`
→ `5 mars 2021`, `$3.50` → `3,50 $US`), which makes the attention alignments
worth looking at.

    python -m export.corpus --out data/numbers --seed 1 \
        --train 40000 --dev 500 --test 1000 --test-long 200
"""

from __future__ import annotations

import argparse
import datetime
import functools
import random
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from pathlib import Path

from babel import Locale
from babel.dates import format_date, format_time
from babel.numbers import format_currency, format_decimal, get_currency_precision
from num2words import num2words

Pair = tuple[str, str]

# Sentence shape: train, dev and regular test sentences.
PART_WEIGHTS: tuple[int, ...] = (4, 3, 2, 1)  # weight of 1, 2, 3, 4 expressions
MAX_PARTS = len(PART_WEIGHTS)
MAX_SOURCE_CHARS = 160  # cap on the English side of train/dev/test sentences

# Sentence shape: the long test sentences, all longer than any train sentence.
LONG_PART_WEIGHTS: dict[int, int] = {5: 1, 6: 1}
MIN_LONG_SOURCE_CHARS = MAX_SOURCE_CHARS + 1
MAX_LONG_SOURCE_CHARS = 220  # ~1.4x the train cap: longer, not absurdly long

# Rejection sampling gives up after this many draws per requested sentence.
MAX_DRAWS_PER_SENTENCE = 200

CURRENCIES: tuple[str, ...] = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD")
CONNECTORS: tuple[Pair, ...] = ((" and ", " et "), (", then ", ", puis "), (", ", ", "))
# num2words' English writes "one thousand, two hundred and five": after a scale word, " and " or
# ", " before another number word would read as one number, so only ", then " is used there.
UNAMBIGUOUS_CONNECTORS: tuple[Pair, ...] = ((", then ", ", puis "),)
_ENDS_WITH_SCALE = re.compile(r"\b(?:hundred|thousand|million)$")
FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)

_EN = Locale.parse("en")
_FR = Locale.parse("fr")
_SPACES = re.compile(" +")


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


# --- One expression, both languages --------------------------------------------


def normalize_spaces(text: str) -> str:
    """Map every Unicode space separator (U+00A0, U+202F, U+2009, ...) to ' ', collapse runs, strip."""
    plain = "".join(" " if unicodedata.category(c) == "Zs" else c for c in text)
    return _SPACES.sub(" ", plain).strip()


def _pair(source: str, target: str) -> Pair:
    """Normalize the spaces of both sides."""
    return normalize_spaces(source), normalize_spaces(target)


@functools.lru_cache(maxsize=4096)
def cardinal_pair(n: int) -> Pair:
    """A cardinal in words: 97 -> ("ninety-seven", "quatre-vingt-dix-sept")."""
    return _pair(num2words(n, lang="en"), num2words(n, lang="fr"))


@functools.lru_cache(maxsize=4096)
def ordinal_pair(n: int) -> Pair:
    """An ordinal in words: 21 -> ("twenty-first", "vingt et unième")."""
    return _pair(num2words(n, to="ordinal", lang="en"), num2words(n, to="ordinal", lang="fr"))


@functools.lru_cache(maxsize=4096)
def year_pair(year: int) -> Pair:
    """A year in words: 1999 -> ("nineteen ninety-nine", "mille neuf cent quatre-vingt-dix-neuf")."""
    return _pair(num2words(year, to="year", lang="en"), num2words(year, to="year", lang="fr"))


def decimal_digits_pair(x: Decimal) -> Pair:
    """A decimal in digits: 1234.5 -> ("1,234.5", "1 234,5")."""
    return _pair(format_decimal(x, locale=_EN), format_decimal(x, locale=_FR))


def decimal_words_pair(x: Decimal) -> Pair:
    """A decimal in words: 12.5 -> ("twelve point five", "douze virgule cinq")."""
    return _pair(num2words(x, lang="en"), num2words(x, lang="fr"))


def date_pair(d: datetime.date, full: bool = False) -> Pair:
    """A long date ("March 5, 2021" -> "5 mars 2021"), or the full one with the weekday."""
    fmt = "full" if full else "long"
    return _pair(format_date(d, format=fmt, locale=_EN), format_date(d, format=fmt, locale=_FR))


def time_pair(t: datetime.time) -> Pair:
    """A short time of day: 15:05 -> ("3:05 PM", "15:05")."""
    return _pair(
        format_time(t, format="short", locale=_EN), format_time(t, format="short", locale=_FR)
    )


def currency_pair(amount: Decimal, currency: str) -> Pair:
    """A currency amount: (3.50, "USD") -> ("$3.50", "3,50 $US")."""
    en = format_currency(amount, currency, locale=_EN)
    fr = format_currency(amount, currency, locale=_FR)
    return _pair(en, fr)


# --- Random draws --------------------------------------------------------------


def _random_magnitude(rng: random.Random) -> int:
    """An integer from a mix of ranges, so that small and multi-word numbers both appear."""
    bucket = rng.choices(("small", "medium", "large"), weights=(45, 35, 20))[0]
    if bucket == "small":
        return rng.randint(0, 100)
    if bucket == "medium":
        return rng.randint(101, 10_000)
    return rng.randint(10_001, 5_000_000)


def _random_decimal(rng: random.Random) -> Decimal:
    """A non-integral decimal with 1-2 fraction digits, the last one non-zero (no trailing zeros)."""
    whole = _random_magnitude(rng) if rng.random() < 0.5 else rng.randint(0, 100)
    places = rng.randint(1, 2)
    fraction = rng.randint(1, 10**places - 1)
    while fraction % 10 == 0:
        fraction = rng.randint(1, 10**places - 1)
    return Decimal(whole) + Decimal(fraction).scaleb(-places)


def _random_cardinal(rng: random.Random) -> Pair:
    """A cardinal from the mixed ranges."""
    return cardinal_pair(_random_magnitude(rng))


def _random_ordinal(rng: random.Random) -> Pair:
    """An ordinal, mostly below 100."""
    return ordinal_pair(rng.randint(1, 100) if rng.random() < 0.7 else rng.randint(101, 2000))


def _random_year(rng: random.Random) -> Pair:
    """A year in 1000-2099."""
    return year_pair(rng.randint(1000, 2099))


def _random_decimal_expr(rng: random.Random) -> Pair:
    """A decimal, in digits (2/3) or in words (1/3, whole part below 1000 to stay short)."""
    x = _random_decimal(rng)
    if rng.random() < 2 / 3:
        return decimal_digits_pair(x)
    return decimal_words_pair(x % 1000)


def _random_date(rng: random.Random) -> Pair:
    """A date in 1900-2099, long format (3/4) or full with the weekday (1/4)."""
    d = FIRST_DATE + datetime.timedelta(days=rng.randint(0, (LAST_DATE - FIRST_DATE).days))
    return date_pair(d, full=rng.random() < 0.25)


def _random_time(rng: random.Random) -> Pair:
    """A time of day to the minute."""
    return time_pair(datetime.time(rng.randint(0, 23), rng.randint(0, 59)))


def _random_currency(rng: random.Random) -> Pair:
    """An amount in one of CURRENCIES, with that currency's usual number of fraction digits."""
    currency = rng.choice(CURRENCIES)
    cents = 10 ** get_currency_precision(currency)
    units = _random_magnitude(rng) if rng.random() < 0.6 else rng.randint(0, 100)
    fraction = rng.randint(0, cents - 1) if cents > 1 else 0
    return currency_pair(Decimal(units) + Decimal(fraction) / cents, currency)


# Expression kinds and their draw weights.
EXPRESSION_KINDS: tuple[tuple[Callable[[random.Random], Pair], int], ...] = (
    (_random_cardinal, 30),
    (_random_ordinal, 10),
    (_random_year, 12),
    (_random_decimal_expr, 12),
    (_random_date, 14),
    (_random_time, 10),
    (_random_currency, 12),
)


def random_expression(rng: random.Random) -> Pair:
    """One (English, French) expression of a randomly chosen kind."""
    draws, weights = zip(*EXPRESSION_KINDS, strict=True)
    return rng.choices(draws, weights=weights)[0](rng)


def pick_connector(rng: random.Random, left_en: str, right_en: str) -> Pair:
    """A random (English, French) connector that keeps `left_en` and `right_en` apart.

    "one thousand" + " and " + "five" would read as 1005, so after a scale word
    and before a spelled number only UNAMBIGUOUS_CONNECTORS are allowed.
    """
    if _ENDS_WITH_SCALE.search(left_en) and right_en[:1].islower():
        return rng.choice(UNAMBIGUOUS_CONNECTORS)
    return rng.choice(CONNECTORS)


def random_sentence(rng: random.Random, n_parts: int) -> Pair:
    """`n_parts` expressions joined by randomly chosen connectors, the same ones in both languages."""
    source, target = random_expression(rng)
    for _ in range(n_parts - 1):
        en, fr = random_expression(rng)
        en_join, fr_join = pick_connector(rng, source, en)
        source, target = source + en_join + en, target + fr_join + fr
    return source, target


# --- Splits --------------------------------------------------------------------


def _draw_unique(
    rng: random.Random,
    n: int,
    seen: set[str],
    part_weights: dict[int, int],
    min_chars: int,
    max_chars: int,
) -> list[Pair]:
    """Draw `n` sentences with unseen sources of `min_chars..max_chars` source characters.

    Adds their sources to `seen`. Raises RuntimeError if the constraints reject
    too many draws.
    """
    counts, weights = list(part_weights), list(part_weights.values())
    pairs: list[Pair] = []
    for _ in range(n * MAX_DRAWS_PER_SENTENCE):
        if len(pairs) == n:
            break
        source, target = random_sentence(rng, rng.choices(counts, weights=weights)[0])
        if min_chars <= len(source) <= max_chars and source not in seen:
            seen.add(source)
            pairs.append((source, target))
    if len(pairs) < n:
        raise RuntimeError(
            f"drew only {len(pairs)} of {n} unique sentences of {min_chars}-{max_chars} chars"
        )
    return pairs


def generate_splits(
    seed: int, n_train: int, n_dev: int, n_test: int, n_test_long: int
) -> dict[str, list[Pair]]:
    """Deterministic train/dev/test splits, disjoint by source sentence.

    Train, dev and the first `n_test` test pairs have 1..MAX_PARTS expressions
    and at most MAX_SOURCE_CHARS source characters; the last `n_test_long` test
    pairs have more parts and MIN_LONG_SOURCE_CHARS..MAX_LONG_SOURCE_CHARS
    source characters, so they are longer than every train sentence.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    regular = dict(enumerate(PART_WEIGHTS, start=1))

    def draw(n: int) -> list[Pair]:
        return _draw_unique(rng, n, seen, regular, 1, MAX_SOURCE_CHARS)

    train, dev, test = draw(n_train), draw(n_dev), draw(n_test)
    test += _draw_unique(
        rng, n_test_long, seen, LONG_PART_WEIGHTS, MIN_LONG_SOURCE_CHARS, MAX_LONG_SOURCE_CHARS
    )
    return {"train": train, "dev": dev, "test": test}


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
        prog="python -m export.corpus",
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Write train.tsv, dev.tsv and test.tsv into --out and print per-split stats."""
    args = _parse_args(argv)
    splits = generate_splits(args.seed, args.train, args.dev, args.test, args.test_long)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        path = args.out / f"{name}.tsv"
        write_tsv(path, pairs)
        print(f"{name}: {len(pairs)} pairs, source chars {_length_stats(pairs)} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
