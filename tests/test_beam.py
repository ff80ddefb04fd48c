"""Tests for service/decode/search/beam.py against fake decoders whose outputs depend on each row's own prefix."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import pytest

from service.decode.search.beam import BeamSearch, SearchOptions, beam_search, compaction_order
from service.decode.shared.rules import coverage_penalty, length_penalty
from service.decode.shared.search_types import Hypothesis, StepOutput

BOS, EOS = 0, 1

# (src_len, prefix incl. BOS) -> (log_probs (V,), attention (src_len,))
Dist = Callable[[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]]


def random_dist(vocab: int, seed: int, eos_bias: float = 0.0) -> Dist:
    """A deterministic pseudo-random distribution per (src_len, prefix); BOS is never produced."""

    def dist(src_len: int, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, src_len, len(prefix), *prefix])
        logits = rng.normal(size=vocab) * 1.5  # (V,)
        logits[BOS] = -np.inf
        logits[EOS] += eos_bias
        log_probs = logits - np.logaddexp.reduce(logits[np.isfinite(logits)])  # (V,)
        energies = rng.normal(size=src_len)  # (src_len,)
        attention = np.exp(energies) / np.exp(energies).sum()  # (src_len,)
        return log_probs.astype(np.float32), attention.astype(np.float32)

    return dist


class FakeDecoder:
    """Keeps one (sentence tag, src_len, prefix) per state-buffer row; outputs come from `dist`.

    Checks the search's contract on every call: each row continues a state of its own sentence.
    """

    def __init__(self, dist: Dist, vocab: int, src_lens: Sequence[int] = ()) -> None:
        self.dist, self.vocab = dist, vocab
        self.sentences: list[tuple[int, int]] = []  # encoder rows: (tag, src_len)
        self.states: list[tuple[int, int, tuple[int, ...]]] = []  # state buffer rows
        self.batch_rows: list[int] = []  # N of every step
        self.keeps: list[list[int]] = []  # every keep_sentences call
        self._tags = itertools.count()
        self.join(src_lens)

    def join(self, src_lens: Sequence[int]) -> list[int]:
        """Append encoder rows and initial states; return the new state rows."""
        rows = []
        for src_len in src_lens:
            tag = next(self._tags)
            self.sentences.append((tag, src_len))
            rows.append(len(self.states))
            self.states.append((tag, src_len, ()))
        return rows

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        (N,) = tokens.shape
        B = len(self.sentences)
        assert N % B == 0 and reorder.shape == (N,) and k <= self.vocab
        K = N // B
        S = max(src_len for _, src_len in self.sentences)
        log_probs = np.zeros((N, k), np.float32)  # (N, k)
        token_ids = np.zeros((N, k), np.int64)  # (N, k)
        attention = np.zeros((N, S), np.float32)  # (N, S)
        new_states = []
        for n in range(N):
            tag, src_len, prefix = self.states[reorder[n]]
            assert (tag, src_len) == self.sentences[n // K], (
                "row continues another sentence's state"
            )
            prefix = (*prefix, int(tokens[n]))
            lp, att = self.dist(src_len, prefix)
            top = np.argsort(-lp, kind="stable")[:k]  # (k,)
            log_probs[n], token_ids[n], attention[n, :src_len] = lp[top], top, att
            new_states.append((tag, src_len, prefix))
        self.states = new_states
        self.batch_rows.append(N)
        return StepOutput(log_probs=log_probs, token_ids=token_ids, attention=attention)

    def keep_sentences(self, keep: np.ndarray) -> None:
        self.keeps.append([int(b) for b in keep])
        self.sentences = [self.sentences[b] for b in keep]


def decode(
    dist: Dist, vocab: int, src_lens: Sequence[int], options: SearchOptions
) -> list[list[Hypothesis]]:
    return beam_search(
        FakeDecoder(dist, vocab, src_lens), src_lens, options, BOS, EOS, vocab_size=vocab
    )


def options(**kw: object) -> SearchOptions:
    base: dict[str, object] = dict(
        beam_size=4, n_best=1, max_length_a=1.0, max_length_b=3, max_length=50
    )
    base.update(kw)
    return SearchOptions(**base)  # type: ignore[arg-type]


def sequence_log_prob(dist: Dist, src_len: int, tokens: Sequence[int], by_eos: bool) -> float:
    """log P of tokens (+ EOS) under dist, summed in float64 from dist's float32 values."""
    total = 0.0
    prefix: tuple[int, ...] = (BOS,)
    for tok in [*tokens, EOS] if by_eos else tokens:
        total += float(dist(src_len, prefix)[0][tok])
        prefix = (*prefix, tok)
    return total


def assert_same(a: list[Hypothesis], b: list[Hypothesis]) -> None:
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.finished_by_eos for h in a] == [h.finished_by_eos for h in b]
    np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-6)
    np.testing.assert_allclose([h.log_prob for h in a], [h.log_prob for h in b], rtol=1e-6)
    for ha, hb in zip(a, b, strict=True):
        if ha.attention is None or hb.attention is None:
            assert ha.attention is None and hb.attention is None
        else:
            np.testing.assert_array_equal(ha.attention, hb.attention)


# (1) exactness -----------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(5))
def test_wide_beam_equals_exhaustive_search(seed: int, alpha: float) -> None:
    vocab, max_len, src_len = 4, 3, 2
    dist = random_dist(vocab, seed)
    words = [2, 3]
    candidates = [
        (list(t), True) for n in range(max_len) for t in itertools.product(words, repeat=n)
    ]
    candidates += [(list(t), False) for t in itertools.product(words, repeat=max_len)]
    scored = []
    for tokens, by_eos in candidates:
        log_prob = sequence_log_prob(dist, src_len, tokens, by_eos)
        scored.append((log_prob / length_penalty(len(tokens) + by_eos, alpha), tokens))
    scored.sort(key=lambda s: -s[0])

    opts = options(
        beam_size=8, n_best=8, max_length_a=0.0, max_length_b=max_len, length_penalty=alpha
    )
    (hyps,) = decode(dist, vocab, [src_len], opts)
    assert [h.tokens for h in hyps] == [t for _, t in scored[:8]]
    np.testing.assert_allclose([h.score for h in hyps], [s for s, _ in scored[:8]], rtol=1e-6)

    (best,) = decode(dist, vocab, [src_len], dataclasses.replace(opts, n_best=1))
    assert best[0].tokens == scored[0][1]
    assert best[0].score == pytest.approx(scored[0][0], rel=1e-6)


# (2) greedy --------------------------------------------------------------------------------------


def greedy(dist: Dist, src_len: int, max_len: int) -> tuple[list[int], float, bool]:
    tokens: list[int] = []
    log_prob = 0.0
    for _ in range(max_len):
        lp, _att = dist(src_len, (BOS, *tokens))
        tok = int(np.argmax(lp))
        log_prob += float(lp[tok])
        if tok == EOS:
            return tokens, log_prob, True
        tokens.append(tok)
    return tokens, log_prob, False


@pytest.mark.parametrize("seed", range(4))
def test_beam_one_equals_greedy(seed: int) -> None:
    vocab, src_lens = 9, [1, 4, 6, 2, 9]
    dist = random_dist(vocab, seed, eos_bias=0.5)
    results = decode(dist, vocab, src_lens, options(beam_size=1))
    for src_len, (hyp,) in zip(src_lens, results, strict=True):
        tokens, log_prob, by_eos = greedy(dist, src_len, max_len=src_len + 3)
        assert hyp.tokens == tokens and hyp.finished_by_eos == by_eos
        assert hyp.log_prob == pytest.approx(log_prob, rel=1e-6)


# (3) batching ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_batched_equals_one_at_a_time(seed: int) -> None:
    vocab, src_lens = 10, [3, 7, 1, 5, 2]
    dist = random_dist(vocab, seed, eos_bias=0.3)
    opts = options(n_best=3, length_penalty=0.6, coverage_penalty=0.2, return_attention=True)
    batched = decode(dist, vocab, src_lens, opts)
    for src_len, hyps in zip(src_lens, batched, strict=True):
        (alone,) = decode(dist, vocab, [src_len], opts)
        assert_same(hyps, alone)


def test_narrower_sentence_in_wide_batch_equals_its_own_beam() -> None:
    vocab = 10
    dist = random_dist(vocab, seed=7, eos_bias=0.3)
    narrow = options(beam_size=2, n_best=2, return_attention=True)
    decoder = FakeDecoder(dist, vocab, [4, 6])
    search = BeamSearch(decoder, beam_size=5, bos_id=BOS, eos_id=EOS, vocab_size=vocab)
    search.add("wide", 4, options(beam_size=5), state_row=0)
    search.add("narrow", 6, narrow, state_row=1)
    results = dict(run_to_end(search))
    (alone,) = decode(dist, vocab, [6], narrow)
    assert_same(results["narrow"], alone)


def test_sentences_with_own_options_and_a_shrinking_source_width() -> None:
    # the long source leaves after 2 steps, so the padded width S shrinks from 9 to 3
    vocab = 10
    dist = random_dist(vocab, seed=4, eos_bias=-1.0)
    short_opts = options(n_best=2, max_length_b=6, coverage_penalty=0.5, return_attention=True)
    decoder = FakeDecoder(dist, vocab, [9, 3])
    search = BeamSearch(decoder, beam_size=4, bos_id=BOS, eos_id=EOS, vocab_size=vocab)
    search.add("long", 9, options(max_length=2), state_row=0)
    search.add("short", 3, short_opts, state_row=1)
    results = dict(run_to_end(search))
    assert decoder.keeps[0] == [1] and len(decoder.batch_rows) > 2
    (alone,) = decode(dist, vocab, [3], short_opts)
    assert_same(results["short"], alone)
    assert all(len(h.tokens) <= 2 for h in results["long"])


def run_to_end(search: BeamSearch) -> list[tuple[object, list[Hypothesis]]]:
    out = []
    while not search.is_empty:
        out += search.step()
    return out


# (4) n-best --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_n_best_sorted_and_distinct(seed: int) -> None:
    vocab = 8
    dist = random_dist(vocab, seed, eos_bias=0.5)
    for hyps in decode(dist, vocab, [2, 5, 8], options(beam_size=5, n_best=5, length_penalty=0.6)):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


# (5) alignment -----------------------------------------------------------------------------------


def test_backtraced_attention_and_scores_belong_to_each_hypothesis() -> None:
    vocab, src_lens, alpha, beta = 9, [3, 6, 2], 0.6, 0.3
    dist = random_dist(vocab, seed=11, eos_bias=0.4)
    opts = options(n_best=4, length_penalty=alpha, coverage_penalty=beta, return_attention=True)
    for src_len, hyps in zip(src_lens, decode(dist, vocab, src_lens, opts), strict=True):
        for hyp in hyps:
            assert hyp.attention is not None
            assert hyp.attention.shape == (len(hyp.tokens), src_len)
            np.testing.assert_allclose(hyp.attention.sum(axis=1), 1.0, rtol=1e-5)
            prefixes = [
                (BOS, *hyp.tokens[:t]) for t in range(len(hyp.tokens) + hyp.finished_by_eos)
            ]
            rows = np.array([dist(src_len, p)[1] for p in prefixes]).reshape(
                -1, src_len
            )  # (T', src_len)
            np.testing.assert_array_equal(hyp.attention, rows[: len(hyp.tokens)])
            log_prob = sequence_log_prob(dist, src_len, hyp.tokens, hyp.finished_by_eos)
            assert hyp.log_prob == pytest.approx(log_prob, rel=1e-6)
            lp = length_penalty(len(prefixes), alpha)
            cp = coverage_penalty(rows.sum(axis=0), beta)  # coverage includes the EOS step
            assert hyp.score == pytest.approx(log_prob / lp + cp, rel=1e-5)


def test_attention_is_none_unless_asked_for() -> None:
    dist = random_dist(8, seed=3)
    for hyps in decode(dist, 8, [3, 4], options(n_best=2, coverage_penalty=0.5)):
        assert all(h.attention is None for h in hyps)


# (6) leaving -------------------------------------------------------------------------------------


def test_finished_sentences_leave_the_batch() -> None:
    vocab, K = 6, 3
    dist = random_dist(vocab, seed=5, eos_bias=-np.inf)  # never EOS: each stops at its max length
    decoder = FakeDecoder(dist, vocab, [2, 5, 3])
    search = BeamSearch(decoder, beam_size=K, bos_id=BOS, eos_id=EOS, vocab_size=vocab)
    opts = options(beam_size=K, max_length_a=1.0, max_length_b=0)  # max length = src_len
    for b, src_len in enumerate([2, 5, 3]):
        search.add(f"s{b}", src_len, opts, state_row=b)
    finished_at = {}
    for step in itertools.count(1):
        for sid, _ in search.step():
            finished_at[sid] = step
        if search.is_empty:
            break
    assert finished_at == {"s0": 2, "s2": 3, "s1": 5}
    assert decoder.batch_rows == [3 * K, 3 * K, 2 * K, K, K]
    # s0 leaves: s2 fills its row and s1 stays put ([2, 1]); then s2 (now row 0) leaves
    assert decoder.keeps == [[2, 1], [1], []]
    assert len(search) == 0


@pytest.mark.parametrize("seed", range(20))
def test_compaction_order_keeps_every_survivor_and_moves_one_row_per_hole(seed: int) -> None:
    rng = np.random.default_rng(seed)
    done = rng.random(int(rng.integers(1, 40))) < rng.random()
    order = compaction_order(done)
    assert sorted(order.tolist()) == np.flatnonzero(~done).tolist()
    moved = order != np.arange(len(order))
    assert moved.sum() == done[: len(order)].sum()  # one move per dropped row inside the new size
    assert (order[moved] >= len(order)).all()  # only survivors from beyond the new end move


# (7) joining -------------------------------------------------------------------------------------


@pytest.mark.parametrize("join_after", [1, 3])
def test_sentence_added_mid_way_equals_decoded_alone(join_after: int) -> None:
    vocab = 10
    dist = random_dist(vocab, seed=9, eos_bias=0.2)
    opts = options(n_best=3, length_penalty=0.6, coverage_penalty=0.1, return_attention=True)
    decoder = FakeDecoder(dist, vocab, [5, 8])
    search = BeamSearch(decoder, beam_size=4, bos_id=BOS, eos_id=EOS, vocab_size=vocab)
    search.add("a", 5, opts, state_row=0)
    search.add("b", 8, opts, state_row=1)
    results: dict[Hashable, list[Hypothesis]] = {}
    for _ in range(join_after):
        results.update(search.step())
    (row,) = decoder.join([11])  # a longer source: the padded width S grows
    search.add("late", 11, opts, state_row=row)
    results.update(run_to_end(search))
    for sid, src_len in [("a", 5), ("b", 8), ("late", 11)]:
        (alone,) = decode(dist, vocab, [src_len], opts)
        assert_same(results[sid], alone)


def test_add_rejects_wider_beam_and_duplicate_ids() -> None:
    search = BeamSearch(FakeDecoder(random_dist(5, 0), 5, [3]), beam_size=2, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="exceeds the batch's beam size 2"):
        search.add("x", 3, options(beam_size=3), state_row=0)
    search.add("x", 3, options(beam_size=2), state_row=0)
    with pytest.raises(ValueError, match="already decoding"):
        search.add("x", 3, options(beam_size=2), state_row=0)


# (8) validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(beam_size=2, n_best=3), r"n_best \(3\) must be between 1 and beam_size \(2\)"),
        (dict(beam_size=0, n_best=1), "beam_size must be >= 1, got 0"),
        (dict(beam_size=2.0), "beam_size must be an integer, got 2.0"),
        (
            dict(length_penalty=-0.5),
            r"length_penalty must be a finite number in \[0, 100\], got -0.5",
        ),
        (dict(coverage_penalty=-1.0), r"coverage_penalty must be a finite number in \[0, 100\]"),
        (dict(n_best=0), r"n_best \(0\) must be between 1 and beam_size \(5\)"),
        (dict(max_length=0), "max_length must be >= 1, got 0"),
        (dict(max_length_a=float("nan")), r"max_length_a must be a finite number in \[0, 100\]"),
        (dict(max_length_b=1.5), "max_length_b must be an integer, got 1.5"),
        (dict(return_attention=1), "return_attention must be a bool, got 1"),
    ],
)
def test_search_options_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SearchOptions(**kwargs)  # type: ignore[arg-type]


def test_max_len_formula() -> None:
    opts = SearchOptions(max_length_a=1.5, max_length_b=2, max_length=10)
    assert [opts.max_len(n) for n in (0, 1, 4, 100)] == [2, 3, 8, 10]
    assert SearchOptions(max_length_a=0.0, max_length_b=-5).max_len(3) == 1


# (9) maximum length ------------------------------------------------------------------------------


def test_max_length_is_respected_and_cut_hypotheses_are_not_finished_by_eos() -> None:
    vocab = 6
    dist = random_dist(vocab, seed=2, eos_bias=-np.inf)
    opts = options(beam_size=3, n_best=3, max_length_a=0.5, max_length_b=1, max_length=3)
    short, long = decode(dist, vocab, [2, 10], opts)  # max lengths 2 and min(3, 6) = 3
    assert all(len(h.tokens) == 2 and not h.finished_by_eos for h in short)
    assert all(len(h.tokens) == 3 and not h.finished_by_eos for h in long)


@pytest.mark.parametrize("seed", range(3))
def test_hypotheses_never_exceed_max_length(seed: int) -> None:
    vocab = 7
    dist = random_dist(vocab, seed, eos_bias=-1.0)
    opts = options(beam_size=4, n_best=4, max_length_a=0.0, max_length_b=4)
    for hyps in decode(dist, vocab, [3, 5], opts):
        for h in hyps:
            assert len(h.tokens) <= (3 if h.finished_by_eos else 4)
            assert len(h.tokens) == 4 or h.finished_by_eos


# (10) length penalty -----------------------------------------------------------------------------


def table_dist(table: dict[tuple[int, ...], list[float]]) -> Dist:
    """Probabilities of (EOS, 2, 3) per prefix from `table`, else EOS 0.9; uniform attention."""

    def dist(src_len: int, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        probs = table.get(prefix, [0.9, 0.05, 0.05])
        with np.errstate(divide="ignore"):
            log_probs = np.array([-np.inf, *np.log(probs)])  # (V,) over BOS, EOS, 2, 3
        return log_probs.astype(np.float32), np.full(src_len, 1.0 / src_len, np.float32)

    return dist


def test_length_penalty_favours_longer_hypotheses() -> None:
    # EOS now: p 0.3 (|Y| = 1); "2" then EOS: p 0.5 * 0.55 (|Y| = 2); everything longer is worse
    dist = table_dist({(BOS,): [0.3, 0.5, 0.2], (BOS, 2): [0.55, 0.25, 0.2]})
    plain, penalized = (
        decode(dist, 4, [3], options(beam_size=2, length_penalty=alpha))[0][0]
        for alpha in (0.0, 1.0)
    )
    assert plain.tokens == [] and plain.score == pytest.approx(np.log(0.3), rel=1e-6)
    assert penalized.tokens == [2]
    assert penalized.score == pytest.approx(np.log(0.5 * 0.55) / (7 / 6), rel=1e-6)


def test_search_goes_on_while_a_live_hypothesis_can_still_win_after_normalization() -> None:
    # after step 1 the best live log-prob (log 0.38) is below the finished EOS (log 0.4),
    # but "2" EOS scores log(0.38 * 0.97) / (7/6) > log 0.4 with alpha = 1
    dist = table_dist({(BOS,): [0.4, 0.38, 0.22], (BOS, 2): [0.97, 0.02, 0.01]})
    (hyps,) = decode(dist, 4, [3], options(beam_size=2, length_penalty=1.0))
    assert hyps[0].tokens == [2]
    assert hyps[0].score == pytest.approx(np.log(0.38 * 0.97) / (7 / 6), rel=1e-6)


def test_sentence_without_live_continuation_finishes_with_fewer_than_n_best() -> None:
    dist = table_dist({(BOS,): [1.0, 0.0, 0.0]})  # only EOS is possible
    (hyps,) = decode(dist, 4, [3], options(beam_size=3, n_best=3))
    assert [h.tokens for h in hyps] == [[]]
    assert hyps[0].finished_by_eos and hyps[0].log_prob == 0.0
