"""service/decode/shared/controls.py and the search's use of it: each decoding control alone, against fake
decoders whose distributions depend on each row's own prefix; the stopping rules; and a sentence's
answer alone against batched with sentences under other controls."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

import numpy as np
import pytest

from service.decode.search.beam import BeamSearch, SearchOptions
from service.decode.shared import controls as ctl
from service.decode.shared.controls import Controls
from service.decode.shared.search_types import Hypothesis, StepOutput
from tests.test_beam import BOS, EOS, Dist, FakeDecoder, random_dist

V = 12


class RowsFakeDecoder(FakeDecoder):
    """FakeDecoder with `step_rows`: the top-k and every token's log-prob of the same call."""

    def step_rows(
        self, tokens: np.ndarray, reorder: np.ndarray, k: int
    ) -> tuple[StepOutput, np.ndarray]:
        states = [self.states[r] for r in reorder]
        out = self.step(tokens, reorder, k)
        full = np.stack(
            [
                self.dist(src_len, (*prefix, int(t)))[0]
                for (_, src_len, prefix), t in zip(states, tokens, strict=True)
            ]
        )  # (N, V)
        return out, full


def repetitive_dist(vocab: int, seed: int) -> Dist:
    """A distribution that likes to repeat the previous token and rarely ends."""
    base = random_dist(vocab, seed, eos_bias=-3.0)

    def dist(src_len: int, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        log_probs, attention = base(src_len, prefix)
        logits = log_probs.astype(np.float64)
        if prefix[-1] not in (BOS, EOS):
            logits[prefix[-1]] += 4.0
        logits -= np.logaddexp.reduce(logits[np.isfinite(logits)])
        return logits.astype(np.float32), attention

    return dist


def run(
    dist: Dist,
    jobs: Sequence[tuple[int, SearchOptions, Controls]],
    beam: int = 4,
) -> list[list[Hypothesis]]:
    """Decode jobs (src_len, options, controls) in one running batch; n-best lists in order."""
    decoder = RowsFakeDecoder(dist, V)
    search = BeamSearch(decoder, beam, BOS, EOS, vocab_size=V)
    rows = decoder.join([src_len for src_len, _, _ in jobs])
    for i, ((src_len, options, controls), row) in enumerate(zip(jobs, rows, strict=True)):
        search.add(i, src_len, options, row, controls=controls)
    results: dict[Hashable, list[Hypothesis]] = {}
    while not search.is_empty:
        results.update(search.step())
    return [results[i] for i in range(len(jobs))]


def opts(**kw: object) -> SearchOptions:
    base: dict[str, object] = dict(beam_size=4, n_best=1, max_length_a=0.0, max_length_b=12)
    base.update(kw)
    return SearchOptions(**base)  # type: ignore[arg-type]


def log_prob_of(dist: Dist, src_len: int, tokens: Sequence[int]) -> list[float]:
    out: list[float] = []
    prefix: tuple[int, ...] = (BOS,)
    for tok in tokens:
        out.append(float(dist(src_len, prefix)[0][tok]))
        prefix = (*prefix, tok)
    return out


def ngrams(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


# --- the processors alone --------------------------------------------------------------------------


def test_repetition_penalty_scales_seen_tokens_and_renormalizes() -> None:
    """From the top of a row and the seen tokens' own log-probs, what the whole row gives."""
    probs = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    rows = np.log(probs).astype(np.float32)[None]  # (1, 5)
    seen = (np.array([0, 0]), np.array([1, 4]))
    whole = np.log(probs)
    whole[[1, 4]] *= 2.0
    whole -= np.logaddexp.reduce(whole)
    top_ids = np.array([[0, 1, 2]])
    got = ctl.penalize(rows[:, :3], top_ids, seen, rows[0, [1, 4]], 2.0)
    np.testing.assert_allclose(got[0], whole[:3], rtol=1e-6)


def pairs_of(pairs: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, int]]:
    return sorted(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))


def test_ngram_blocking_blocks_the_token_that_would_repeat_an_ngram() -> None:
    seqs = np.array([[3, 4, 5, 3], [5, 6, 5, 6]])  # row 0: (3, 4) seen, after 3 token 4 is blocked
    assert pairs_of(ctl.repeated_ngram_ends(seqs, 2)) == [(0, 4), (1, 5)]
    assert pairs_of(ctl.repeated_ngram_ends(seqs, 3)) == [(1, 5)]  # (6, 5) seen, then (5, 6)
    assert sorted(set(pairs_of(ctl.repeated_ngram_ends(seqs, 1)))) == [
        (0, 3), (0, 4), (0, 5), (1, 5), (1, 6)
    ]  # fmt: skip


def test_blocked_tokens_and_the_candidates_left() -> None:
    controls = Controls(no_repeat_ngram_size=2, suppress=((7,), (5, 6)), min_length=9)
    seqs = np.array([[3, 4, 5, 3], [5, 5, 5, 5]])
    blocked = ctl.blocked_tokens(seqs, 4, controls, EOS)
    assert pairs_of(blocked) == [(0, EOS), (0, 4), (0, 7), (1, EOS), (1, 5), (1, 6), (1, 7)]
    values = np.log(np.full((2, V), 1 / V, np.float32))
    ids = np.tile(np.arange(V), (2, 1))
    masked = ctl.mask(values, ids, blocked)
    assert np.isinf(masked).sum(axis=1).tolist() == [3, 4]


def test_sampling_distribution_keeps_its_support() -> None:
    rows = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    top2 = ctl.sampling_distribution(rows, Controls(sampling_topk=2))
    np.testing.assert_allclose(top2[0], [0.4 / 0.7, 0.3 / 0.7, 0, 0])
    nucleus = ctl.sampling_distribution(rows, Controls(sampling_topk=0, sampling_topp=0.65))
    np.testing.assert_allclose(nucleus[0], [0.4 / 0.7, 0.3 / 0.7, 0, 0])
    hot = ctl.sampling_distribution(rows, Controls(sampling_topk=0, sampling_temperature=2.0))
    p = np.sqrt([0.4, 0.3, 0.2, 0.1])
    np.testing.assert_allclose(hot[0], p / p.sum())


# --- each control in the search --------------------------------------------------------------------


def test_no_repeat_ngram_size_leaves_no_ngram_twice() -> None:
    dist = repetitive_dist(V, seed=3)
    plain = run(dist, [(5, opts(n_best=3), Controls())])[0]
    assert any(len(set(ngrams(h.tokens, 2))) < len(ngrams(h.tokens, 2)) for h in plain)
    for n in (1, 2, 3):
        for hyp in run(dist, [(5, opts(n_best=3), Controls(no_repeat_ngram_size=n))])[0]:
            grams = ngrams(hyp.tokens, n)
            assert len(set(grams)) == len(grams), (n, hyp.tokens)


def test_min_length_forbids_the_end_before_it() -> None:
    dist = random_dist(V, seed=5, eos_bias=4.0)
    assert min(len(h.tokens) for h in run(dist, [(5, opts(n_best=3), Controls())])[0]) < 3
    for hyp in run(dist, [(5, opts(n_best=3), Controls(min_length=3))])[0]:
        assert len(hyp.tokens) >= 3 and hyp.finished_by_eos


def test_suppressed_tokens_and_sequences_are_never_emitted() -> None:
    dist = repetitive_dist(V, seed=3)
    plain = run(dist, [(5, opts(n_best=3), Controls())])[0]
    token = plain[0].tokens[0]
    pair = tuple(plain[0].tokens[1:3])
    got = run(dist, [(5, opts(n_best=3), Controls(suppress=((token,), pair)))])[0]
    for hyp in got:
        assert token not in hyp.tokens
        assert pair not in ngrams(hyp.tokens, 2)


def test_a_prefix_starts_every_hypothesis_with_the_models_own_log_probs() -> None:
    dist = random_dist(V, seed=9)
    prefix = (7, 3, 7)
    for hyp in run(dist, [(6, opts(n_best=3), Controls(prefix=prefix))])[0]:
        assert tuple(hyp.tokens[:3]) == prefix
        assert hyp.token_log_probs is not None
        np.testing.assert_allclose(hyp.token_log_probs, log_prob_of(dist, 6, hyp.tokens), rtol=1e-6)


def test_alternatives_are_the_top_pieces_after_the_prefix_each_continued_greedily() -> None:
    dist = random_dist(V, seed=11)
    prefix = (5,)
    hyps = run(dist, [(6, opts(beam_size=4), Controls(prefix=prefix, alternatives=3))])[0]
    assert len(hyps) == 4  # every slot's alternative comes back; the engine keeps the best words
    firsts = [h.tokens[1] for h in hyps]
    first_step = dist(6, (BOS, 5))[0].copy()
    first_step[EOS] = -np.inf
    assert sorted(firsts) == sorted(np.argsort(-first_step)[:4].tolist())
    for hyp in hyps:  # each continuation is greedy: the best token at every later step
        prefix_so_far = (BOS, *hyp.tokens[:2])
        for tok in [*hyp.tokens[2:], EOS] if hyp.finished_by_eos else hyp.tokens[2:]:
            assert tok == int(np.argmax(dist(6, prefix_so_far)[0]))
            prefix_so_far = (*prefix_so_far, tok)


def test_repetition_penalty_reduces_repeats() -> None:
    dist = repetitive_dist(V, seed=3)

    def repeats(h: Hypothesis) -> int:
        return len(h.tokens) - len(set(h.tokens))

    plain = run(dist, [(5, opts(beam_size=1), Controls())])[0][0]
    penalized = run(dist, [(5, opts(beam_size=1), Controls(repetition_penalty=5.0))])[0][0]
    assert repeats(penalized) < repeats(plain)
    assert penalized.token_log_probs is not None  # the model's log-probs, not the penalized ones
    assert penalized.log_prob == pytest.approx(
        sum(log_prob_of(dist, 5, [*penalized.tokens, EOS]))
        if penalized.finished_by_eos
        else sum(log_prob_of(dist, 5, penalized.tokens)),
        rel=1e-6,
    )


def chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's chi-square test's p-value (Wilson-Hilferty's normal approximation of the
    chi-square distribution, good to a few percent at these degrees of freedom)."""
    statistic = float(((observed - expected) ** 2 / expected).sum())
    k = len(observed) - 1
    z = ((statistic / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


# --- sampling --------------------------------------------------------------------------------------


def test_the_first_token_is_drawn_from_the_softmax_at_the_temperature() -> None:
    dist = random_dist(V, seed=13)
    n, temperature = 3000, 1.5
    sample = Controls(sampling_topk=0, sampling_temperature=temperature)
    jobs = [
        (4, opts(beam_size=1, max_length_b=1), dataclasses.replace(sample, seed=s + 1))
        for s in range(n)
    ]
    firsts = [hyps[0].tokens[0] if hyps[0].tokens else EOS for hyps in run(dist, jobs, beam=1)]
    counts = np.bincount(firsts, minlength=V)
    p = np.exp(dist(4, (BOS,))[0].astype(np.float64) / temperature)
    p[BOS] = 0.0
    p /= p.sum()
    support = p > 0
    assert counts[~support].sum() == 0
    assert chi_square_p_value(counts[support], p[support] * n) > 1e-3, (counts, p * n)


def test_top_k_and_top_p_samples_stay_in_their_support() -> None:
    dist = random_dist(V, seed=17)
    first = dist(4, (BOS,))[0]
    top3 = set(np.argsort(-first)[:3].tolist())
    probs = np.exp(first.astype(np.float64))
    order = np.argsort(-probs)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.9) + 1)].tolist())
    for controls, support in (
        (Controls(sampling_topk=3), top3),
        (Controls(sampling_topk=0, sampling_topp=0.9), nucleus),
    ):
        jobs = [
            (4, opts(beam_size=1, max_length_b=1), dataclasses.replace(controls, seed=s + 1))
            for s in range(300)
        ]
        firsts = {hyps[0].tokens[0] for hyps in run(dist, jobs, beam=1) if hyps[0].tokens}
        assert firsts <= support and len(firsts) > 1


def test_n_samples_per_text_through_n_best_and_the_seed_repeats_them() -> None:
    dist = random_dist(V, seed=19)
    job = (5, opts(beam_size=4, n_best=4), Controls(sampling_topk=0, seed=42))
    once = run(dist, [job])[0]
    assert len(once) == 4 and len({tuple(h.tokens) for h in once}) > 1
    again = run(dist, [job])[0]
    assert [h.tokens for h in once] == [h.tokens for h in again]
    other_seed = run(dist, [(5, opts(beam_size=4, n_best=4), Controls(sampling_topk=0, seed=43))])[
        0
    ]
    assert [h.tokens for h in other_seed] != [h.tokens for h in once]


# --- batch invariance: every control alone against batched with others ----------------------------

EVERY_CONTROL: dict[str, Controls] = {
    "none": Controls(),
    "ngram": Controls(no_repeat_ngram_size=2),
    "repetition": Controls(repetition_penalty=2.0),
    "min_length": Controls(min_length=4),
    "prefix": Controls(prefix=(6, 2)),
    "alternatives": Controls(alternatives=3),
    "sampling": Controls(sampling_topk=5, sampling_topp=0.9, sampling_temperature=0.8, seed=5),
    "suppress": Controls(suppress=((3,), (4, 5))),
    "force_eos": Controls(force_eos=True),
    "force_eos_ngram": Controls(force_eos=True, no_repeat_ngram_size=2),
}


@pytest.mark.parametrize("name", sorted(EVERY_CONTROL))
def test_an_answer_does_not_depend_on_the_batch(name: str) -> None:
    dist = repetitive_dist(V, seed=23)
    job = (6, opts(n_best=2 if name != "alternatives" else 1), EVERY_CONTROL[name])
    alone = run(dist, [job])[0]
    others = [
        (4 + i % 3, opts(n_best=1, length_penalty=0.5 * (i % 2)), c)
        for i, c in enumerate(EVERY_CONTROL.values())
        if c != EVERY_CONTROL[name]
    ]
    batched = run(dist, [others[0], job, *others[1:]])[1]
    assert [h.tokens for h in alone] == [h.tokens for h in batched]
    np.testing.assert_allclose([h.score for h in alone], [h.score for h in batched], rtol=1e-6)


def test_force_eos_alone_keeps_no_token_history_and_ends_what_reaches_the_maximum() -> None:
    """force_eos reads no tokens (Controls.reads_history): the search keeps no token columns for
    such sentences, and every hypothesis that reaches the maximum length still ends there with
    the end of sentence, scored as the tokens before it."""
    dist = repetitive_dist(V, seed=31)
    decoder = RowsFakeDecoder(dist, V)
    search = BeamSearch(decoder, 4, BOS, EOS, vocab_size=V)
    rows = decoder.join([5, 7])
    for i, row in enumerate(rows):
        search.add(i, 5 + 2 * i, opts(n_best=4, max_length_b=6), row, Controls(force_eos=True))
    results: dict[Hashable, list[Hypothesis]] = {}
    while not search.is_empty:
        results.update(search.step())
        assert search._beams.seqs.shape[1] == 0
    cut = run(dist, [(5, opts(n_best=4, max_length_b=6), Controls())])[0]
    longest = max(len(h.tokens) for h in cut)
    assert not all(h.finished_by_eos for h in cut)  # without it, hypotheses are cut there
    for i in range(2):
        assert all(h.finished_by_eos and len(h.tokens) < longest for h in results[i])
    assert any(len(h.tokens) == longest - 1 for h in results[0])  # the end took the last step


# --- the stopping rules ------------------------------------------------------------------------------


def test_patience_without_bound_finds_what_the_exact_rule_finds() -> None:
    dist = random_dist(V, seed=29, eos_bias=1.0)
    for length_penalty in (0.0, 1.0):
        exact = run(dist, [(6, opts(n_best=2, length_penalty=length_penalty), Controls())])[0]
        patient = opts(n_best=2, length_penalty=length_penalty, stopping="patience", patience=100.0)
        long = run(dist, [(6, patient, Controls())])[0]
        assert [h.tokens for h in exact] == [h.tokens for h in long]


def test_the_first_rule_stops_once_the_best_ranked_candidate_ended() -> None:
    dist = random_dist(V, seed=31, eos_bias=1.0)
    decoder = RowsFakeDecoder(dist, V, [6])
    search = BeamSearch(decoder, 4, BOS, EOS, vocab_size=V)
    search.add(0, 6, opts(stopping="first", length_penalty=1.0), 0)
    steps, done = 0, list[tuple[Hashable, list[Hypothesis]]]()
    while not done:
        done = search.step()
        steps += 1
    exact_decoder = RowsFakeDecoder(dist, V, [6])
    exact = BeamSearch(exact_decoder, 4, BOS, EOS, vocab_size=V)
    exact.add(0, 6, opts(length_penalty=1.0), 0)
    exact_steps = 0
    while not exact.is_empty:
        exact.step()
        exact_steps += 1
    assert steps <= exact_steps
    (hyp,) = done[0][1]
    assert hyp.finished_by_eos and math.isfinite(hyp.score)


# --- Marian's rules ----------------------------------------------------------------------------------


def marian_reference(
    dist: Dist, src_len: int, K: int, normalize: float, word_penalty: float, factor: float
) -> list[tuple[tuple[int, ...], float]]:
    """marian-decoder's search (export/toolkits/marian_search.py's rule) over dist: the top
    `width` candidates by path score, EOS ones finish and narrow the beam for good, every
    hypothesis of the last step joins the n-best; ranked by (log P - wp x len) / len^normalize."""
    max_len = math.ceil(factor * src_len)
    beam: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    width, final = K, []
    for t in range(max_len):
        cands = []
        for tokens, score in beam:
            log_probs = dist(src_len, (BOS, *tokens))[0].astype(np.float64)
            for tok in np.argsort(-log_probs, kind="stable")[: K + 1]:
                cands.append(((*tokens, int(tok)), score + float(log_probs[tok])))
        cands = sorted(cands, key=lambda c: -c[1])[:width]  # stable: slot order, then rank
        last = t + 1 >= max_len
        for tokens, score in cands:
            if tokens[-1] == EOS or last:
                n = len(tokens)
                final.append((tokens, (score - word_penalty * n) / n**normalize))
        beam = [c for c in cands if c[0][-1] != EOS]
        width = len(beam)
        if not beam or last:
            break
    return sorted(final, key=lambda f: -f[1])[:K]


@pytest.mark.parametrize(("normalize", "word_penalty"), [(0.0, 0.0), (0.6, 0.0), (1.0, 0.5)])
def test_the_narrowing_rule_with_marians_scores_is_marians_search(
    normalize: float, word_penalty: float
) -> None:
    for seed in range(6):
        dist = random_dist(V, seed=40 + seed, eos_bias=0.5)
        options = opts(
            beam_size=4,
            n_best=4,
            stopping="narrowing",
            normalize=normalize,
            word_penalty=word_penalty,
            max_length_factor=1.5,
        )
        decoder = RowsFakeDecoder(dist, V, [5])
        search = BeamSearch(decoder, 4, BOS, EOS, vocab_size=V, narrow_on_eos=True)
        search.add(0, 5, options, 0)
        results: dict[Hashable, list[Hypothesis]] = {}
        while not search.is_empty:
            results.update(search.step())
        want = marian_reference(dist, 5, 4, normalize, word_penalty, 1.5)
        got = results[0]
        assert [tuple(h.tokens) + ((EOS,) if h.finished_by_eos else ()) for h in got] == [
            w[0] for w in want
        ]
        np.testing.assert_allclose([h.score for h in got], [w[1] for w in want], rtol=1e-6)
