"""Tests for the gold alignment sidecar: export/data/gold.py and what export/data/corpus.py writes into it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("num2words")
pytest.importorskip("babel")

import itertools

from export.data.corpus import (
    CONNECTOR_LINKS,
    Example,
    generate_examples,
    main,
    random_example,
    read_tsv,
    sentence_from_phrases,
)
from export.data.families import FAMILIES, cardinal_phrase, date_long
from export.data.gold import GoldLinks, read_gold, write_gold

SOURCE_CONNECTORS = set(CONNECTOR_LINKS)
TARGET_CONNECTORS = set(CONNECTOR_LINKS.values())


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    splits = generate_examples(1, 400, 30, 30, 10)
    return [e for split in splits.values() for e in split]


def _covered(spans: list[tuple[int, int]]) -> set[int]:
    return {i for start, end in spans for i in range(start, end)}


def test_phrase_spans_cover_exactly_the_non_connector_words(examples: list[Example]) -> None:
    for e in examples:
        src, tgt = e.source.split(" "), e.target.split(" ")
        g = e.gold
        assert g.parts == len(g.phrases)
        src_spans = [(a, b) for a, b, _, _ in g.phrases]
        tgt_spans = [(c, d) for _, _, c, d in g.phrases]
        for spans, words in ((src_spans, src), (tgt_spans, tgt)):
            assert all(0 <= a < b <= len(words) for a, b in spans), e
            assert all(b <= a2 for (_, b), (a2, _) in itertools.pairwise(spans)), e
        gaps_src = [src[i] for i in range(len(src)) if i not in _covered(src_spans)]
        gaps_tgt = [tgt[i] for i in range(len(tgt)) if i not in _covered(tgt_spans)]
        assert set(gaps_src) <= SOURCE_CONNECTORS, (e.source, gaps_src)
        assert set(gaps_tgt) <= TARGET_CONNECTORS, (e.target, gaps_tgt)
        assert len(gaps_src) == len(gaps_tgt)


def test_word_links_are_in_range_and_inside_one_phrase_or_a_connector(
    examples: list[Example],
) -> None:
    for e in examples:
        src, tgt = e.source.split(" "), e.target.split(" ")
        for s, t in e.gold.words:
            assert 0 <= s < len(src) and 0 <= t < len(tgt), e
            same_phrase = any(a <= s < b and c <= t < d for a, b, c, d in e.gold.phrases)
            connector = CONNECTOR_LINKS.get(src[s]) == tgt[t]
            assert same_phrase or connector, (e.source, e.target, s, t)
        assert len(set(e.gold.words)) == len(e.gold.words)


def test_families_and_parts(examples: list[Example]) -> None:
    for e in examples:
        g = e.gold
        if g.parts == 1:
            assert g.family in FAMILIES and g.families is None
        else:
            assert g.families is not None and len(g.families) == g.parts
            assert set(g.families) <= set(FAMILIES)
            expected = g.families[0] if len(set(g.families)) == 1 else "mixed"
            assert g.family == expected
    assert {e.gold.parts for e in examples} >= {1, 2, 3, 4, 5}


def test_most_words_are_linked(examples: list[Example]) -> None:
    # every family's links are verified against the libraries: nearly every sentence has some
    linked = sum(1 for e in examples if e.gold.words)
    assert linked >= 0.95 * len(examples)


def test_sentence_gold_spot_check() -> None:
    phrases = [cardinal_phrase(4_000_205, "cardinal-words"), cardinal_phrase(21, "cardinal-words")]
    e = sentence_from_phrases(phrases, [(", then ", ", puis ")])
    assert e.source == "four million, two hundred and five, then twenty-one"
    assert e.target == "quatre millions deux cent cinq, puis vingt et un"
    assert e.gold.family == "cardinal-words" and e.gold.parts == 2
    assert e.gold.families == ["cardinal-words", "cardinal-words"]
    assert e.gold.phrases == [(0, 6, 0, 5), (7, 8, 6, 9)]
    assert e.gold.words == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        (5, 4),  # "five," ↔ "cinq,": the comma stays attached
        (6, 5),  # then ↔ puis
        (7, 6),
        (7, 7),
        (7, 8),  # twenty-one ↔ vingt et un
    ]


def test_and_connector_is_linked_and_comma_connector_has_no_word() -> None:
    rng = random.Random(4)
    first, second = date_long(rng), date_long(rng)
    e = sentence_from_phrases([first, second], [(" and ", " et ")])
    src, tgt = e.source.split(" "), e.target.split(" ")
    and_at, et_at = src.index("and"), tgt.index("et")
    assert (and_at, et_at) in e.gold.words
    e = sentence_from_phrases([first, second], [(", ", ", ")])
    assert len(e.source.split(" ")) == len(first.en.split(" ")) + len(second.en.split(" "))
    assert e.gold.phrases[1][0] == e.gold.phrases[0][1]


def test_gold_round_trip(tmp_path: Path) -> None:
    rng = random.Random(2)
    items = [random_example(rng, n).gold for n in (1, 2, 3)]
    items.append(GoldLinks("year", 1, [(0, 2, 0, 4)], []))
    write_gold(tmp_path / "x.gold.jsonl", items)
    assert read_gold(tmp_path / "x.gold.jsonl") == items


def test_lowercased_example_keeps_its_gold() -> None:
    e = sentence_from_phrases([date_long(random.Random(3))], [])
    low = e.lowercased()
    assert low.source == e.source.lower() != e.source
    assert low.gold == e.gold and low.target == e.target


def test_part_weights_shape_the_sentences() -> None:
    splits = generate_examples(2, 200, 10, 10, 0, part_weights=(1,))
    assert {e.gold.parts for split in splits.values() for e in split} == {1}
    splits = generate_examples(2, 300, 10, 10, 0, part_weights=(0, 0, 1))
    assert {e.gold.parts for e in splits["train"]} == {3}


def test_cli_writes_a_gold_line_per_pair(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    argv = ["--out", str(out), "--train", "40", "--dev", "5", "--test", "5", "--test-long", "2"]
    assert main([*argv, "--part-weights", "1,1"]) == 0
    for name in ("train", "dev", "test"):
        pairs, gold = read_tsv(out / f"{name}.tsv"), read_gold(out / f"{name}.gold.jsonl")
        assert len(pairs) == len(gold)
    train_gold = read_gold(out / "train.gold.jsonl")
    assert {g.parts for g in train_gold} <= {1, 2}
