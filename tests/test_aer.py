"""export/metrics/aer.py and export/metrics/symmetrize.py on hand-worked examples."""

from __future__ import annotations

import pytest

from export.metrics.aer import (
    AlignmentCounts,
    PharaohError,
    check_links,
    format_pharaoh,
    parse_pharaoh,
    score_corpus,
    score_sentence,
)
from export.metrics.symmetrize import attach_unaligned_targets, grow_diag_final_and, intersect


def test_parse_and_format_round_trip() -> None:
    assert parse_pharaoh("0-0 2-1 1-2") == {(0, 0), (2, 1), (1, 2)}
    assert parse_pharaoh("  ") == set()
    assert parse_pharaoh("3p4") == {(3, 4)}
    assert format_pharaoh({(2, 1), (0, 0), (1, 2), (0, 0)}) == "0-0 1-2 2-1"
    assert format_pharaoh([]) == ""
    line = "0-1 1-0 4-4 10-2"
    assert parse_pharaoh(format_pharaoh(parse_pharaoh(line))) == parse_pharaoh(line)


@pytest.mark.parametrize("bad", ["0-", "a-1", "0_1", "1-2-3", "-1-2"])
def test_parse_rejects_bad_links(bad: str) -> None:
    with pytest.raises(PharaohError, match="not a Pharaoh link"):
        parse_pharaoh(f"0-0 {bad}")


def test_check_links_names_the_link() -> None:
    check_links({(0, 0), (2, 1)}, n_src=3, n_tgt=2)
    with pytest.raises(PharaohError, match="link 3-0 lies outside the sentence's 3 source"):
        check_links({(0, 0), (3, 0)}, n_src=3, n_tgt=2)


def test_one_sentence_by_hand() -> None:
    # gold: 0-0 1-1 1-2 (3 links); predicted: 0-0 1-1 2-2 (3 links), 2 of them right
    counts = score_sentence({(0, 0), (1, 1), (2, 2)}, {(0, 0), (1, 1), (1, 2)})
    assert (counts.predicted, counts.gold, counts.hits) == (3, 3, 2)
    assert counts.aer == pytest.approx(1 - 4 / 6)
    assert counts.precision == pytest.approx(2 / 3)
    assert counts.recall == pytest.approx(2 / 3)


def test_perfect_and_disjoint() -> None:
    gold = {(0, 1), (1, 0)}
    assert score_sentence(set(gold), gold).aer == 0.0
    wrong = score_sentence({(0, 0), (1, 1)}, gold)
    assert wrong.aer == 1.0 and wrong.precision == 0.0 and wrong.recall == 0.0


def test_links_on_words_without_gold_are_not_scored() -> None:
    # target word 2 has no gold link: the predicted 1-2 is left out of |A|
    counts = score_sentence({(0, 0), (1, 2), (1, 1)}, {(0, 0), (0, 1)})
    assert (counts.predicted, counts.gold, counts.hits) == (2, 2, 1)
    assert counts.aer == pytest.approx(0.5)


def test_corpus_sums_counts_not_rates() -> None:
    # sentence 1: 1 of 1 right; sentence 2: 0 of 3 predicted right, 3 gold
    first = ({(0, 0)}, {(0, 0)})
    second = ({(0, 1), (1, 2), (2, 0)}, {(0, 0), (1, 1), (2, 2)})
    total = score_corpus([first[0], second[0]], [first[1], second[1]])
    assert (total.predicted, total.gold, total.hits, total.sentences) == (4, 4, 1, 2)
    assert total.aer == pytest.approx(1 - 2 / 8)  # not the mean of 0.0 and 1.0
    assert total.precision == pytest.approx(1 / 4) and total.recall == pytest.approx(1 / 4)


def test_corpus_skips_sentences_without_gold_and_checks_lengths() -> None:
    total = score_corpus([{(0, 0)}, {(5, 5)}], [{(0, 0)}, set()])
    assert (total.predicted, total.gold, total.hits, total.sentences) == (1, 1, 1, 1)
    with pytest.raises(PharaohError, match="2 predicted alignments for 1 gold"):
        score_corpus([set(), set()], [set()])


def test_add() -> None:
    total = AlignmentCounts()
    total.add(AlignmentCounts(predicted=2, gold=3, hits=1, sentences=1))
    total.add(AlignmentCounts(predicted=1, gold=1, hits=1, sentences=1))
    assert (total.predicted, total.gold, total.hits, total.sentences) == (3, 4, 2, 2)
    assert AlignmentCounts().aer == 0.0  # nothing to score


def test_grow_diag_final_and_by_hand() -> None:
    # forward (each target word one source word) and reverse (each source word one target word)
    forward = {(0, 0), (1, 1), (1, 2), (3, 3)}
    reverse = {(0, 0), (1, 1), (2, 2), (3, 4)}
    assert intersect(forward, reverse) == {(0, 0), (1, 1)}
    # grow-diag from 1-1: 1-2 (target 2 unaligned), 2-2 (diagonal, source 2 unaligned); from 2-2:
    # 3-3 (diagonal, source 3 unaligned); from 3-3: 3-4 (target 4 unaligned). Every union link.
    assert grow_diag_final_and(forward, reverse) == forward | reverse


def test_final_and_needs_both_words_unaligned() -> None:
    # 2-3 and 3-2 are far from 0-0: nothing grows; final-and adds each (both words unaligned)
    assert grow_diag_final_and({(0, 0), (2, 3)}, {(0, 0), (3, 2)}) == {(0, 0), (2, 3), (3, 2)}
    # 2-4 comes after 2-3 has aligned source word 2: left out
    assert grow_diag_final_and({(0, 0), (2, 3)}, {(0, 0), (2, 4)}) == {(0, 0), (2, 3)}
    # a neighbour of the intersection whose two words are both aligned already does not grow
    assert grow_diag_final_and({(0, 0), (1, 1), (0, 1)}, {(0, 0), (1, 1)}) == {(0, 0), (1, 1)}


def test_unaligned_target_words_join_their_nearest_aligned_neighbour() -> None:
    # "he will come soon" against one Greek verb (0) and an adverb (1): he (0) and will (1) join
    # come's verb; looking left first, will (1) would join nothing nearer than come (2) either
    links = {(0, 2), (1, 3)}
    assert attach_unaligned_targets(links, 4, "right") == {(0, 0), (0, 1), (0, 2), (1, 3)}
    assert attach_unaligned_targets(links, 4, "left") == {(0, 0), (0, 1), (0, 2), (1, 3)}
    # at equal distance the first side wins; a word between two links takes all of one side's
    links = {(0, 0), (1, 2), (2, 2)}
    assert attach_unaligned_targets(links, 3, "right") == links | {(1, 1), (2, 1)}
    assert attach_unaligned_targets(links, 3, "left") == links | {(0, 1)}
    # only the links given are neighbours: words attached in the pass do not attach others
    assert attach_unaligned_targets({(0, 3)}, 4, "right") == {(0, 0), (0, 1), (0, 2), (0, 3)}
    assert attach_unaligned_targets(set(), 3, "right") == set()  # nothing to join
    with pytest.raises(ValueError, match="'right' or 'left'"):
        attach_unaligned_targets(links, 3, "up")
