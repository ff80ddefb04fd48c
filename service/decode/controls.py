"""Decoding controls: what a sentence's hypotheses may emit next, and how its next tokens are chosen.

Each control is a small function that takes one sentence's rows of log-probabilities over the whole
target vocabulary and returns them changed (the shape of Hugging Face's logits processors), applied
in `process` before the search's top-k. Settings are per sentence (`Controls`), not per batch: a
running batch mixes requests, and a request's answer must not depend on who else is in it.

Pure numpy, like the search (service/decode/beam.py) that calls it. Rows are one sentence's K
hypothesis slots; `seqs` (K, t) holds each slot's target tokens so far (the prefix's included, BOS
and EOS not), t being the step about to be taken.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class Controls:
    """One sentence's controls, as token ids (the engine tokenizes the request's texts).

    prefix: the target tokens every hypothesis starts with (forced, whatever else applies).
    suppress: token sequences never emitted (a single token: never; a longer one: its last token
        is blocked after the others).
    alternatives: at the first step after the prefix, continue the K best next pieces as K
        separate hypotheses, each then extended greedily (its best continuation).
    """

    prefix: tuple[int, ...] = ()
    suppress: tuple[tuple[int, ...], ...] = ()
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    alternatives: int = 0
    sampling_topk: int = 1
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0
    seed: int = 0

    @property
    def sampling(self) -> bool:
        return self.sampling_topk != 1

    @property
    def active(self) -> bool:
        """Whether the sentence needs every token's log-prob at each step (not only the top k)."""
        return bool(
            self.prefix
            or self.suppress
            or self.min_length
            or self.no_repeat_ngram_size
            or self.repetition_penalty != 1.0
            or self.alternatives
            or self.sampling
        )

    @property
    def independent(self) -> bool:
        """Slots are independent hypotheses (samples, or alternatives), not a ranked beam: each
        extends itself by one token, and the sentence ends only when every slot has ended."""
        return self.sampling or self.alternatives > 0

    def greedy_slots(self, step: int) -> bool:
        """Each slot takes its own best token at this step (alternatives after their position)."""
        return self.alternatives > 0 and step > len(self.prefix)


NO_CONTROLS = Controls()


# --- the processors: (K, V) rows in, (K, V) rows out ---------------------------------------------


def penalize_repetitions(rows: np.ndarray, seqs: np.ndarray, penalty: float) -> np.ndarray:
    """CTranslate2's repetition penalty (Keskar et al., 2019): a token already in the hypothesis
    has its score multiplied by the penalty where negative, divided where positive. The exported
    step ends in its log-softmax, so every score is a (negative) log-probability: it is multiplied,
    and the row renormalized."""
    K, t = seqs.shape
    if penalty == 1.0 or t == 0:
        return rows
    out = rows.copy()  # (K, V)
    for j in range(K):
        seen = np.unique(seqs[j])  # (u,)
        scores = out[j, seen]
        out[j, seen] = np.where(scores < 0, scores * penalty, scores / penalty)
    finite = np.where(np.isfinite(out), out, -np.inf)
    norm = np.logaddexp.reduce(finite.astype(np.float64), axis=1, keepdims=True)  # (K, 1)
    return (out - norm).astype(np.float32)


def block_repeated_ngrams(rows: np.ndarray, seqs: np.ndarray, n: int) -> np.ndarray:
    """No n-gram of target tokens twice in a hypothesis (fairseq's and CTranslate2's
    no_repeat_ngram_size): a token that would complete an n-gram already present is blocked."""
    K, t = seqs.shape
    if n <= 0 or t < n:  # no n-gram complete yet to repeat
        return rows
    out = rows
    for j in range(K):
        seq = seqs[j]  # (t,)
        if n == 1:
            blocked = seq
        else:
            context = seq[t - (n - 1) :]  # (n-1,) the hypothesis's last n-1 tokens
            windows = np.lib.stride_tricks.sliding_window_view(seq[: t - 1], n - 1)  # (t-n+1, n-1)
            starts = np.flatnonzero((windows == context).all(axis=1))
            blocked = seq[starts + n - 1]
        if len(blocked):
            if out is rows:
                out = rows.copy()
            out[j, blocked] = NEG_INF
    return out


def suppress_sequences(
    rows: np.ndarray, seqs: np.ndarray, sequences: tuple[tuple[int, ...], ...]
) -> np.ndarray:
    """Block each sequence's last token wherever the hypothesis ends with the sequence's others
    (a one-token sequence: always)."""
    if not sequences:
        return rows
    out = rows.copy()
    t = seqs.shape[1]
    for sequence in sequences:
        *head, last = sequence
        if not head:
            out[:, last] = NEG_INF
            continue
        if len(head) > t:
            continue
        ends = (seqs[:, t - len(head) :] == np.asarray(head)).all(axis=1)  # (K,)
        out[ends, last] = NEG_INF
    return out


def force_prefix(rows: np.ndarray, step: int, prefix: tuple[int, ...]) -> np.ndarray:
    """Within the prefix, only the prefix's token, at the model's own log-prob."""
    if step >= len(prefix):
        return rows
    token = prefix[step]
    out = np.full_like(rows, NEG_INF)
    out[:, token] = rows[:, token]
    return out


def process(
    raw: np.ndarray, seqs: np.ndarray, step: int, controls: Controls, eos_id: int
) -> np.ndarray:
    """One sentence's raw log-prob rows (K, V) → the scores its search ranks (K, V)."""
    rows = penalize_repetitions(raw, seqs, controls.repetition_penalty)
    rows = block_repeated_ngrams(rows, seqs, controls.no_repeat_ngram_size)
    rows = suppress_sequences(rows, seqs, controls.suppress)
    if step < controls.min_length or (controls.alternatives and step == len(controls.prefix)):
        rows = rows.copy() if rows is raw else rows
        rows[:, eos_id] = NEG_INF  # alternatives are next words: not the end of the sentence
    return force_prefix(rows, step, controls.prefix)


# --- choosing the candidates ---------------------------------------------------------------------


def top_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of each row, best first, ties to the lower token id (as ONNX Runtime's TopK):
    values (K, k), token ids (K, k) int64."""
    K, V = rows.shape
    k = min(k, V)
    part = np.argpartition(-rows, k - 1, axis=1)[:, :k] if k < V else np.tile(np.arange(V), (K, 1))
    part = np.sort(part, axis=1)  # (K, k) by id, so a stable sort by value breaks ties by id
    values = np.take_along_axis(rows, part, axis=1)  # (K, k)
    order = np.argsort(-values, axis=1, kind="stable")  # (K, k)
    ids = np.take_along_axis(part, order, axis=1).astype(np.int64)
    return np.take_along_axis(values, order, axis=1), ids


def one_candidate(rows: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each slot's chosen token as its only candidate: values (K, k) (-inf after the first),
    ids (K, k)."""
    K = len(tokens)
    values = np.full((K, k), NEG_INF, np.float32)  # (K, k)
    ids = np.zeros((K, k), np.int64)  # (K, k)
    values[:, 0] = rows[np.arange(K), tokens]
    ids[:, 0] = tokens
    return values, ids


def sampling_distribution(rows: np.ndarray, controls: Controls) -> np.ndarray:
    """Each row's probabilities to sample from (K, V) float64: the scores over the temperature,
    cut to the top k (0: every token) and then to the nucleus top p, renormalized."""
    V = rows.shape[1]
    scaled = rows.astype(np.float64) / controls.sampling_temperature  # (K, V)
    if 0 < controls.sampling_topk < V:
        kth = -np.partition(-scaled, controls.sampling_topk - 1, axis=1)[
            :, controls.sampling_topk - 1
        ]  # (K,)
        scaled = np.where(scaled >= kth[:, None], scaled, -np.inf)
    top = scaled.max(axis=1, keepdims=True)  # (K, 1)
    scaled -= np.where(np.isfinite(top), top, 0.0)
    probs = np.exp(scaled)  # (K, V)
    probs[~np.isfinite(top[:, 0])] = 1.0  # a row with every token blocked (a dead slot): any
    probs /= probs.sum(axis=1, keepdims=True)
    if controls.sampling_topp < 1.0:
        order = np.argsort(-probs, axis=1, kind="stable")  # (K, V)
        sorted_probs = np.take_along_axis(probs, order, axis=1)
        before = np.cumsum(sorted_probs, axis=1) - sorted_probs  # mass of the tokens ranked above
        keep_sorted = before < controls.sampling_topp
        keep_sorted[:, 0] = True  # the most likely token always stays
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=1, keepdims=True)
    return probs


def sample(rows: np.ndarray, controls: Controls, rng: np.random.Generator) -> np.ndarray:
    """One token per row (K,) int64 drawn from `sampling_distribution` (the most likely one at
    temperature 0); one uniform draw per row from the sentence's own generator."""
    draws = rng.random(len(rows))  # (K,) drawn for every row, so the stream does not depend on rows
    if controls.sampling_temperature == 0.0:
        return np.argmax(rows, axis=1).astype(np.int64)
    probs = sampling_distribution(rows, controls)  # (K, V)
    cdf = np.cumsum(probs, axis=1)  # (K, V)
    picks = (cdf < draws[:, None] * cdf[:, -1:]).sum(axis=1)  # (K,)
    return np.minimum(picks, rows.shape[1] - 1).astype(np.int64)


def candidates(
    rows: np.ndarray,
    step: int,
    controls: Controls,
    k: int,
    rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One sentence's candidates (K, k) values and ids from its processed rows: the top k (beam
    search), or one per slot (a sample, or a slot's own best token when alternatives continue)."""
    if step < len(controls.prefix):
        return top_k(rows, k)  # only the forced token is finite
    if controls.sampling:
        assert rng is not None
        return one_candidate(rows, sample(rows, controls, rng), k)
    if controls.greedy_slots(step):
        return one_candidate(rows, np.argmax(rows, axis=1).astype(np.int64), k)
    return top_k(rows, k)
