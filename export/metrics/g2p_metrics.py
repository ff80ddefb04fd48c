"""Word and phoneme error rates against several references per word, as the G2P literature scores.

A word counts as right when the prediction equals any of its pronunciations (WER: the share of words
not right). Its phoneme errors are the edit distance to the closest pronunciation, and PER is the
sum of those distances over the sum of the chosen references' lengths (Yao & Zweig 2015;
Toshniwal & Livescu 2016). Plain Python, no torch: the same code scores the trainer's dev set, the
torch greedy decoder and the serving engine's beam search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Pair = tuple[str, str]


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two symbol sequences (unit insert / delete / substitute)."""
    prev = list(range(len(b) + 1))  # distances from a[:0] to every prefix of b
    for i, x in enumerate(a, start=1):
        row = [i]
        for j, y in enumerate(b, start=1):
            row.append(min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = row
    return prev[-1]


@dataclass(frozen=True)
class WordScore:
    """One word's result against its references."""

    correct: bool
    errors: int  # edit distance to the closest reference
    ref_len: int  # that reference's length in phonemes


def score_word(hyp: str, refs: Sequence[str]) -> WordScore:
    """Closest reference by edit distance (ties: the shorter one, then the first listed)."""
    hyp_syms = hyp.split()
    best: tuple[int, int] | None = None
    for ref in refs:
        ref_syms = ref.split()
        cand = (edit_distance(hyp_syms, ref_syms), len(ref_syms))
        if best is None or cand < best:
            best = cand
    if best is None:
        raise ValueError("a word needs at least one reference")
    return WordScore(correct=best[0] == 0, errors=best[0], ref_len=best[1])


def error_rates(scores: Sequence[WordScore]) -> dict[str, Any]:
    """{"words", "wer", "per"} in percent (None for an empty set)."""
    n = len(scores)
    ref_len = sum(s.ref_len for s in scores)
    return {
        "words": n,
        "wer": round(100.0 * sum(not s.correct for s in scores) / n, 2) if n else None,
        "per": round(100.0 * sum(s.errors for s in scores) / ref_len, 2) if ref_len else None,
    }


def references(pairs: Sequence[Pair]) -> dict[str, list[str]]:
    """source → every target listed for it, in first-seen order."""
    refs: dict[str, list[str]] = {}
    for source, target in pairs:
        refs.setdefault(source, []).append(target)
    return refs


def hypotheses_by_source(pairs: Sequence[Pair], hyps: Sequence[str]) -> dict[str, str]:
    """One hypothesis per distinct source (the first row's), from hypotheses aligned with `pairs`."""
    if len(pairs) != len(hyps):
        raise ValueError(f"{len(pairs)} pairs but {len(hyps)} hypotheses")
    out: dict[str, str] = {}
    for (source, _), hyp in zip(pairs, hyps, strict=True):
        out.setdefault(source, hyp)
    return out


def word_error_rate(pairs: Sequence[Pair], hyps: Sequence[str]) -> float:
    """WER in percent over distinct sources; hyps[i] is the prediction for pairs[i]'s source."""
    refs = references(pairs)
    by_source = hypotheses_by_source(pairs, hyps)
    wrong = sum(by_source[s] not in r for s, r in refs.items())
    return 100.0 * wrong / len(refs) if refs else 0.0


def g2p_scores(
    refs: dict[str, list[str]],
    hyps: dict[str, str],
    normalize: Callable[[str], str] = lambda s: s,
    length_edges: Sequence[int] = (4, 6, 8, 10, 12),
) -> dict[str, Any]:
    """WER / PER overall and by word length (letters), after `normalize` on both sides.

    length_edges (4, 6, ...) gives buckets 1-4, 5-6, 7-8, ..., 13+.
    """
    scored: list[tuple[str, WordScore]] = [
        (w, score_word(normalize(hyps[w]), [normalize(r) for r in rs])) for w, rs in refs.items()
    ]
    buckets: list[dict[str, Any]] = []
    low = 1
    for high in (*length_edges, None):
        inside = [s for w, s in scored if len(w) >= low and (high is None or len(w) <= high)]
        label = f"{low}-{high}" if high is not None else f"{low}+"
        buckets.append({"letters": label, **error_rates(inside)})
        low = (high or 0) + 1
    return {"overall": error_rates([s for _, s in scored]), "by_length": buckets}
