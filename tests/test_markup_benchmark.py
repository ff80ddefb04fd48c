"""benchmarks/alignment/markup.py's own pieces, without a model: the spans drawn, the tagged sources and
answers read back, the naive projection, the tagged verses of the translate part and their checks."""

from __future__ import annotations

import random

from benchmarks.alignment.markup import (
    Score,
    Span,
    check_answer,
    first_to_last,
    sample_spans,
    tag_verse,
    tag_words,
    tagged_source,
    tags_of,
)
from service.model import markup


def test_spans_are_1_to_3_words_with_contiguous_gold_and_repeat_with_the_seed() -> None:
    pairs = [("a b c d", "w x y z"), ("e f", "u v")]
    golds = [{(0, 0), (1, 2), (2, 1), (3, 3)}, {(0, 1)}]
    draws = [sample_spans(pairs, golds, seed) for seed in (1, 1, 2)]
    assert draws[0] == draws[1]
    for span in draws[0] + draws[2]:
        assert 0 <= span.last - span.first <= 2
        gold = sorted({t for s, t in golds[span.verse] if span.first <= s <= span.last})
        assert (span.lo, span.hi) == (gold[0], gold[-1]) and len(gold) == span.hi - span.lo + 1
    assert all(s.verse == 0 or (s.first, s.last) == (0, 0) for s in draws[0])  # "f" has no gold


def test_a_tagged_source_and_answer_read_back_to_the_span() -> None:
    span = Span(verse=0, first=1, last=2, lo=1, hi=1)
    source = tagged_source("a b&c d e", span)
    assert source == "a <b>b&amp;c d</b> e"
    assert markup.parse(source, "xml").plain == "a b&c d e"
    assert tag_words("x <b>y z</b> w") == (1, 2)
    assert tag_words("x <b></b>y") is None
    assert first_to_last({(1, 3), (2, 0), (4, 4)}, span) == (0, 3)
    score = Score()
    score.add((1, 1), span)
    score.add((0, 1), span)
    score.add(None, span)
    assert (score.exact_rate, round(score.f1_rate, 4)) == (1 / 3, round((1 + 2 / 3) / 3, 4))


def test_tagged_verses_read_and_their_answers_are_checked() -> None:
    rng = random.Random(3)
    for _ in range(50):
        verse = tag_verse("ἐν ἀρχῇ ἦν ὁ λόγος", rng)
        marked = markup.parse(verse, "xml")  # reads, placeholders taken out
        assert marked.plain.split() == ["ἐν", "ἀρχῇ", "ἦν", "ὁ", "λόγος"]
        found = tags_of(verse)
        closing = sum(n for tag, n in found.items() if tag.startswith("</"))
        assert 1 <= sum(found.values()) - closing <= 3  # 1-3 tags, a pair counted once
        assert closing >= 1  # the first is always a pair
    source = "<b>ἐν ἀρχῇ</b> {0} ἦν"
    assert check_answer(source, "<b>In the beginning</b> {0} was", "In the beginning was") == (
        True,
        True,
        True,
    )
    assert check_answer(source, "<b>In the beginning</b> was", "In the beginning was")[1] is False
    assert check_answer(source, "<b>In the beginning was", "In the beginning was")[0] is False
