"""Value families of the English→French corpus: one phrase in both languages, with its word links.

Every phrase is real library output, never a hand-written sentence: `num2words` spells numbers,
ordinals, years and decimals in both languages, Babel formats digits, dates, times, currency amounts
and currency names per locale. Each family is a named generator (`FAMILIES`), so the gold sidecar and
the audit can report per family.

Word links (the gold sidecar's "words") are built from the structure the generator used (a number's
groups: "four million" ↔ "quatre millions", "hundred" ↔ "cent", "twenty-one" ↔ "vingt et un"; month
↔ month, weekday ↔ weekday) and then checked against the library's full string: when the
reconstruction does not consume exactly the library's words, the phrase gets no word links rather
than wrong ones.
"""

from __future__ import annotations

import datetime
import functools
import random
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from babel import Locale
from babel.dates import format_date, format_time, get_day_names, get_month_names
from babel.numbers import (
    format_currency,
    format_decimal,
    get_currency_name,
    get_currency_precision,
)
from num2words import num2words

Pair = tuple[str, str]
Link = tuple[int, int]  # (source word, target word) inside one phrase

CURRENCIES: tuple[str, ...] = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD")
# Babel's currency names are the formal ones ("US dollars" / "dollars des États-Unis", "British
# pounds" / "livres sterling"); num2words' English has "pounds sterling" and an uninflected "euro".
# The short names people write ("three pounds", "forty-two euros", "one dollar") are in neither
# library, hence this tiny closed table: (English singular, plural), (French singular, plural).
SHORT_CURRENCY_NAMES: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "USD": (("dollar", "dollars"), ("dollar", "dollars")),
    "EUR": (("euro", "euros"), ("euro", "euros")),
    "GBP": (("pound", "pounds"), ("livre", "livres")),
}
FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)
MAX_CARDINAL = 999_999_999

_EN = Locale.parse("en")
_FR = Locale.parse("fr")
_SPACES = re.compile(" +")


@dataclass(frozen=True)
class Phrase:
    """One expression in both languages; `links` are word links inside it (None: not verified)."""

    en: str
    fr: str
    family: str
    links: tuple[Link, ...] | None = None


def normalize_spaces(text: str) -> str:
    """Map every Unicode space separator (U+00A0, U+202F, U+2009, ...) to ' ', collapse runs, strip."""
    plain = "".join(" " if unicodedata.category(c) == "Zs" else c for c in text)
    return _SPACES.sub(" ", plain).strip()


def _pair(source: str, target: str) -> Pair:
    """Normalize the spaces of both sides."""
    return normalize_spaces(source), normalize_spaces(target)


# --- Library calls, both languages ------------------------------------------------


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


def integer_digits_pair(n: int) -> Pair:
    """An integer in digits: 1000 -> ("1,000", "1 000")."""
    return _pair(format_decimal(n, locale=_EN), format_decimal(n, locale=_FR))


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
    return _pair(
        format_currency(amount, currency, locale=_EN), format_currency(amount, currency, locale=_FR)
    )


def currency_name_pair(count: int, currency: str, short: bool) -> Pair:
    """The currency's name for `count` units: Babel's formal name, or the short name people write.

    (2, "EUR", False) -> ("euros", "euros"); (1, "USD", False) -> ("US dollar", "dollar des
    États-Unis"); (3, "GBP", True) -> ("pounds", "livres"). French is singular below 2.
    """
    if short:
        (en_one, en_many), (fr_one, fr_many) = SHORT_CURRENCY_NAMES[currency]
        return en_one if count == 1 else en_many, fr_one if count < 2 else fr_many
    return _pair(
        get_currency_name(currency, count, locale=_EN),
        get_currency_name(currency, count, locale=_FR),
    )


# --- Word links ---------------------------------------------------------------------

Atom = tuple[list[str], list[str]]  # words of one meaning unit: (English words, French words)
TAIL: Atom = ([], [])  # as the last atom: "whatever words are left" (an ordinal's or a year's end)


def _norm(word: str) -> str:
    """Compare words up to case, an attached comma and French plural s: "cents" = "cent"."""
    return "-".join(p.rstrip("s") for p in word.lower().rstrip(",").split("-"))


def _atom_links(source: list[int], target: list[int]) -> list[Link]:
    """Links of one atom: every pair when one side is one word ("twenty-one" ↔ "vingt et un"),
    none when both sides have several words (then which word goes with which is not known)."""
    if len(source) == 1 or len(target) == 1:
        return [(s, t) for s in source for t in target]
    return []


def match_atoms(en: str, fr: str, atoms: Sequence[Atom]) -> tuple[Link, ...] | None:
    """Word links from atoms that must consume exactly the words of `en` and `fr`, in order.

    English "and" inside a number ("two hundred and five") is skipped (it has no French word);
    a TAIL atom last takes whatever is left on both sides (each side must have something left).
    None when the atoms do not reproduce the library's words.
    """
    en_words, fr_words = en.split(" "), fr.split(" ")
    i = j = 0
    links: list[Link] = []
    for k, (atom_en, atom_fr) in enumerate(atoms):
        if k == len(atoms) - 1 and (atom_en, atom_fr) == TAIL:
            while i < len(en_words) and _norm(en_words[i]) == "and":
                i += 1
            if i == len(en_words) or j == len(fr_words):
                return None
            links += _atom_links(list(range(i, len(en_words))), list(range(j, len(fr_words))))
            return tuple(links)
        src: list[int] = []
        for word in atom_en:
            while i < len(en_words) and _norm(en_words[i]) == "and" and word != "and":
                i += 1
            if i == len(en_words) or _norm(en_words[i]) != _norm(word):
                return None
            src.append(i)
            i += 1
        tgt: list[int] = []
        for word in atom_fr:
            if j == len(fr_words) or _norm(fr_words[j]) != _norm(word):
                return None
            tgt.append(j)
            j += 1
        links += _atom_links(src, tgt)
    if i != len(en_words) or j != len(fr_words):
        return None
    return tuple(links)


def cardinal_atoms(n: int) -> list[Atom]:
    """A number's meaning units, group by group: 4,000,205 → four|quatre, million|millions,
    two|deux, hundred|cent, five|cinq. French drops "un" before "cent" and "mille", so "one
    hundred" ↔ "cent" and "one thousand" ↔ "mille" are one unit each."""
    if n == 0:
        return [(["zero"], ["zéro"])]
    atoms: list[Atom] = []
    for scale, en_name, fr_name in ((10**6, "million", "million"), (10**3, "thousand", "mille")):
        group = (n // scale) % 1000
        if group == 1 and scale == 10**3:
            atoms.append((["one", "thousand"], ["mille"]))
        elif group:
            atoms += [*_group_atoms(group), ([en_name], [fr_name])]
    return atoms + _group_atoms(n % 1000)


def _group_atoms(group: int) -> list[Atom]:
    """The units of a number below 1000: hundreds digit, "hundred", the rest below 100."""
    hundreds, rest = divmod(group, 100)
    atoms: list[Atom] = []
    if hundreds == 1:
        atoms.append((["one", "hundred"], ["cent"]))
    elif hundreds:
        atoms += [_words_atom(hundreds), (["hundred"], ["cent"])]
    if rest:
        atoms.append(_words_atom(rest))
    return atoms


def _words_atom(n: int) -> Atom:
    """A number below 100 as one unit: "twenty-one" ↔ "vingt et un"."""
    en, fr = cardinal_pair(n)
    return en.split(" "), fr.split(" ")


def single_word_links(en: str, fr: str) -> tuple[Link, ...] | None:
    """When one side is one word ("$1,000.00" ↔ "1 000,00 $US"), every word of the other is its."""
    return match_atoms(en, fr, [(en.split(" "), fr.split(" "))]) or None


def year_links(year: int, en: str, fr: str) -> tuple[Link, ...] | None:
    """ "nineteen ninety-nine" ↔ "mille neuf cent | quatre-vingt-dix-neuf"; "two thousand and five"
    (the cardinal form) by the number's units."""
    if en == cardinal_pair(year)[0]:
        return match_atoms(en, fr, cardinal_atoms(year))
    century_en = cardinal_pair(year // 100)[0]
    century_fr = cardinal_pair(year // 100 * 100)[1]
    return match_atoms(en, fr, [(century_en.split(" "), century_fr.split(" ")), TAIL])


def decimal_words_links(x: Decimal, en: str, fr: str) -> tuple[Link, ...] | None:
    """Whole part by its units, "point" ↔ "virgule", then one unit per fraction digit."""
    whole, _, fraction = f"{x:f}".partition(".")
    atoms = [*cardinal_atoms(int(whole)), (["point"], ["virgule"])]
    atoms += [_words_atom(int(d)) if d != "0" else (["zero"], ["zéro"]) for d in fraction]
    return match_atoms(en, fr, atoms)


@functools.lru_cache(maxsize=1)
def _calendar_words() -> dict[str, dict[str, tuple[str, int]]]:
    """Month and weekday names per language → ("month", 1..12) / ("weekday", 0..6)."""
    out: dict[str, dict[str, tuple[str, int]]] = {}
    for lang in ("en", "fr"):
        names = {
            str(v).lower(): ("month", k) for k, v in get_month_names("wide", locale=lang).items()
        }
        names.update(
            {str(v).lower(): ("weekday", k) for k, v in get_day_names("wide", locale=lang).items()}
        )
        out[lang] = names
    return out


def _date_part(word: str, lang: str) -> tuple[str, int] | None:
    """What a date word denotes: a month, a weekday or a number ("5," → 5, "1er" → 1)."""
    bare = word.lower().rstrip(",")
    if bare in _calendar_words()[lang]:
        return _calendar_words()[lang][bare]
    digits = bare.removesuffix("er")
    return ("number", int(digits)) if digits.isdigit() else None


def date_links(d: datetime.date, en: str, fr: str) -> tuple[Link, ...] | None:
    """Month ↔ month, weekday ↔ weekday, day ↔ day, year ↔ year: every word of both sides must
    denote one of the date's own parts, each once per side."""
    expected = {("month", d.month), ("number", d.day), ("number", d.year), ("weekday", d.weekday())}
    sides = []
    for text, lang in ((en, "en"), (fr, "fr")):
        parts = [_date_part(w, lang) for w in text.split(" ")]
        if None in parts or len(set(parts)) != len(parts) or not set(parts) <= expected:
            return None
        sides.append(parts)
    en_parts, fr_parts = sides
    if set(en_parts) != set(fr_parts):
        return None
    return tuple((i, fr_parts.index(p)) for i, p in enumerate(en_parts))


# --- Draws ------------------------------------------------------------------------


def random_magnitude(rng: random.Random) -> int:
    """An integer from a mix of ranges up to MAX_CARDINAL; small numbers stay the most common."""
    bucket = rng.choices(("small", "medium", "large", "huge"), weights=(42, 33, 17, 8))[0]
    if bucket == "small":
        return rng.randint(0, 100)
    if bucket == "medium":
        return rng.randint(101, 10_000)
    if bucket == "large":
        return rng.randint(10_001, 5_000_000)
    return rng.randint(5_000_001, MAX_CARDINAL)


def random_round(rng: random.Random) -> int:
    """A round number of 1,000 and more: ten thousand, two hundred thousand, one million, five million."""
    scale = rng.choice((10**3, 10**6))
    head = rng.choice(
        (rng.randint(1, 9), rng.randint(1, 9) * 10, rng.randint(1, 9) * 100, rng.randint(1, 999))
    )
    return head * scale


def random_sparse(rng: random.Random) -> int:
    """A round number plus a small one: one million and one, two thousand and five."""
    return random_round(rng) + rng.choice(
        (rng.randint(1, 9), rng.randint(1, 99), rng.randint(1, 999))
    )


def _random_decimal(rng: random.Random) -> Decimal:
    """A non-integral decimal with 1-2 fraction digits, the last one non-zero (no trailing zeros)."""
    whole = random_magnitude(rng) if rng.random() < 0.5 else rng.randint(0, 100)
    places = rng.randint(1, 2)
    fraction = rng.randint(1, 10**places - 1)
    while fraction % 10 == 0:
        fraction = rng.randint(1, 10**places - 1)
    return Decimal(whole) + Decimal(fraction).scaleb(-places)


def _random_date(rng: random.Random) -> datetime.date:
    return FIRST_DATE + datetime.timedelta(days=rng.randint(0, (LAST_DATE - FIRST_DATE).days))


def cardinal_phrase(n: int, family: str) -> Phrase:
    en, fr = cardinal_pair(n)
    return Phrase(en, fr, family, match_atoms(en, fr, cardinal_atoms(n)))


def cardinal_words(rng: random.Random) -> Phrase:
    """A cardinal in words from the mixed ranges (mostly small)."""
    return cardinal_phrase(random_magnitude(rng), "cardinal-words")


def cardinal_round(rng: random.Random) -> Phrase:
    """A round cardinal of 1,000 and more in words: "two hundred thousand" → "deux cent mille"."""
    return cardinal_phrase(random_round(rng), "cardinal-round")


def cardinal_sparse(rng: random.Random) -> Phrase:
    """A sparse cardinal in words: "one million and one" → "un million un"."""
    return cardinal_phrase(random_sparse(rng), "cardinal-sparse")


def integer_digits(rng: random.Random) -> Phrase:
    """An integer in digits, round ones of 1,000 and more included: "1,000" → "1 000"."""
    n = random_round(rng) if rng.random() < 0.3 else random_magnitude(rng)
    en, fr = integer_digits_pair(n)
    return Phrase(en, fr, "integer-digits", single_word_links(en, fr))


def ordinal_phrase(n: int, family: str) -> Phrase:
    en, fr = ordinal_pair(n)
    return Phrase(en, fr, family, match_atoms(en, fr, [*cardinal_atoms(n)[:-1], TAIL]))


def ordinal(rng: random.Random) -> Phrase:
    """An ordinal, mostly below 100: "twenty-first" → "vingt et unième"."""
    return ordinal_phrase(
        rng.randint(1, 100) if rng.random() < 0.7 else rng.randint(101, 2000), "ordinal"
    )


def ordinal_thousands(rng: random.Random) -> Phrase:
    """A thousandth ordinal: "two thousandth" → "deux millième", "one millionth" → "un millionième".

    Only multiples of 1,000 below a million and the millionth itself: num2words 0.5's French
    gives "deux millionsième" for 2,000,000, which is wrong French.
    """
    n = (
        10**6
        if rng.random() < 0.1
        else rng.choice((rng.randint(1, 10), rng.randint(1, 999))) * 1000
    )
    return ordinal_phrase(n, "ordinal-thousands")


def year(rng: random.Random) -> Phrase:
    """A year in 1000-2099 in words."""
    y = rng.randint(1000, 2099)
    en, fr = year_pair(y)
    return Phrase(en, fr, "year", year_links(y, en, fr))


def decimal_digits(rng: random.Random) -> Phrase:
    """A decimal in digits: "1,234.5" → "1 234,5"."""
    en, fr = decimal_digits_pair(_random_decimal(rng))
    return Phrase(en, fr, "decimal-digits", single_word_links(en, fr))


def decimal_words(rng: random.Random) -> Phrase:
    """A decimal in words, whole part below 1000 to stay short: "twelve point five"."""
    x = _random_decimal(rng) % 1000
    en, fr = decimal_words_pair(x)
    return Phrase(en, fr, "decimal-words", decimal_words_links(x, en, fr))


def date_long(rng: random.Random) -> Phrase:
    """A date in 1900-2099: "March 5, 2021" → "5 mars 2021"."""
    d = _random_date(rng)
    en, fr = date_pair(d)
    return Phrase(en, fr, "date-long", date_links(d, en, fr))


def date_full(rng: random.Random) -> Phrase:
    """A date with its weekday: "Friday, March 5, 2021" → "vendredi 5 mars 2021"."""
    d = _random_date(rng)
    en, fr = date_pair(d, full=True)
    return Phrase(en, fr, "date-full", date_links(d, en, fr))


def time_of_day(rng: random.Random) -> Phrase:
    """A time of day to the minute: "3:05 PM" → "15:05"."""
    en, fr = time_pair(datetime.time(rng.randint(0, 23), rng.randint(0, 59)))
    return Phrase(en, fr, "time", single_word_links(en, fr))


def _amount(rng: random.Random, currency: str, units: int) -> Decimal:
    """`units` plus a random fraction in the currency's usual number of fraction digits."""
    cents = 10 ** get_currency_precision(currency)
    fraction = rng.randint(0, cents - 1) if cents > 1 else 0
    return Decimal(units) + Decimal(fraction) / cents


def currency_symbol(rng: random.Random) -> Phrase:
    """An amount with its symbol: "$3.50" → "3,50 $US"."""
    currency = rng.choice(CURRENCIES)
    units = random_magnitude(rng) if rng.random() < 0.6 else rng.randint(0, 100)
    en, fr = currency_pair(_amount(rng, currency, units), currency)
    return Phrase(en, fr, "currency-symbol", single_word_links(en, fr))


def currency_round(rng: random.Random) -> Phrase:
    """A round amount of 1,000 and more: "$1,000.00" → "1 000,00 $US"."""
    currency = rng.choice(CURRENCIES)
    amount = Decimal(random_round(rng)) + (_amount(rng, currency, 0) if rng.random() < 0.3 else 0)
    en, fr = currency_pair(amount, currency)
    return Phrase(en, fr, "currency-round", single_word_links(en, fr))


def currency_words(rng: random.Random) -> Phrase:
    """A count of a named currency, the amount in words or digits: "forty-two euros" →
    "quarante-deux euros", "3 British pounds" → "3 livres sterling"."""
    currency = rng.choice(CURRENCIES)
    short = currency in SHORT_CURRENCY_NAMES and rng.random() < 0.6
    n = rng.choice((rng.randint(1, 100), random_magnitude(rng) or 1, random_round(rng)))
    return currency_words_phrase(n, currency, short=short, in_words=rng.random() < 0.6)


def currency_words_phrase(n: int, currency: str, short: bool, in_words: bool) -> Phrase:
    """`n` units of `currency` named in words (short or Babel's formal name), the amount in words
    or in digits, with word links: "forty-two" ↔ "quarante-deux", "euros" ↔ "euros"."""
    name_en, name_fr = currency_name_pair(n, currency, short)
    name: Atom = (name_en.split(" "), name_fr.split(" "))
    if in_words:
        amount_en, amount_fr = cardinal_pair(n)
        atoms = [*cardinal_atoms(n), name]
    else:
        amount_en, amount_fr = integer_digits_pair(n)
        atoms = [(amount_en.split(" "), amount_fr.split(" ")), name]
    en, fr = f"{amount_en} {name_en}", f"{amount_fr} {name_fr}"
    return Phrase(en, fr, "currency-words", match_atoms(en, fr, atoms))


FamilyDraw = Callable[[random.Random], Phrase]
# Each family's generator and its default draw weight (the old seven kinds keep their shares of
# about 30/10/12/12/14/10/12; the new families take a share of their kind's weight plus a little).
FAMILIES: dict[str, tuple[FamilyDraw, float]] = {
    "cardinal-words": (cardinal_words, 20),
    "cardinal-round": (cardinal_round, 6),
    "cardinal-sparse": (cardinal_sparse, 6),
    "integer-digits": (integer_digits, 6),
    "ordinal": (ordinal, 8),
    "ordinal-thousands": (ordinal_thousands, 3),
    "year": (year, 10),
    "decimal-digits": (decimal_digits, 8),
    "decimal-words": (decimal_words, 5),
    "date-long": (date_long, 10),
    "date-full": (date_full, 5),
    "time": (time_of_day, 9),
    "currency-symbol": (currency_symbol, 9),
    "currency-round": (currency_round, 4),
    "currency-words": (currency_words, 6),
}


def family_weights(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The default weights with `overrides` applied; an unknown family name is a ValueError."""
    weights = {name: weight for name, (_, weight) in FAMILIES.items()}
    unknown = sorted(set(overrides or {}) - set(weights))
    if unknown:
        raise ValueError(f"unknown value families {unknown} (known: {sorted(weights)})")
    weights.update(overrides or {})
    return weights


def random_phrase(rng: random.Random, weights: dict[str, float] | None = None) -> Phrase:
    """One phrase of a family drawn by weight."""
    table = weights or family_weights()
    names = list(table)
    name = rng.choices(names, weights=[table[n] for n in names])[0]
    return FAMILIES[name][0](rng)
