"""Lexically constrained beam search (service/decode/shared/constraints.py and its use by the search):
the states alone, dynamic beam allocation's order, then the guarantee over random models, alone
and batched beside other sentences and controls."""

from __future__ import annotations

import numpy as np
import pytest

from service.decode.shared.constraints import START, Constraints, SlotTable, bank_order
from service.decode.shared.controls import Controls
from service.decode.shared.search_types import Hypothesis
from tests.test_beam import BOS, EOS, random_dist
from tests.test_controls import V, opts, repetitive_dist, run


def contains(tokens: list[int], sequence: tuple[int, ...]) -> bool:
    n = len(sequence)
    return any(tuple(tokens[i : i + n]) == sequence for i in range(len(tokens) - n + 1))


# --- the states ---------------------------------------------------------------------------------


def test_a_state_follows_the_tokens_spelled() -> None:
    c = Constraints(((5, 6), (7,)))
    assert c.total == 3
    state = c.advance(START, 5)
    assert c.met_tokens(state) == 1 and not c.complete(state)
    state = c.advance(state, 6)  # (5, 6) met
    assert c.met_tokens(state) == 2 and c.info(state).just_met
    assert c.advance(c.advance(START, 5), 4) == START  # abandoned: its progress is lost
    assert c.advance(c.advance(START, 5), 7) == (2, -2, 0)  # abandoned, but (7,) met
    done = c.advance(state, 7)
    assert c.complete(done) and c.met_tokens(done) == 3


def test_the_slot_table_gives_banks_and_the_tokens_to_force() -> None:
    c = Constraints(((5, 6), (7,)))
    table = SlotTable.of([(c, START), (c, c.advance(START, 5))])
    tokens = np.array([[5, 7, 3], [6, 7, 3]])  # (2 rows, 3 candidates)
    rows = np.array([[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(table.banks(rows, tokens), [[1, 1, 0], [2, 1, 0]])
    values = np.array([[-1.0, -2.0], [-1.0, -9.0]], np.float32)  # (2, k=2) candidates
    ids = np.array([[5, 3], [6, 3]])
    full = np.log(np.full((2, V), 1 / V, np.float32))
    extra, extra_ids = table.forced(values, ids, full, EOS)
    live = np.isfinite(extra)
    # row 0 has 5 among its candidates: 7 is added; row 1 has 6 (its next): 7 too
    assert sorted(extra_ids[0][live[0]].tolist()) == [7]
    assert sorted(extra_ids[1][live[1]].tolist()) == [7]


def test_bank_order_takes_the_best_of_each_bank_in_turn_fullest_first() -> None:
    banks = np.array([[0, 0, 1, 0, 2, 1]])  # candidates best first
    live = np.array([[True, True, True, True, True, False]])
    order = bank_order(banks, live)
    assert order[0].tolist() == [4, 2, 0, 1, 3, 5]  # 2, 1, 0, then bank 0's second, ...


# --- the search --------------------------------------------------------------------------------


def constrained(*sequences: tuple[int, ...]) -> Controls:
    return Controls(constraints=tuple(sequences))


@pytest.mark.parametrize("seed", range(60))
def test_the_best_hypothesis_and_every_ended_one_hold_every_constraint(seed: int) -> None:
    """1-3 random constraints of 1-3 tokens each, on a random model: the best hypothesis holds
    them all, and so does every hypothesis that ended (the end of sentence waits for them); one
    cut at the maximum length ranks after those that hold them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    sequences = tuple(
        tuple(int(t) for t in rng.choice(np.arange(3, V), size=int(rng.integers(1, 4))))
        for _ in range(n)
    )
    dist = random_dist(V, seed, eos_bias=0.5)
    (hyps,) = run(dist, [(5, opts(n_best=3, max_length_b=16), constrained(*sequences))])
    assert len(hyps) == 3
    holds = [all(contains(h.tokens, s) for s in sequences) for h in hyps]
    assert holds[0], (hyps[0].tokens, sequences)
    assert holds == sorted(holds, reverse=True)  # those that hold them first
    assert all(ok for h, ok in zip(hyps, holds, strict=True) if h.finished_by_eos)


def test_a_sentence_answers_the_same_alone_and_batched_with_others() -> None:
    dist = repetitive_dist(V, seed=31)
    job = (6, opts(n_best=2), constrained((4, 9), (7,)))
    alone = run(dist, [job])[0]
    others = [
        (5, opts(), Controls()),
        (4, opts(), constrained((3,))),
        (6, opts(length_penalty=0.5), Controls(suppress=((5,), (6, 8)), no_repeat_ngram_size=2)),
        (3, opts(), Controls(repetition_penalty=1.5)),
    ]
    batched = run(dist, [others[0], job, *others[1:]])[1]
    assert [h.tokens for h in alone] == [h.tokens for h in batched]
    np.testing.assert_allclose([h.score for h in alone], [h.score for h in batched], rtol=1e-6)


def test_a_prefix_comes_first_and_may_meet_a_constraint() -> None:
    dist = random_dist(V, seed=7, eos_bias=0.5)
    (hyps,) = run(dist, [(5, opts(n_best=2), Controls(prefix=(6, 4), constraints=((4,), (9,))))])
    for h in hyps:
        assert h.tokens[:2] == [6, 4] and contains(h.tokens, (9,))


def test_a_term_is_forced_even_where_suppress_would_drop_it() -> None:
    dist = random_dist(V, seed=3, eos_bias=0.5)
    (hyps,) = run(dist, [(5, opts(), Controls(suppress=((8,),), constraints=((8,),)))])
    assert contains(hyps[0].tokens, (8,))


def test_log_probs_are_the_models_for_the_forced_tokens() -> None:
    from tests.test_controls import log_prob_of

    dist = random_dist(V, seed=11, eos_bias=0.5)
    (hyps,) = run(dist, [(4, opts(), constrained((10, 3)))])
    h: Hypothesis = hyps[0]
    assert h.token_log_probs is not None
    np.testing.assert_allclose(h.token_log_probs, log_prob_of(dist, 4, h.tokens), rtol=1e-5)


def test_a_word_does_not_go_on_after_a_term() -> None:
    from service.decode.search.beam import BeamSearch
    from tests.test_controls import RowsFakeDecoder

    dist = repetitive_dist(V, seed=5)  # likes to repeat its last token: 7 7 7 ...
    continues = np.zeros(V, bool)
    continues[7] = True  # 7 is a piece that would go on with the word before it
    decoder = RowsFakeDecoder(dist, V)
    search = BeamSearch(decoder, 4, BOS, EOS, vocab_size=V, continues_word=continues)
    (row,) = decoder.join([5])
    search.add(0, 5, opts(n_best=4), row, controls=constrained((7,)))
    results: dict[object, list[Hypothesis]] = {}
    while not search.is_empty:
        results.update(search.step())
    met = [h for h in results[0] if 7 in h.tokens]
    assert met and met[0] is results[0][0]
    for h in met:
        first = h.tokens.index(7)
        assert h.tokens[first + 1 : first + 2] != [7]
