"""The decode's encoder rows kept for the link head (service/decode/engine/kept_rows.py): found by the ids
they read, by every request that sends the same text; bounded, the oldest going first; a segmented
sentence keeps nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.decode.engine.kept_rows import KeptRows
from service.decode.runtime.encoded import EncodedSentence


@dataclass
class Sentence:
    ids: list[int]
    segments: tuple[object, ...] = field(default_factory=tuple)


def rows(length: int, fill: float) -> EncodedSentence:
    values = np.full((length, 4), fill, np.float32)  # (S, D): 16 bytes a position
    return EncodedSentence(values, values[:, :1], np.zeros(2, np.float32))


def test_rows_are_found_by_the_ids_they_read_as_often_as_asked() -> None:
    kept = KeptRows()
    kept.keep(Sentence([1, 2]), rows(2, 1.0))
    kept.keep(Sentence([3]), rows(1, 3.0))
    got = kept.find([(1, 2), (9,)])
    assert list(got) == [(1, 2)] and np.all(got[(1, 2)] == 1.0) and got[(1, 2)].shape == (2, 4)
    assert list(kept.find([(1, 2)])) == [(1, 2)]  # a second request with the same text
    assert len(kept) == 2 and kept.nbytes == 3 * 16


def test_the_store_is_bounded_the_oldest_going_first() -> None:
    kept = KeptRows(max_bytes=3 * 16)
    for i in range(5):
        kept.keep(Sentence([i]), rows(1, float(i)))
    assert len(kept) == 3 and kept.nbytes == 48
    assert sorted(kept.find([(i,) for i in range(5)])) == [(2,), (3,), (4,)]
    kept.keep(Sentence([2]), rows(1, 2.0))  # kept again: the newest, counted once
    kept.keep(Sentence([7]), rows(1, 7.0))
    assert sorted(kept.find([(i,) for i in range(8)])) == [(2,), (4,), (7,)]
    assert kept.nbytes == 48


def test_a_segmented_sentence_keeps_nothing() -> None:
    kept = KeptRows()
    kept.keep(Sentence([1, 2], segments=(object(),)), rows(2, 1.0))
    assert len(kept) == 0


def test_an_encoder_that_keeps_what_it_makes() -> None:
    kept = KeptRows()

    def encode(sentences: Sequence[Sentence]) -> list[list[EncodedSentence]]:
        return [[rows(len(s.ids), float(s.ids[0]))] for s in sentences]

    out = kept.keeping(encode)([Sentence([4, 5]), Sentence([6])])
    assert len(out) == 2 and sorted(kept.find([(4, 5), (6,)])) == [(4, 5), (6,)]


def test_a_sentences_own_values_are_its_row_of_the_batch() -> None:
    """`EncodedSentence.own_values` (its row read in place on the CPU) is `values` (the batch's
    outputs copied, its row cut)."""
    from service.decode.engine.engine import Engine
    from service.decode.shared.config import RuntimeConfig
    from tests.conftest import DEFAULT_BUNDLE

    engine = Engine.load(DEFAULT_BUNDLE, RuntimeConfig(providers=("CPUExecutionProvider",)))
    texts = ["seven", "ninety-seven", "March 5, 2021", "twelve"]
    for (sentence,) in engine.encode([engine.prepare(t) for t in texts]):
        own = sentence.own_values()
        assert own.shape == (sentence.length, sentence.values.shape[1])
        np.testing.assert_array_equal(own, sentence.values)
