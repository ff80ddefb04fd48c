"""Word alignments name the answer's words: target word tokens == text.split(), whatever pieces the
beam emits (digits after letters without "▁", lone "▁", punctuation, <unk>, control ids) and
however a segmented answer joins its segments and separators."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.alignment import merge_subwords
from service.decode.text.preparation import Prepared
from service.decode.text.translation import TranslationHypothesis, make_alignment
from service.model.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "models" / "default"

ENGINE = Engine.load(DEFAULT)
_TARGET = ENGINE.tgt_tok
assert isinstance(_TARGET, Tokenizer)
TOK: Tokenizer = _TARGET
PIECES = [TOK.processor.IdToPiece(i) for i in range(TOK.vocab_size)]


def _ids(predicate: object) -> list[int]:
    return [i for i, piece in enumerate(PIECES) if predicate(piece)]  # type: ignore[operator]


# the kinds of piece that made words and text disagree, drawn more often than their share
DIGITS = _ids(lambda p: p.isdigit())
BARE = _ids(lambda p: p == "▁")
PUNCT = _ids(lambda p: len(p.strip("▁")) == 1 and not p.strip("▁").isalnum())
CONTINUATIONS = _ids(lambda p: not p.startswith("▁") and p.isalpha())
SPECIAL = [0, 1, 2, 3]  # pad, bos, eos, unk: a beam can emit any id
ANY = list(range(TOK.vocab_size))

piece_ids = st.one_of(
    st.sampled_from(DIGITS),
    st.sampled_from(BARE),
    st.sampled_from(PUNCT),
    st.sampled_from(CONTINUATIONS),
    st.sampled_from(SPECIAL),
    st.sampled_from(ANY),
)
sequences = st.lists(piece_ids, max_size=24)


def test_the_vocabulary_has_each_kind_of_piece() -> None:
    assert DIGITS and BARE and PUNCT and CONTINUATIONS


def word_tokens(ids: list[int]) -> tuple[list[str], np.ndarray]:
    matrix = np.full((len(ids), 2), 0.5, dtype=np.float32)  # (T, S)
    merged, _, words = merge_subwords(
        matrix, ["▁a", "▁b"], TOK.pieces(ids), None, TOK.surfaces(ids)
    )
    return words, merged


@settings(max_examples=400, deadline=None)
@given(sequences)
def test_word_tokens_are_the_decoded_texts_words(ids: list[int]) -> None:
    assert "".join(TOK.surfaces(ids)) == TOK.decode(ids)
    words, merged = word_tokens(ids)
    assert words == TOK.decode(ids).split()
    assert merged.shape == (len(words), 2)
    np.testing.assert_allclose(merged.sum(axis=1), 1.0, atol=1e-6)


def test_digits_after_letters_stay_in_the_word() -> None:
    ids = [TOK.processor.PieceToId(p) for p in ["▁e", "t", "5", "-", "sept"]]
    assert word_tokens(ids)[0] == TOK.decode(ids).split() == ["et5-sept"]


SEPARATORS = [(" and ", " et "), (", then ", ", puis "), ("  ", " "), (" , ", ",")]


def hypothesis_of(ids: list[int]) -> TranslationHypothesis:
    return TranslationHypothesis(
        text=TOK.decode(ids),
        tokens=TOK.pieces(ids),
        token_ids=ids,
        score=0.0,
        log_prob=0.0,
        alignment=None,
        finished=True,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(sequences, min_size=2, max_size=4),
    st.lists(st.sampled_from(SEPARATORS), min_size=3, max_size=3),
)
def test_a_joined_answers_word_tokens_are_its_texts_words(
    segments: list[list[int]], separators: list[tuple[str, str]]
) -> None:
    seps = [ENGINE.preparer.separator(src, tgt) for src, tgt in separators[: len(segments) - 1]]
    parts = [hypothesis_of(ids) for ids in segments]
    sentence = Prepared(text="", ids=[], pieces=["▁x"], separators=tuple(seps))
    text, tokens = parts[0].text, list(parts[0].tokens)
    for separator, part in zip(seps, parts[1:], strict=True):
        text += separator.target_text + part.text
        tokens += separator.target_pieces + part.tokens
    matrix = np.full((len(tokens), 1), 1.0, dtype=np.float32)  # (T, S)
    surfaces = ENGINE.results.joined_surfaces(parts, sentence)
    if tokens:  # (no piece at all: nothing can carry a whitespace-only text, and it has no words)
        assert "".join(surfaces) == text
    assert "".join(surfaces).split() == text.split()
    alignment = make_alignment(matrix, ["▁x"], tokens, "word", surfaces)
    assert alignment is not None
    assert alignment.target_tokens == text.split()


@pytest.mark.parametrize("beam", [4, 16])
def test_served_hypotheses_name_their_texts_words(beam: int) -> None:
    """The case found from outside: a segment whose first piece has no "▁" after " et "."""
    options = SearchOptions(beam_size=beam, n_best=beam)
    (translation,) = ENGINE.translate(["November 11, 1918 and ninety-seven"], options, "word")
    for h in translation.hypotheses:
        assert h.alignment is not None
        assert h.alignment.target_tokens == h.text.split(), h.tokens
