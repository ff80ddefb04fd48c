"""The beam search's scalar rules, once: both searches (service/decode/search/beam.py on the host,
service/decode/search/device_search.py on the device) and the device search's graph
(service/decode/runtime/search_graph.py, which writes the same rules as graph nodes) import them.

Scoring follows GNMT (Wu et al., 2016) with Marian's length normalization and word penalty:
s(Y, X) = (log P(Y|X) - wp·|Y|) / (lp(|Y|) · |Y|^normalize) + cp(X; Y), lp(n) = ((5 + n) / 6)^α,
cp = β · Σ_i log(min(Σ_j a_ji, 1)). |Y| counts decoder steps (the tokens, plus the end of sentence
when the hypothesis ended with it). No numpy here but for the coverage; no onnx at all.
"""

from __future__ import annotations

import math

import numpy as np

from service.decode.shared.options import SearchOptions

COVERAGE_FLOOR = 1e-6  # coverage is clipped to [COVERAGE_FLOOR, 1] before the log: no log 0


def length_penalty(steps: int, alpha: float) -> float:
    """GNMT's lp = ((5 + steps) / 6)^alpha; 1 when alpha is 0."""
    return ((5.0 + steps) / 6.0) ** alpha


def length_normalizer(steps: int, options: SearchOptions) -> float:
    """What a score over `steps` steps is divided by: GNMT's lp times Marian's steps^normalize."""
    return length_penalty(steps, options.length_penalty) * steps**options.normalize


def normalized_score(score: float, steps: int, options: SearchOptions) -> float:
    """A finished hypothesis's score before the coverage penalty: its cumulative score less the
    word penalty of its `steps` steps (the end of sentence counted), over `length_normalizer`."""
    return (score - options.word_penalty * steps) / length_normalizer(steps, options)


def coverage_penalty(coverage: np.ndarray, beta: float) -> float:
    """GNMT's cp = beta * sum_i log(min(coverage_i, 1)), coverage (src_len,) clipped at
    COVERAGE_FLOOR (the sum in float32, then beta in float64)."""
    if beta == 0.0:
        return 0.0
    clipped = np.clip(coverage, COVERAGE_FLOOR, 1.0)  # (src_len,)
    return beta * float(np.log(clipped).sum())


def max_length(options: SearchOptions, src_len: int, prefix: int = 0, forced: int = 0) -> int:
    """A sentence's most decoder steps: the options' rule for a source of src_len tokens
    (SearchOptions.max_len), capped by max_length; a target prefix of `prefix` tokens is always
    decoded whole (room for it and one more token, still capped by max_length), and `forced`
    more steps are made for tokens the search must place (a glossary's constraints)."""
    room = options.max_len(src_len)
    if prefix:
        room = max(room, prefix + 1)
    return min(options.max_length, room + forced)


def cannot_improve(
    best_live: float, steps: int, worst_kept: float, max_len: int, options: SearchOptions
) -> bool:
    """The exact stopping rule: no live hypothesis can still beat the worst of the n-best kept.
    Scores only fall and the normalizer grows with length (α >= 0, normalize >= 0), cp <= 0, so
    a live hypothesis's best normalized score is its score less the word penalty of at least one
    more step, over the largest normalizer reachable; a word penalty below 0 (a reward) leaves no
    bound."""
    if options.word_penalty < 0:
        return False
    spent = best_live - options.word_penalty * (steps + 1)
    return spent / length_normalizer(max_len, options) <= worst_kept


def heuristic_ends(best_live: float, steps: int, worst_kept: float, options: SearchOptions) -> bool:
    """transformers' generate (early_stopping=False): the best live hypothesis, scored as if it
    ended now (its `steps` tokens, normalized), cannot beat the worst of the beam_size finished
    ones kept. Not a bound: a longer hypothesis may still score higher where lengths are rewarded,
    which generate accepts, and so does this rule."""
    return normalized_score(best_live, steps, options) <= worst_kept


def kept_finished(options: SearchOptions) -> int:
    """How many finished hypotheses a sentence keeps: its n-best, or its beam under the
    heuristic rule (generate keeps beam_size and stops on the worst of them)."""
    return options.beam_size if options.stopping == "heuristic" else options.n_best


def exact_rule_applies(options: SearchOptions) -> bool:
    """Whether the exact rule bounds this sentence's search (its stopping rule is "exact" and its
    word penalty no reward)."""
    return options.stopping == "exact" and options.word_penalty >= 0


def patience_ends(options: SearchOptions) -> float:
    """How many ended hypotheses stop a sentence under its rule: beam × patience ("patience"),
    its beam ("narrowing", whose width reaches 0 then), never (the others: inf); at least its
    n-best."""
    if options.stopping == "patience":
        return max(options.n_best, math.ceil(options.beam_size * options.patience))
    if options.stopping == "narrowing":
        return max(options.n_best, options.beam_size)
    return math.inf
