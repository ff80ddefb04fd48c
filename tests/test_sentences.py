"""A document cut into sentences (service/model/sentences.py): the spans' contract on any string, each
mode, the languages, and the library's answer mapped back onto the original text."""

from __future__ import annotations

import random
import re
import sys
import types
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.model import sentences
from service.model.sentences import (
    SPLIT_MODES,
    locate,
    rule_starts,
    split_sentences,
    splitter_of,
)

LINE_BREAKS = ["\r\n", *"\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"]  # str.splitlines' breaks


def assert_valid(text: str, spans: list[tuple[int, int]]) -> None:
    """The contract: ordered, non-overlapping, non-empty spans without outer whitespace; only
    whitespace outside them; so the spans and the whitespace between them rebuild the text."""
    at = 0
    rebuilt = []
    for start, end in spans:
        assert at <= start < end <= len(text), (spans, len(text))
        piece = text[start:end]
        assert not piece[0].isspace() and not piece[-1].isspace(), piece
        assert text[at:start].isspace() or at == start, text[at:start]
        rebuilt += [text[at:start], piece]
        at = end
    assert text[at:].isspace() or at == len(text)
    assert "".join(rebuilt) + text[at:] == text


def sentences_of(text: str, mode: str, language: str = "en") -> list[str]:
    spans = split_sentences(text, mode, language)
    assert_valid(text, spans)
    return [text[s:e] for s, e in spans]


# --- the modes -------------------------------------------------------------------------------


def test_off_is_the_stripped_text_whole() -> None:
    text = "  One. Two.\nThree  "
    assert split_sentences(text, "off", "en") == [(2, 17)]
    assert split_sentences(" \n\t ", "off") == []
    assert split_sentences("", "off") == []


@pytest.mark.parametrize("mode", ["on", "nonewlines"])
def test_blank_text_has_no_sentence(mode: str) -> None:
    assert split_sentences("", mode, "en") == []
    assert split_sentences(" \n\r\n\u2029\t", mode, "en") == []


def test_on_cuts_at_punctuation_and_at_every_line_break() -> None:
    text = "Hello there. How are you?\nfine thanks\r\nNext line\u2028and more"
    assert sentences_of(text, "on") == [
        "Hello there.",
        "How are you?",
        "fine thanks",
        "Next line",
        "and more",
    ]


@pytest.mark.parametrize("brk", LINE_BREAKS)
def test_on_cuts_at_each_kind_of_line_break(brk: str) -> None:
    assert sentences_of(f"a sentence without end{brk}goes on here", "on") == [
        "a sentence without end",
        "goes on here",
    ]


def test_nonewlines_keeps_a_wrapped_sentence_whole() -> None:
    text = "The quick brown fox\njumps over the\r\nlazy dog. Then it\nsleeps."
    assert sentences_of(text, "nonewlines") == [
        "The quick brown fox\njumps over the\r\nlazy dog.",
        "Then it\nsleeps.",
    ]


def test_nonewlines_cuts_where_a_line_ends_a_sentence() -> None:
    assert sentences_of("First line ends here.\nSecond starts.", "nonewlines") == [
        "First line ends here.",
        "Second starts.",
    ]


def test_an_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown split mode"):
        split_sentences("Text.", "sometimes", "en")
    assert SPLIT_MODES == ("off", "on", "nonewlines")


# --- languages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ("en", "sentencex:en"),
        ("eng", "sentencex:en"),
        ("EN-us", "sentencex:en"),
        ("fr", "sentencex:fr"),
        ("fra", "sentencex:fr"),
        ("fre", "sentencex:fr"),
        ("de", "sentencex:de"),
        ("deu", "sentencex:de"),
        ("es", "sentencex:es"),
        ("spa", "sentencex:es"),
        ("pt_BR", "sentencex:pt"),
        ("el", "sentencex:el"),
        ("ell", "sentencex:el"),
        ("grc", "sentencex:el"),
        ("cs", "sentencex:cs"),
        ("sv", "rule"),
        ("tlh", "rule"),
        ("", "rule"),
        ("  ", "rule"),
    ],
)
def test_splitter_of_names_the_library_or_the_rule(language: str, expected: str) -> None:
    assert splitter_of(language) == expected


def test_ancient_greek_question_mark_cuts_and_ano_teleia_does_not() -> None:
    text = "ἀπεκρίθη δὲ ὁ Ἰησοῦς· τίς ἐστιν οὗτος; καὶ εἶπεν αὐτοῖς. ἐγώ εἰμι."
    expected = ["ἀπεκρίθη δὲ ὁ Ἰησοῦς· τίς ἐστιν οὗτος;", "καὶ εἶπεν αὐτοῖς.", "ἐγώ εἰμι."]
    assert sentences_of(text, "nonewlines", "grc") == expected
    # the plain rule says the same (it answers for Greek where the library would fail)
    assert [text[s:e] for s, e in sentences._stripped(text, rule_starts(text, "grc"))] == expected


def test_greek_question_mark_u037e_is_a_question_mark() -> None:
    assert sentences_of("τίς ἐστιν οὗτος\u037e ἐγώ εἰμι.", "nonewlines", "grc") == [
        "τίς ἐστιν οὗτος\u037e",
        "ἐγώ εἰμι.",
    ]


@pytest.mark.parametrize("language", ["en", "xx", ""])
def test_abbreviations_and_initials_do_not_cut(language: str) -> None:
    text = "Dr. Smith met Mr. J. Brown at 5 p.m. today. They talked."
    assert sentences_of(text, "nonewlines", language)[-1] == "They talked."
    assert sentences_of(text, "nonewlines", language)[0].startswith("Dr. Smith met Mr. J. Brown")


def test_french_spacing_and_guillemets() -> None:
    text = "M. Dupont est arrivé. « Qui est là ? » demanda-t-il. Personne ne répondit !"
    assert sentences_of(text, "nonewlines", "fr") == [
        "M. Dupont est arrivé.",
        "« Qui est là ? » demanda-t-il.",
        "Personne ne répondit !",
    ]


def test_an_unknown_language_gets_the_plain_rule() -> None:
    text = "Tämä on lause. Toinen lause alkaa. ja tämä ei ala isolla."
    assert sentences_of(text, "nonewlines", "xx") == [
        "Tämä on lause.",
        "Toinen lause alkaa. ja tämä ei ala isolla.",
    ]


def test_cjk_full_stops_need_no_space() -> None:
    assert sentences_of("今天很好。明天也好！你呢？", "nonewlines", "zh") == [
        "今天很好。",
        "明天也好！",
        "你呢？",
    ]


# --- quotations ------------------------------------------------------------------------------


def test_a_long_quotation_is_cut_into_its_sentences() -> None:
    text = (
        "He said, “Do not be afraid. She will give birth to a Son. You are to name Him Jesus.” "
        "Then Joseph woke up."
    )
    assert sentences_of(text, "nonewlines", "en") == [
        "He said, “Do not be afraid.",
        "She will give birth to a Son.",
        "You are to name Him Jesus.”",
        "Then Joseph woke up.",
    ]


def test_a_quote_left_open_does_not_swallow_the_rest() -> None:
    text = '"Arafat was supple enough. The road remained rocky. The talks stopped. It ended.'
    assert len(sentences_of(text, "nonewlines", "en")) == 4


def test_a_dialogue_tag_stays_with_its_quotation() -> None:
    text = "“Who are you?” he asked. “Get up!” she said. “I am here.” She left."
    assert sentences_of(text, "nonewlines", "en") == [
        "“Who are you?” he asked.",
        "“Get up!” she said.",
        "“I am here.”",
        "She left.",
    ]


def test_quotes_go_with_their_own_sentence() -> None:
    text = 'He left." "Where?" she asked. »Nirgends.« Er ging. „Gut.“ Dann.'
    assert sentences_of(text, "nonewlines", "en")[:2] == ['He left."', '"Where?" she asked.']
    assert sentences_of("Er ging. »Nirgends.« Er ging. „Gut.“ Dann ja.", "nonewlines", "de") == [
        "Er ging.",
        "»Nirgends.«",
        "Er ging.",
        "„Gut.“",
        "Dann ja.",
    ]


# --- the library's answer on the original text ---------------------------------------------


def test_locate_finds_pieces_whose_whitespace_changed() -> None:
    text = "One  sentence\there.\n\nTwo\u00a0here. Three."
    pieces = ["One sentence here.", "Two here.", "Three."]
    assert locate(text, pieces) == [0, 21, 31]


def test_locate_skips_a_rewritten_piece_and_goes_on() -> None:
    text = "Alpha one. Beta two. Gamma three."
    assert locate(text, ["Alpha one.", "BETA TWO.", "Gamma three."]) == [0, 21]
    assert locate(text, ["Alpha one.", "nowhere", "Beta two.", ""]) == [0, 11]
    assert locate(text, ["Alpha one.", "two.", "Gamma three."]) == [0, 16, 21]


def fake_sentencex(monkeypatch: pytest.MonkeyPatch, segment: object) -> None:
    module = types.ModuleType("sentencex")
    module.segment = segment  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentencex", module)


def test_a_library_that_normalizes_whitespace_still_gives_exact_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def squeeze(language: str, text: str) -> Iterator[str]:
        yield from (" ".join(s.split()) + " " for s in re.split(r"(?<=\.) ", text) if s.strip())

    fake_sentencex(monkeypatch, squeeze)
    text = "  First   one\x00 here. Second\u3000one. Third  "
    spans = split_sentences(text, "nonewlines", "en")
    assert_valid(text, spans)
    assert [text[s:e] for s, e in spans] == ["First   one\x00 here.", "Second\u3000one.", "Third"]


@pytest.mark.parametrize(
    "answer",
    [
        lambda language, text: ["garbage", "", "   ", "\x00"],
        lambda language, text: [text[::-1]],
        lambda language, text: [text, text, text],
        lambda language, text: [c for c in text],
    ],
)
def test_any_library_answer_gives_valid_spans(
    monkeypatch: pytest.MonkeyPatch, answer: object
) -> None:
    fake_sentencex(monkeypatch, answer)
    for text in ["One. Two. Three.", "  x ", "a.b. c!\n d?", ""]:
        assert_valid(text, split_sentences(text, "on", "en"))
        assert_valid(text, split_sentences(text, "nonewlines", "en"))


def test_a_library_error_falls_back_to_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(language: str, text: str) -> list[str]:
        raise RuntimeError("library bug")

    fake_sentencex(monkeypatch, broken)
    assert sentences_of("One here. Two here.", "nonewlines", "en") == ["One here.", "Two here."]


# --- robustness ------------------------------------------------------------------------------

ODD_TEXTS = [
    "",
    ".",
    "...!!!???",
    ". . . ; ; · · ·",
    "no punctuation at all and no capital either",
    "\x00\x01\x02 \x7f\x9f",
    "🙂. 🙃! 👍🏽? 🇫🇷.",
    "\ud800 lone. \udfff surrogates.",
    "\u200b\u200bzero width. spaces\u200b.",
    "a\u0301\u0302. B\u0308!",
    "« » “ ” „ \" ' ‘ ’",
    "\r\n\r\n.\r.\n.\u2028.",
    "x" * 10_000,
    "Word. " * 2_000,
    "A.B.C.D.E. F.G.H.",
    "1. 2. 3. 4.",
    "(((Hello.))) [World!] {Yes?}",
    "Ἀβραὰμ· ἐγέννησεν; τὸν. Ἰσαάκ",
    "مرحبا. كيف حالك؟ أنا بخير.",
    "שלום. מה שלומך?",
    "नमस्ते। आप कैसे हैं?",
]


@pytest.mark.parametrize("text", ODD_TEXTS, ids=range(len(ODD_TEXTS)))
@pytest.mark.parametrize("mode", SPLIT_MODES)
@pytest.mark.parametrize("language", ["en", "grc", "fr", "xx", ""])
def test_odd_texts_give_valid_spans(text: str, mode: str, language: str) -> None:
    assert_valid(text, split_sentences(text, mode, language))


def test_a_long_document_is_split() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(500))
    spans = split_sentences(text, "nonewlines", "en")
    assert_valid(text, spans)
    assert len(spans) == 500


MIXED = st.lists(
    st.sampled_from(
        [
            *"abcXYZ019 .,;:!?…·;\"'“”«»()-\t\n\r\u2028\x85\x00\u00a0\u3000éΩω。🙂\ud800",
            *[
                "\r\n",
                "Dr. ",
                "M. ",
                "He said ",
                "“Who?” he asked. ",
                "The end. ",
                "τίς; ",
                "ἐγώ· ",
            ],
        ]
    ),
    max_size=120,
).map("".join)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(text=MIXED, mode=st.sampled_from(SPLIT_MODES), language=st.sampled_from(["en", "grc", "zz"]))
def test_fuzz_any_mixed_text_gives_valid_spans(text: str, mode: str, language: str) -> None:
    spans = split_sentences(text, mode, language)
    assert_valid(text, spans)
    if mode == "off":
        assert len(spans) == (0 if text.isspace() or not text else 1)
    if mode == "on":  # no span crosses a line break
        assert not any(sentences.LINE_BREAK.search(text, s, e) for s, e in spans)


def test_random_documents_of_real_sentences_rebuild_exactly() -> None:
    rng = random.Random(66)
    pool = [
        "The quick brown fox jumps.",
        "Is it?",
        "“Yes,” he said.",
        "Dr. No arrived at 5 p.m.",
        "τίς ἐστιν οὗτος;",
        "Il est là !",
        "Wait…",
        "no end here",
    ]
    for _ in range(200):
        parts = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        seps = [rng.choice([" ", "  ", "\n", "\r\n", "\t", " \n "]) for _ in parts]
        text = "".join(p + s for p, s in zip(parts, seps, strict=True))
        for mode in SPLIT_MODES:
            assert_valid(text, split_sentences(text, mode, rng.choice(["en", "fr", "grc", "xx"])))
