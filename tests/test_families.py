"""Tests for export/data/families.py: every value family's phrases and their word links."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pytest

pytest.importorskip("num2words")
pytest.importorskip("babel")

from export.data.families import (
    FAMILIES,
    MAX_CARDINAL,
    TAIL,
    cardinal_atoms,
    cardinal_phrase,
    currency_pair,
    currency_words_phrase,
    date_links,
    date_pair,
    decimal_words_links,
    decimal_words_pair,
    family_weights,
    integer_digits_pair,
    match_atoms,
    ordinal_phrase,
    random_phrase,
    single_word_links,
    year_links,
    year_pair,
)

DRAWS = 150


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_draws_its_own_phrases_with_links_in_range(name: str) -> None:
    draw = FAMILIES[name][0]
    rng = random.Random(11)
    linked = 0
    for _ in range(DRAWS):
        phrase = draw(rng)
        assert phrase.family == name
        en_words, fr_words = phrase.en.split(" "), phrase.fr.split(" ")
        assert all(en_words) and all(fr_words), (phrase.en, phrase.fr)
        if phrase.links is not None:
            linked += 1
            assert phrase.links, phrase
            for s, t in phrase.links:
                assert 0 <= s < len(en_words) and 0 <= t < len(fr_words), phrase
    # every family's construction reproduces the libraries' strings (a change there shows here)
    assert linked >= 0.95 * DRAWS, f"{name}: only {linked}/{DRAWS} phrases got word links"


@pytest.mark.parametrize(
    ("n", "en", "fr", "links"),
    [
        (
            4_000_205,
            "four million, two hundred and five",
            "quatre millions deux cent cinq",
            [(0, 0), (1, 1), (2, 2), (3, 3), (5, 4)],
        ),
        (21, "twenty-one", "vingt et un", [(0, 0), (0, 1), (0, 2)]),
        (10_000, "ten thousand", "dix mille", [(0, 0), (1, 1)]),
        (1_000_001, "one million and one", "un million un", [(0, 0), (1, 1), (3, 2)]),
        (1_000, "one thousand", "mille", [(0, 0), (1, 0)]),
        (2_005, "two thousand and five", "deux mille cinq", [(0, 0), (1, 1), (3, 2)]),
        (101, "one hundred and one", "cent un", [(0, 0), (1, 0), (3, 1)]),
    ],
)
def test_cardinal_links_known_examples(
    n: int, en: str, fr: str, links: list[tuple[int, int]]
) -> None:
    phrase = cardinal_phrase(n, "cardinal-words")
    assert (phrase.en, phrase.fr) == (en, fr)
    assert phrase.links is not None and sorted(phrase.links) == links


def test_cardinals_up_to_the_largest_are_linked() -> None:
    for n in (MAX_CARDINAL, 200_000, 5_000_000, 80_000, 71, 999_001_000):
        assert cardinal_phrase(n, "cardinal-words").links is not None, n


@pytest.mark.parametrize(
    ("n", "en", "fr", "links"),
    [
        (1_000, "one thousandth", "millième", [(0, 0), (1, 0)]),
        (2_000, "two thousandth", "deux millième", [(0, 0), (1, 1)]),
        (10_000, "ten thousandth", "dix millième", [(0, 0), (1, 1)]),
        (1_000_000, "one millionth", "un millionième", [(0, 0), (1, 1)]),
        (21, "twenty-first", "vingt et unième", [(0, 0), (0, 1), (0, 2)]),
    ],
)
def test_ordinal_links_known_examples(
    n: int, en: str, fr: str, links: list[tuple[int, int]]
) -> None:
    phrase = ordinal_phrase(n, "ordinal")
    assert (phrase.en, phrase.fr) == (en, fr)
    assert phrase.links is not None and sorted(phrase.links) == links


def test_ordinal_thousands_never_draws_the_wrong_french_millions() -> None:
    rng = random.Random(5)
    phrases = [FAMILIES["ordinal-thousands"][0](rng) for _ in range(300)]
    assert not any("millionsième" in p.fr for p in phrases)
    assert {p.en for p in phrases} >= {"one millionth"}


def test_atoms_that_do_not_reproduce_the_library_give_no_links() -> None:
    en, fr = "four million, two hundred and five", "quatre millions deux cent cinq"
    assert match_atoms(en, fr, cardinal_atoms(4_000_205)) is not None
    assert match_atoms(en, fr, cardinal_atoms(4_000_206)) is None  # a different number
    assert match_atoms(en, fr, cardinal_atoms(4_000_205)[:-1]) is None  # words left over
    assert match_atoms(en, "quatre millions deux cent", cardinal_atoms(4_000_205)) is None
    assert match_atoms("first", "premier", [TAIL]) == ((0, 0),)


def test_several_words_on_both_sides_of_one_unit_give_no_links() -> None:
    # "Japanese yen" ↔ "yens japonais": which word goes with which is not known
    phrase = currency_words_phrase(3, "JPY", short=False, in_words=True)
    assert (phrase.en, phrase.fr) == ("three Japanese yen", "trois yens japonais")
    assert phrase.links == ((0, 0),)


@pytest.mark.parametrize(
    ("n", "currency", "short", "in_words", "en", "fr", "links"),
    [
        (42, "EUR", False, True, "forty-two euros", "quarante-deux euros", [(0, 0), (1, 1)]),
        (1, "USD", True, True, "one dollar", "un dollar", [(0, 0), (1, 1)]),
        (3, "GBP", True, True, "three pounds", "trois livres", [(0, 0), (1, 1)]),
        (1000, "EUR", True, False, "1,000 euros", "1 000 euros", [(0, 0), (0, 1), (1, 2)]),
    ],
)
def test_currency_words_known_examples(
    n: int,
    currency: str,
    short: bool,
    in_words: bool,
    en: str,
    fr: str,
    links: list[tuple[int, int]],
) -> None:
    phrase = currency_words_phrase(n, currency, short=short, in_words=in_words)
    assert (phrase.en, phrase.fr) == (en, fr)
    assert phrase.links is not None and sorted(phrase.links) == links


def test_digit_families_link_every_word_to_the_one_word_side() -> None:
    en, fr = currency_pair(Decimal("1000.00"), "USD")
    assert (en, fr) == ("$1,000.00", "1 000,00 $US")
    assert single_word_links(en, fr) == ((0, 0), (0, 1), (0, 2))
    assert integer_digits_pair(25) == ("25", "25")
    assert integer_digits_pair(1000) == ("1,000", "1 000")


def test_date_links_pair_month_weekday_day_and_year() -> None:
    d = datetime.date(2021, 3, 5)
    en, fr = date_pair(d)
    assert (en, fr) == ("March 5, 2021", "5 mars 2021")
    assert date_links(d, en, fr) == ((0, 1), (1, 0), (2, 2))
    en, fr = date_pair(d, full=True)
    assert (en, fr) == ("Friday, March 5, 2021", "vendredi 5 mars 2021")
    assert date_links(d, en, fr) == ((0, 0), (1, 2), (2, 1), (3, 3))
    assert date_links(datetime.date(2021, 3, 6), en, fr) is None  # not this date's words


def test_year_and_decimal_words_links() -> None:
    en, fr = year_pair(1999)
    assert year_links(1999, en, fr) == ((0, 0), (0, 1), (0, 2), (1, 3))
    x = Decimal("12.05")
    en, fr = decimal_words_pair(x)
    assert (en, fr) == ("twelve point zero five", "douze virgule zéro cinq")
    assert decimal_words_links(x, en, fr) == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_family_weights_override_and_refuse_unknown_names() -> None:
    weights = family_weights({"time": 0})
    assert weights["time"] == 0 and weights["year"] == FAMILIES["year"][1]
    with pytest.raises(ValueError, match="unknown value families"):
        family_weights({"cardinals": 1})
    only_years = {name: 0.0 for name in FAMILIES} | {"year": 1.0}
    rng = random.Random(1)
    assert {random_phrase(rng, only_years).family for _ in range(20)} == {"year"}
