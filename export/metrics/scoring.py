"""Scores of one system's outputs: BLEU, chrF and exact match, overall and by source length.

Source length is counted in source SentencePiece tokens; a bucket is marked when some or all of it
is longer than any training source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sacrebleu

# Bucket upper bounds in source tokens: 1-10, 11-20, 21-30, 31-40, 41-50, 51+.
DEFAULT_EDGES: tuple[int, ...] = (10, 20, 30, 40, 50)


class EvaluationError(ValueError):
    """Bad evaluation input: an unreadable split, a mismatched tokenizer, an index out of range."""


# --- length buckets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """Source lengths lo..hi in tokens, inclusive; hi None means open-ended."""

    lo: int
    hi: int | None

    @property
    def label(self) -> str:
        return f"{self.lo}+" if self.hi is None else f"{self.lo}-{self.hi}"


def make_buckets(edges: Sequence[int] = DEFAULT_EDGES) -> list[Bucket]:
    """Edges (10, 20) → buckets 1-10, 11-20, 21+."""
    if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
        raise EvaluationError(
            f"bucket edges must be increasing positive integers, got {list(edges)}"
        )
    los = [1, *(e + 1 for e in edges)]
    his: list[int | None] = [*edges, None]
    return [Bucket(lo, hi) for lo, hi in zip(los, his, strict=True)]


def bucket_index(length: int, buckets: Sequence[Bucket]) -> int:
    """Index of the bucket holding `length` (an empty source counts in the first bucket)."""
    for i, b in enumerate(buckets):
        if b.hi is None or length <= b.hi:
            return i
    raise AssertionError("the last bucket is open-ended")


def beyond_train(bucket: Bucket, n_beyond: int, max_train_len: int | None) -> str | None:
    """'all' if the whole bucket is longer than any training source, 'some' if part of it, else 'none'."""
    if max_train_len is None:
        return None
    if bucket.lo > max_train_len:
        return "all"
    return "some" if n_beyond > 0 else "none"


# --- scores ------------------------------------------------------------------------------------


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF (sacrebleu defaults) and exact match in %; None scores when empty."""
    n = len(hyps)
    if n == 0:
        return {"n": 0, "bleu": None, "chrf": None, "exact_match": None}
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score
    chrf = sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score
    exact = 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs, strict=True)) / n
    return {"n": n, "bleu": round(bleu, 2), "chrf": round(chrf, 2), "exact_match": round(exact, 2)}


def bucket_scores(
    lengths: Sequence[int],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[Bucket],
    max_train_len: int | None,
) -> list[dict[str, Any]]:
    """One row per bucket: its range, scores, and how much of it lies beyond the training lengths."""
    members: list[list[int]] = [[] for _ in buckets]
    for i, length in enumerate(lengths):
        members[bucket_index(length, buckets)].append(i)
    rows = []
    for bucket, idx in zip(buckets, members, strict=True):
        n_beyond = sum(lengths[i] > max_train_len for i in idx) if max_train_len is not None else 0
        rows.append(
            {
                "label": bucket.label,
                "lo": bucket.lo,
                "hi": bucket.hi,
                **score([hyps[i] for i in idx], [refs[i] for i in idx]),
                "n_beyond_train": n_beyond if max_train_len is not None else None,
                "beyond_train": beyond_train(bucket, n_beyond, max_train_len),
            }
        )
    return rows


def compute_metrics(
    lengths: Sequence[int],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[Bucket],
    max_train_len: int | None,
) -> dict[str, Any]:
    """Overall scores and per-bucket scores of one system's outputs."""
    return {
        "overall": score(hyps, refs),
        "max_train_source_len": max_train_len,
        "buckets": bucket_scores(lengths, hyps, refs, buckets, max_train_len),
    }
