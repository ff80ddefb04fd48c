"""The decoding controls through the engine, on the tiny exported model: ONNX Runtime's whole
log-softmax row (the graph with it exposed) under the same search, a prefix scored as Align scores
it, alternatives as words, unknown-word replacement, and the errors a person can act on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.decode.align.aligner import align
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.text.preparation import DecodeRequest
from tests.conftest import TinyModel


@pytest.fixture(scope="module")
def engine(tiny: TinyModel) -> Engine:
    return Engine.load(
        tiny.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1),
        EngineLimits(max_prefix_tokens=12),
    )


def test_a_complete_prefix_scores_what_align_scores(engine: Engine, tiny: TinyModel) -> None:
    """A text given as the whole prefix (the search may add nothing after it: its maximum length
    is the text's length) is scored token by token as Align scores it. The texts are the model's
    greedy answers cut at 8 tokens (under the engine's prefix limit of 12): the tiny model's
    weights are random and its answers rarely end, so each source is a case by construction."""
    checked = 0
    for source in tiny.sources[:4]:
        greedy = engine.translate([source], SearchOptions(beam_size=1, max_length=8), "none")
        text = greedy[0].hypotheses[0].text
        assert text.strip(), source
        (pair,) = align(engine, [(source, text)])
        whole = SearchOptions(
            beam_size=1, max_length=len(pair.target_tokens), target_prefix=(text,)
        )
        forced = engine.translate([source], whole, "subword")[0].hypotheses[0]
        assert forced.tokens == pair.target_tokens
        np.testing.assert_allclose(forced.token_log_probs, pair.token_log_probs, atol=1e-4)
        assert forced.log_prob == pytest.approx(pair.log_prob - pair.eos_log_prob, abs=1e-4)
        assert forced.alignment is not None
        assert forced.alignment.matrix.shape == (len(forced.tokens), len(pair.source_tokens))
        checked += 1
    assert checked == 4


def test_a_prefix_is_continued(engine: Engine, tiny: TinyModel) -> None:
    source = tiny.sources[5]
    options = SearchOptions(beam_size=3, n_best=2, target_prefix=("un deux",))
    for hyp in engine.translate([source], options, "none")[0].hypotheses:
        assert hyp.text.startswith("un deux")
        assert len(hyp.token_log_probs) == len(hyp.token_ids)


def test_sentences_without_controls_decode_the_same_beside_controlled_ones(
    engine: Engine, tiny: TinyModel
) -> None:
    """The controlled sentences' steps read the whole row from the graph with its log-softmax
    exposed; the others' candidates still come from its TopK: the same as alone."""
    plain = SearchOptions(beam_size=4, n_best=2)
    sources = tiny.sources[:6]
    alone = engine.translate(sources, plain, "subword")
    batch = engine.new_batch(4)
    controlled = SearchOptions(beam_size=4, no_repeat_ngram_size=2, sampling_topk=3, seed=3)
    batch.add(
        [DecodeRequest(i, engine.prepare(s), plain, "subword") for i, s in enumerate(sources)]
        + [
            DecodeRequest(100 + i, engine.prepare(s), controlled, "none")
            for i, s in enumerate(sources)
        ]
    )
    results: dict[int, Any] = {}
    while len(batch):
        results.update(batch.step())
    for i, translation in enumerate(alone):
        mixed = results[i]
        assert [h.token_ids for h in mixed.hypotheses] == [
            h.token_ids for h in translation.hypotheses
        ]
        assert [h.score for h in mixed.hypotheses] == [h.score for h in translation.hypotheses]


def test_alternatives_are_distinct_words_ranked_by_probability(
    engine: Engine, tiny: TinyModel
) -> None:
    options = SearchOptions(beam_size=6, return_alternatives=4, target_prefix=("un",))
    hyps = engine.translate([tiny.sources[2]], options, "word")[0].hypotheses
    assert 1 <= len(hyps) <= 4
    words = [h.alternative.word for h in hyps if h.alternative is not None]
    assert len(words) == len(hyps) == len(set(words))
    probabilities = [h.alternative.probability for h in hyps if h.alternative is not None]
    assert probabilities == sorted(probabilities, reverse=True)
    assert all(0 < p <= 1 for p in probabilities)
    for hyp in hyps:
        assert hyp.text.startswith("un")
        assert hyp.alternative is not None and hyp.alternative.position == 1
        # the next word, or the rest of the prefix's last word when a piece continues it
        assert hyp.alternative.word in hyp.text[len("un") :]


def test_sampling_with_a_seed_gives_the_same_answer_alone_or_batched(
    engine: Engine, tiny: TinyModel
) -> None:
    options = SearchOptions(beam_size=3, n_best=3, sampling_topk=0, seed=11)
    alone = engine.translate([tiny.sources[3]], options, "none")[0]
    batched = engine.translate(tiny.sources[:4], options, "none")[3]
    assert [h.token_ids for h in alone.hypotheses] == [h.token_ids for h in batched.hypotheses]


def test_suppressed_words_are_never_emitted(engine: Engine, tiny: TinyModel) -> None:
    sources = tiny.sources[:8]
    plain = engine.translate(sources, SearchOptions(beam_size=3), "none")
    word = max(
        {w for t in plain for w in t.hypotheses[0].text.split()},
        key=lambda w: sum(t.hypotheses[0].text.split().count(w) for t in plain),
    )
    got = engine.translate(sources, SearchOptions(beam_size=3, suppress=(word,)), "none")
    suppressed = tuple(engine.tgt_tok.encode(word))
    for t in got:
        ids = t.hypotheses[0].token_ids
        n = len(suppressed)
        assert all(tuple(ids[i : i + n]) != suppressed for i in range(len(ids) - n + 1))


def test_bad_controls_are_refused_naming_the_field(engine: Engine, tiny: TinyModel) -> None:
    two = tiny.sources[:2]
    with pytest.raises(InvalidInput, match="target_prefix has 1 entries for 2 texts"):
        engine.translate(two, SearchOptions(target_prefix=("un",)), "none")
    with pytest.raises(InvalidInput, match=r"target_prefix\[0\] is .* over the limit of 12"):
        engine.translate(two[:1], SearchOptions(target_prefix=("un deux " * 20,)), "none")
    with pytest.raises(ValueError, match=r"return_alternatives \(6\) must be between 0 and beam"):
        SearchOptions(beam_size=5, return_alternatives=6)
    with pytest.raises(
        ValueError, match="stopping must be one of exact, first, patience, narrowing"
    ):
        SearchOptions(stopping="soon")


def test_a_prefix_or_suppress_entry_the_model_cannot_spell_is_refused_naming_it(
    engine: Engine, tiny: TinyModel
) -> None:
    """A prefix of characters the target vocabulary lacks would be forced as its unknown token
    (the answer would not start with what was sent); a suppress entry would block the unknown
    token instead. Both are refused, naming the characters; control characters by name too."""
    one = tiny.sources[:1]
    snowman = r"'☃' \(U\+2603 SNOWMAN\)"
    with pytest.raises(
        InvalidInput, match=rf"target_prefix\[0\] \('☃☃ ☃'\): .*cannot spell {snowman}"
    ):
        engine.translate(one, SearchOptions(target_prefix=("☃☃ ☃",)), "none")
    with pytest.raises(InvalidInput, match=rf"target_prefix\[1\] .*cannot spell {snowman}:"):
        engine.translate(tiny.sources[:2], SearchOptions(target_prefix=("un", "un ☃")), "none")
    with pytest.raises(InvalidInput, match=rf"suppress\[1\] \('☃'\): .*cannot spell {snowman}"):
        engine.translate(one, SearchOptions(suppress=("un", "☃")), "none")
    for field in ("target_prefix", "suppress"):
        values: dict[str, Any] = {field: ("un\x00 deux",)}
        with pytest.raises(ValueError, match=rf"{field}\[0\] has control characters \(U\+0000\)"):
            SearchOptions(**values)
    # what the vocabulary spells is accepted, tabs and newlines read as spaces
    engine.translate(one, SearchOptions(target_prefix=("un\tdeux",), suppress=("trois",)), "none")
