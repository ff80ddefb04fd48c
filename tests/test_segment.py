"""Segmentation of long inputs (service/model/segment.py) and its join inside the engine.

The numbers model's boundary rules (configs/numbers-segmentation.json) are checked against the corpus
generator itself: on thousands of its sentences the segmenter must cut exactly between the phrases it
drew (never inside one). The engine tests decode with a copy of models/default whose manifest gains
the segmentation section, and compare the joined answer with each segment decoded on its own.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.data import corpus
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.alignment import merge_subwords, word_index
from service.decode.shared.config import EngineLimits
from service.decode.shared.errors import InvalidInput
from service.decode.text.preparation import DecodeRequest
from service.decode.text.translation import Translation
from service.model.bundle import MANIFEST, BundleError, load_bundle
from service.model.segment import (
    Segmentation,
    SegmentationError,
    block_diagonal,
    geometric_mean_probability,
    separator_tokens,
)
from tests.conftest import DEFAULT_BUNDLE, REPO, TinyModel

RULES_FILE = REPO / "configs" / "numbers-segmentation.json"


def numbers_rules() -> Segmentation:
    return Segmentation.from_dict(json.loads(RULES_FILE.read_text(encoding="utf-8")))


# --- the rules against the generator ----------------------------------------------------------


def value_families() -> list[tuple[str, Callable[[random.Random], str]]]:
    """Every value family the generator draws from (export/data/families.py's FAMILIES): (name, a draw
    of the family's English phrase)."""
    return [(name, _english_of(entry[0])) for name, entry in corpus.FAMILIES.items()]


def _english_of(draw: Callable[[random.Random], Any]) -> Callable[[random.Random], str]:
    return lambda rng: english(draw(rng))


def english(drawn: Any) -> str:
    """The English side of a drawn phrase: a Phrase's `en`, or a pair's first item."""
    return str(getattr(drawn, "en", None) or drawn[0])


def built_sentence(rng: random.Random, phrases: list[str]) -> tuple[str, list[int]]:
    """The phrases joined by the generator's own connector choice; returns the text and the start of
    every connector (the true cut positions)."""
    text, cuts = phrases[0], []
    for phrase in phrases[1:]:
        joint, _ = corpus.pick_connector(rng, text, phrase)
        cuts.append(len(text))
        text += joint + phrase
    return text, cuts


def recorded_sentence(
    monkeypatch: pytest.MonkeyPatch, rng: random.Random, n: int
) -> tuple[str, list[str]]:
    """corpus.random_sentence itself, with the phrases it drew recorded on the way (through
    `random_phrase`)."""
    name = "random_phrase"
    drawn: list[str] = []
    original = getattr(corpus, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        phrase = original(*args, **kwargs)
        drawn.append(english(phrase))
        return phrase

    monkeypatch.setattr(corpus, name, recording)
    try:
        source, _ = corpus.random_sentence(rng, n)
    finally:
        monkeypatch.setattr(corpus, name, original)
    return source, drawn


def cut_positions(split_text: str, rules: Segmentation) -> list[int]:
    return [start for start, _ in rules.split(split_text).spans]


def test_the_numbers_rules_recover_the_phrases_of_every_generated_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Precision must be 100% (a cut inside a phrase breaks the translation); recall is reported."""
    rules, rng = numbers_rules(), random.Random(14)
    found = right = wanted = 0
    for i in range(3000):
        n = rng.randint(1, 10)
        source, phrases = recorded_sentence(monkeypatch, rng, n)
        assert len(phrases) == n, "random_sentence no longer draws through random_phrase"
        source = source.lower()  # the numbers model lower-cases its input first
        want = [p.lower() for p in phrases]
        segments = rules.split(source).segments
        # every segment the rules make is a run of whole generator phrases: no cut inside a phrase
        ends, pos = set(), 0
        for phrase in want:
            pos = source.index(phrase, pos) + len(phrase)
            ends.add(pos)
        pos = 0
        for segment in segments[:-1]:
            pos = source.index(segment, pos) + len(segment)
            assert pos in ends, f"cut inside a phrase of {source!r}: {segments}"
        found += len(segments) - 1
        right += len(segments) - 1
        wanted += n - 1
        if i < 1000:
            assert segments == want, source
    assert right == found  # precision 100%
    assert found == wanted, f"recall {found / wanted:.4f}"


@pytest.mark.parametrize(("name", "draw"), value_families(), ids=[n for n, _ in value_families()])
def test_no_family_is_cut_inside_and_every_connector_is_found(
    name: str, draw: Callable[[random.Random], str]
) -> None:
    """Each value family, alone (never cut) and next to every family with the connectors the
    generator allows there."""
    rules, rng = numbers_rules(), random.Random(zlib.crc32(name.encode()))
    draws = [d for _, d in value_families()]
    for _ in range(300):
        phrase = draw(rng).lower()
        assert rules.split(phrase).segments == [phrase]
        other = rng.choice(draws)(rng).lower()
        for phrases in ([phrase, other], [other, phrase]):
            text, cuts = built_sentence(rng, phrases)
            assert rules.split(text).segments == phrases, text
            assert cut_positions(text, rules) == cuts


def test_cases_the_libraries_write_inside_one_phrase() -> None:
    rules = numbers_rules()
    for phrase in (
        "one thousand and one",
        "one thousand, two hundred and five",
        "one million and one",
        "one thousand and first",
        "two hundred and five thousand, three hundred and twelfth",
        "march 5, 2021",
        "friday, march 5, 2021",
        "two thousand and five",
        "nine hundred and ninety-nine point five",
    ):
        assert rules.split(phrase).segments == [phrase]
    split = rules.split("march 5, 2021, then one thousand and twenty and 3:05 pm, $3.50")
    assert split.segments == ["march 5, 2021", "one thousand and twenty", "3:05 pm", "$3.50"]
    assert split.separators == [(", then ", ", puis "), (" and ", " et "), (", ", ", ")]
    # after a scale word, a connector before a phrase that is no number word is a boundary
    assert rules.split("one hundred and march 5, 2021").segments == ["one hundred", "march 5, 2021"]
    assert rules.split("one thousand, then five").segments == ["one thousand", "five"]


# --- the segmenter's mechanics ----------------------------------------------------------------


def test_earlier_boundaries_win_overlaps_and_empty_segments_are_not_made() -> None:
    rules = Segmentation.from_dict(
        {
            "boundaries": [
                {"pattern": ", then ", "target": ", puis "},
                {"pattern": ", ", "target": ", "},
            ]
        }
    )
    assert rules.split("a, then b, c").separators == [(", then ", ", puis "), (", ", ", ")]
    assert rules.split(", then a").segments == [", then a"]  # nothing before it: no cut
    assert rules.split("a, then ").segments == ["a, then"]
    assert rules.split("a, , b").segments == ["a", ", b"]


def test_keep_patterns_protect_what_they_match() -> None:
    rules = Segmentation.from_dict(
        {"boundaries": [{"pattern": " and ", "target": " et "}], "keep": ["x and y"]}
    )
    assert rules.split("x and y and z").segments == ["x and y", "z"]
    assert Segmentation.from_dict(rules.to_dict()) == rules


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ([], "must be an object"),
        ({}, "non-empty list"),
        ({"boundaries": [{"pattern": "a"}]}, "'pattern' and 'target'"),
        ({"boundaries": [{"pattern": "(", "target": ""}]}, "no regex"),
        ({"boundaries": [{"pattern": "", "target": ""}]}, "non-empty string"),
        ({"boundaries": [{"pattern": "a", "target": 1}]}, "target must be a string"),
        ({"boundaries": [{"pattern": "a", "target": ""}], "keep": "x"}, "list of patterns"),
        ({"boundaries": [{"pattern": "a", "target": ""}], "cut": []}, "unknown segmentation keys"),
    ],
)
def test_a_malformed_section_is_refused_with_what_is_wrong(section: Any, message: str) -> None:
    with pytest.raises(SegmentationError, match=message):
        Segmentation.from_dict(section)


def test_block_diagonal_places_each_block_and_spreads_separators_uniformly() -> None:
    a = np.array([[0.25, 0.75], [1.0, 0.0]], np.float32)  # (2, 2)
    b = np.array([[0.5, 0.5, 0.0]], np.float32)  # (1, 3)
    out = block_diagonal([a, b], [(2, 2)])  # (2 + 2 + 1, 2 + 2 + 3)
    assert out.shape == (5, 7)
    np.testing.assert_array_equal(out[:2, :2], a)
    np.testing.assert_array_equal(out[2:4, 2:4], np.full((2, 2), 0.5))
    np.testing.assert_array_equal(out[4:, 4:], b)
    mask = np.zeros_like(out, bool)
    mask[:2, :2] = mask[2:4, 2:4] = mask[4:, 4:] = True
    assert not out[~mask].any()  # nothing off the blocks
    np.testing.assert_allclose(out.sum(axis=1), 1.0)
    # a separator without source pieces points at the last column before it
    lone = block_diagonal([a, b], [(1, 0)])
    np.testing.assert_array_equal(lone[2], [0, 1, 0, 0, 0])


def test_separator_tokens_continue_the_previous_word_unless_they_begin_with_a_space() -> None:
    assert separator_tokens([5, 6], ["\u2581,", "\u2581then"], ", then ") == (
        [5, 6],
        [",", "\u2581then"],
    )
    assert separator_tokens([4, 7], ["\u2581", ","], ", ") == ([7], [","])
    assert separator_tokens([8], ["\u2581and"], " and ") == ([8], ["\u2581and"])
    assert separator_tokens([], [], ", ") == ([], [])


def test_geometric_mean_probability_counts_the_end_of_sentence_when_finished() -> None:
    assert geometric_mean_probability(math.log(0.5) * 4, 3, True) == pytest.approx(0.5)
    assert geometric_mean_probability(math.log(0.5) * 3, 3, False) == pytest.approx(0.5)
    assert geometric_mean_probability(0.0, 0, False) == 0.0


# --- the bundle and the engine ----------------------------------------------------------------


def with_manifest(tmp: Path, **sections: Any) -> Path:
    """A copy of models/default with these manifest sections, a section given as None left out
    (the manifest is not in "files": no checksum changes)."""
    out = tmp / "bundle"
    shutil.copytree(DEFAULT_BUNDLE, out)
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    manifest.update(sections)
    for name in [name for name, value in sections.items() if value is None]:
        del manifest[name]
    (out / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    rules = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    return Engine.load(with_manifest(tmp_path_factory.mktemp("seg"), segmentation=rules))


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The default model without its segmentation and confidence sections."""
    bundle = with_manifest(tmp_path_factory.mktemp("whole"), segmentation=None, confidence=None)
    return Engine.load(bundle)


# lower case: the default model's input rule lower-cases, and the texts below are compared with
# what the engine prepared
LONG = "march 5, 2021 and forty-two, then $3.50, 12.5 and one thousand, two hundred and five"
SEGMENTS = ["march 5, 2021", "forty-two", "$3.50", "12.5", "one thousand, two hundred and five"]


def test_a_bundle_refuses_a_bad_segmentation_or_confidence_section(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="bad segmentation"):
        load_bundle(with_manifest(tmp_path / "a", segmentation={"boundaries": []}))
    with pytest.raises(BundleError, match=r"confidence\.threshold"):
        load_bundle(with_manifest(tmp_path / "b", confidence={"threshold": 2}))
    bundle = load_bundle(
        with_manifest(tmp_path / "c", confidence={"threshold": 0.9}, segmentation=None)
    )
    assert bundle.confidence_threshold == 0.9 and bundle.segmentation is None


def test_without_segmentation_an_input_is_one_sentence(whole: Engine) -> None:
    prepared = whole.prepare(LONG)
    assert prepared.segments == () and prepared.parts == (prepared,)


def test_prepare_cuts_at_the_boundaries_and_reports_every_source_piece(segmented: Engine) -> None:
    prepared = segmented.prepare(LONG)
    assert [s.text for s in prepared.segments] == SEGMENTS
    assert prepared.ids == [i for s in prepared.segments for i in s.ids]
    words = prepared.pieces
    # the source pieces merge into the text's whitespace words ("5," stays one word)
    index = word_index(words)
    assert int(index[-1]) + 1 == len(LONG.split(" "))


def test_the_limit_counts_the_whole_input(tmp_path: Path) -> None:
    rules = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    bundle = with_manifest(tmp_path, segmentation=rules)
    engine = Engine.load(bundle, limits=EngineLimits(max_source_tokens=20))
    assert len(engine.prepare("forty-two and five").segments) == 2
    with pytest.raises(InvalidInput, match="over the limit of 20"):
        engine.prepare(LONG)  # each segment is short; the input is not


@pytest.mark.parametrize("alignment", ["subword", "word"])
def test_a_segmented_input_joins_its_segments_own_translations(
    segmented: Engine, whole: Engine, alignment: Any
) -> None:
    options = SearchOptions(beam_size=4, n_best=3)
    (joined,) = segmented.translate([LONG], options, alignment)
    parts = whole.translate(SEGMENTS, options, "subword")
    prepared = segmented.prepare(LONG)
    assert joined.source_tokens == prepared.pieces
    for rank, h in enumerate(joined.hypotheses):
        mine = [p.hypotheses[min(rank, len(p.hypotheses) - 1)] for p in parts]
        targets = [s.target_text for s in prepared.separators]
        text = mine[0].text + "".join(t + m.text for t, m in zip(targets, mine[1:], strict=True))
        assert h.text == text
        assert h.log_prob == pytest.approx(sum(m.log_prob for m in mine), abs=1e-5)
        assert h.score == pytest.approx(sum(m.score for m in mine), abs=1e-5)
        assert h.finished == all(m.finished for m in mine)
        scored = sum(len(m.token_ids) + m.finished for m in mine)
        assert h.confidence == pytest.approx(math.exp(h.log_prob / scored))
        assert h.segment_confidences == pytest.approx([m.confidence for m in mine])
        sep_ids = [s.target_ids for s in prepared.separators]
        ids = mine[0].token_ids + [
            i for s, m in zip(sep_ids, mine[1:], strict=True) for i in s + m.token_ids
        ]
        assert h.token_ids == ids
        assert len(h.tokens) == len(ids)
        # the alignment: each segment's own matrix on the diagonal, the separators uniform
        assert h.alignment is not None
        blocks = [m.alignment.matrix for m in mine if m.alignment is not None]
        shapes = [(len(s.target_pieces), len(s.source_pieces)) for s in prepared.separators]
        expected = block_diagonal(blocks, shapes)
        if alignment == "word":
            expected, _, _ = merge_subwords(expected, prepared.pieces, h.tokens)
            assert h.alignment.source_tokens == LONG.split(" ")
            assert h.alignment.target_tokens == h.text.split(" ")
        np.testing.assert_allclose(h.alignment.matrix, expected, atol=1e-6)
        np.testing.assert_allclose(h.alignment.matrix.sum(axis=1), 1.0, atol=1e-5)


def test_segmented_and_whole_sentences_share_a_running_batch(segmented: Engine) -> None:
    """A segmented sentence joins mid-decode beside plain ones, and leaves when its last segment
    does; another is removed mid-decode with none of its segments left behind."""
    options = SearchOptions(beam_size=3)
    alone = {t: segmented.translate([t], options, "subword")[0] for t in (LONG, "ninety-seven")}
    batch = segmented.new_batch(3)
    batch.add([DecodeRequest("short", segmented.prepare("ninety-seven"), options)])
    batch.add([DecodeRequest("gone", segmented.prepare(LONG), options)])
    results: dict[str, Translation] = dict(batch.step())
    assert len(batch) == 1 + len(SEGMENTS)  # rows: one per segment
    batch.add([DecodeRequest("long", segmented.prepare(LONG), options)])
    assert batch.remove(["gone"]) == ["gone"]
    while len(batch):
        results.update(batch.step())
    assert set(results) == {"short", "long"}
    for key, text in (("short", "ninety-seven"), ("long", LONG)):
        got, want = results[key].hypotheses[0], alone[text].hypotheses[0]
        assert got.text == want.text and got.token_ids == want.token_ids
        assert got.alignment is not None and want.alignment is not None
        np.testing.assert_allclose(got.alignment.matrix, want.alignment.matrix, atol=1e-5)


def test_confidence_is_the_geometric_mean_token_probability(whole: Engine) -> None:
    (t,) = whole.translate(["ninety-seven"], SearchOptions(beam_size=4, n_best=4), "none")
    for h in t.hypotheses:
        n = len(h.token_ids) + (1 if h.finished else 0)
        assert h.confidence == pytest.approx(math.exp(h.log_prob / n))
        assert 0 <= h.confidence <= 1 and not h.low_confidence


def test_the_threshold_marks_low_confidence_server_over_manifest(tmp_path: Path) -> None:
    bundle = with_manifest(tmp_path, confidence={"threshold": 0.999999})
    texts = ["ninety-seven", "the cat sat on the mat"]
    options = SearchOptions(beam_size=2, n_best=2)
    manifest_default = Engine.load(bundle)
    assert manifest_default.min_confidence == 0.999999
    for t in manifest_default.translate(texts, options, "none"):
        for h in t.hypotheses:
            assert h.low_confidence == (h.confidence < 0.999999)
    assert any(
        h.low_confidence for t in manifest_default.translate(texts, options) for h in t.hypotheses
    )
    off = Engine.load(bundle, limits=EngineLimits(min_confidence=0))
    assert off.min_confidence == 0
    assert not any(h.low_confidence for t in off.translate(texts, options) for h in t.hypotheses)
    with pytest.raises(ValueError, match="min_confidence"):
        EngineLimits(min_confidence=1.5)


def test_export_writes_the_segmentation_and_confidence_sections(
    tiny: TinyModel, tmp_path: Path
) -> None:
    from export.onnx import to_onnx

    out = tmp_path / "bundle"
    argv = [
        "--checkpoint",
        str(tiny.checkpoint),
        "--tokenizers",
        str(tiny.bundle),
        "--out",
        str(out),
    ]
    assert to_onnx.main([*argv, "--segmentation", str(RULES_FILE), "--min-confidence", "0.8"]) == 0
    bundle = load_bundle(out)
    assert bundle.segmentation == numbers_rules()
    assert bundle.confidence_threshold == 0.8
    bad = tmp_path / "bad.json"
    bad.write_text('{"boundaries": [{"pattern": "(", "target": ""}]}', encoding="utf-8")
    with pytest.raises(SegmentationError, match="no regex"):
        to_onnx.main([*argv, "--segmentation", str(bad)])


def test_odd_inputs_are_cut_or_refused_never_broken(segmented: Engine) -> None:
    """Random texts made of separators, words, digits and odd spacing: prepare gives a consistent
    Prepared or InvalidInput, and what decodes has a well-formed joined alignment."""
    rng = random.Random(5)
    atoms = [", then ", " and ", ", ", ",", " ", "  ", "and", "then", "AND", "five", "hundred",
             "March", "5", "2021", "$3.50", "\u00e9t\u00e9", "\t", "x"]  # fmt: skip
    texts = ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    decodable = []
    for text in texts:
        try:
            prepared = segmented.prepare(text)
        except InvalidInput:
            continue
        for part in prepared.segments:
            assert part.ids and part.text.strip() == part.text
        assert prepared.ids == [i for p in prepared.parts for i in p.ids]
        assert len(prepared.separators) == max(0, len(prepared.segments) - 1)
        if prepared.segments:
            decodable.append(text)
    assert len(decodable) > 50
    options = SearchOptions(beam_size=2, n_best=2, max_length_b=6, max_length_a=1.0)
    for t in segmented.translate(decodable[:40], options, "subword"):
        for h in t.hypotheses:
            assert h.alignment is not None
            assert h.alignment.matrix.shape == (len(h.tokens), len(t.source_tokens))
            np.testing.assert_allclose(h.alignment.matrix.sum(axis=1), 1.0, atol=1e-5)
            assert 0.0 <= h.confidence <= 1.0
