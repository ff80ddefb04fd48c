"""Decoding controls: what a sentence's hypotheses may emit next, and how its next tokens are chosen.

Each control is a small function that takes one sentence's rows of log-probabilities over the whole
target vocabulary and returns them changed (the shape of Hugging Face's logits processors), applied
in `process` before the search's top-k. Settings are per sentence (`Controls`), not per batch: a
running batch mixes requests, and a request's answer must not depend on who else is in it.

Pure numpy, like the search (service/decode/search/beam.py) that calls it. Rows are one sentence's K
hypothesis slots; `seqs` (K, t) holds each slot's target tokens so far (the prefix's included, BOS
and EOS not), t being the step about to be taken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class Controls:
    """One sentence's controls, as token ids (the engine tokenizes the request's texts).

    prefix: the target tokens every hypothesis starts with (forced, whatever else applies).
    constraints: token sequences every finished hypothesis contains (a glossary's terms:
        service/decode/shared/constraints.py, applied by the search itself, not here).
    suppress: token sequences never emitted (a single token: never; a longer one: its last token
        is blocked after the others).
    alternatives: at the first step after the prefix, continue the K best next pieces as K
        separate hypotheses, each then extended greedily (its best continuation).
    force_eos: at the sentence's last step (its maximum length), the end of sentence is the only
        candidate and adds nothing to the score: the hypotheses still running end there instead
        of being cut (transformers' ForcedEOSTokenLogitsProcessor sets its log-prob to 0; the
        token's own log-prob is still reported).
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
    constraints: tuple[tuple[int, ...], ...] = ()
    force_eos: bool = False

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
            or self.constraints
            or self.force_eos
        )

    @property
    def reads_history(self) -> bool:
        """Whether a step's controls read the hypotheses' tokens so far: every active control
        but force_eos alone, which acts only at the sentence's last step and reads its step count
        (the search keeps no token history and builds no step controls for such a sentence before
        then: a Hugging Face model's forced end of sentence costs its other steps nothing)."""
        return replace(self, force_eos=False).active

    @property
    def independent(self) -> bool:
        """Slots are independent hypotheses (samples, or alternatives), not a ranked beam: each
        extends itself by one token, and the sentence ends only when every slot has ended."""
        return self.sampling or self.alternatives > 0

    def greedy_slots(self, step: int) -> bool:
        """Each slot takes its own best token at this step (alternatives after their position)."""
        return self.alternatives > 0 and step > len(self.prefix)


NO_CONTROLS = Controls()


def unusable_controls(controls: Controls, vocab_size: int) -> str | None:
    """Why a sentence's controls cannot decode with a target vocabulary of vocab_size (a token id
    outside it: a front and an engine that disagree on the vocabulary), or None. A search checks
    each sentence's own, so that one sentence's bad controls fail it, not its batch."""
    named = {
        "target prefix": [controls.prefix],
        "suppressed sequence": list(controls.suppress),
        "glossary term": list(controls.constraints),
    }
    for what, sequences in named.items():
        for seq in sequences:
            bad = [t for t in seq if not 0 <= t < vocab_size]
            if bad:
                return f"{what} token ids {bad} are outside the target vocabulary of {vocab_size}"
    return None


MAX_TOP_SAMPLING = 64  # top-k sampling up to this k draws from the step's own top k


# --- what a control removes or changes: (slot, token) pairs -----------------------------------------
# Over R slots at once (the slots of every sentence at the same step under the same controls: in a
# batch that joined together, one group), as pairs `rows` (P,), `tokens` (P,): no loop per slot.


Pairs = tuple[np.ndarray, np.ndarray]  # rows (P,) int64, tokens (P,) int64


def _no_pairs() -> Pairs:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def repeated_ngram_ends(seqs: np.ndarray, n: int) -> Pairs:
    """The tokens that would complete an n-gram already in a slot's tokens seqs (R, t): fairseq's
    and CTranslate2's no_repeat_ngram_size (no n-gram of target tokens twice in a hypothesis)."""
    R, t = seqs.shape
    if n <= 0 or t < n:  # no n-gram complete yet to repeat
        return _no_pairs()
    if n == 1:
        return np.repeat(np.arange(R), t), seqs.reshape(-1)
    context = seqs[:, t - (n - 1) :]  # (R, n-1) each slot's last n-1 tokens
    windows = np.lib.stride_tricks.sliding_window_view(seqs[:, : t - 1], n - 1, axis=1)
    rows, starts = np.nonzero((windows == context[:, None, :]).all(axis=2))  # (P,) each
    return rows, seqs[rows, starts + n - 1]


def suppressed_ends(seqs: np.ndarray, sequences: tuple[tuple[int, ...], ...]) -> Pairs:
    """The last token of each suppressed sequence whose other tokens end a slot's seqs (R, t) (a
    one-token sequence: every slot)."""
    t = seqs.shape[1]
    rows, tokens = [], []
    for *head, last in sequences:
        if len(head) > t:
            continue
        hit = (seqs[:, t - len(head) :] == np.asarray(head, np.int64)).all(axis=1)  # (R,)
        where = np.flatnonzero(hit)
        rows.append(where)
        tokens.append(np.full(len(where), last, np.int64))
    if not rows:
        return _no_pairs()
    return np.concatenate(rows), np.concatenate(tokens)


def blocked_tokens(seqs: np.ndarray, step: int, controls: Controls, eos_id: int) -> Pairs:
    """The (slot, token) pairs that may not come next for seqs (R, step): repeated n-grams' ends,
    suppressed sequences' ends, and the end of sentence before min_length (or as an alternative,
    which is a next word)."""
    R = len(seqs)
    parts = [repeated_ngram_ends(seqs, controls.no_repeat_ngram_size)]
    if controls.suppress:
        parts.append(suppressed_ends(seqs, controls.suppress))
    if step < controls.min_length or (controls.alternatives > 0 and step == len(controls.prefix)):
        parts.append((np.arange(R), np.full(R, eos_id, np.int64)))
    return _unique_pairs(parts)


def seen_tokens(seqs: np.ndarray, controls: Controls) -> Pairs:
    """The (slot, token) pairs the repetition penalty applies to, each once (none when off)."""
    R, t = seqs.shape
    if controls.repetition_penalty == 1.0 or t == 0:
        return _no_pairs()
    return _unique_pairs([(np.repeat(np.arange(R), t), seqs.reshape(-1))])


def _unique_pairs(parts: list[Pairs]) -> Pairs:
    rows = np.concatenate([r for r, _ in parts]).astype(np.int64)
    tokens = np.concatenate([t for _, t in parts]).astype(np.int64)
    if len(rows) == 0:
        return rows, tokens
    base = int(tokens.max()) + 1
    key = np.unique(rows * base + tokens)  # sorted by slot, then token
    return key // base, key % base


def _hits(ids: np.ndarray, pairs: Pairs) -> np.ndarray:
    """(R, m) bool: where a slot's candidate ids (R, m) is one of its pairs' tokens."""
    rows, tokens = pairs
    hit = np.zeros(ids.shape, bool)  # (R, m)
    if len(rows):
        np.logical_or.at(hit, rows, ids[rows] == tokens[:, None])
    return hit


def mask(values: np.ndarray, ids: np.ndarray, blocked: Pairs) -> np.ndarray:
    """values (R, m) of the tokens ids (R, m), -inf where a slot's token is blocked."""
    return np.where(_hits(ids, blocked), NEG_INF, values)


def penalize(
    values: np.ndarray, ids: np.ndarray, seen: Pairs, seen_log_probs: np.ndarray, penalty: float
) -> np.ndarray:
    """CTranslate2's repetition penalty (Keskar et al., 2019) on values (R, m) of the tokens ids
    (R, m): a token already in the hypothesis has its score multiplied by the penalty where
    negative, divided where positive. The exported step ends in its log-softmax, so every score is
    a (negative) log-probability: it is multiplied, and the row renormalized. The row's new sum
    follows from the seen tokens' own log-probs seen_log_probs (P,), so only they are read:
    Σ p' = 1 + Σ_seen (p^penalty - p)."""
    rows, _ = seen
    if penalty == 1.0 or len(rows) == 0:
        return values
    out = values.astype(np.float64)  # (R, m)
    hit = _hits(ids, seen)
    out[hit] = np.where(out[hit] < 0, out[hit] * penalty, out[hit] / penalty)
    logp = seen_log_probs.astype(np.float64)  # (P,)
    changed = np.where(logp < 0, logp * penalty, logp / penalty)
    gained = np.bincount(rows, weights=np.exp(changed) - np.exp(logp), minlength=len(values))
    out -= np.log1p(gained)[:, None]
    return out.astype(np.float32)


def reorder(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's candidates best first again (stable: equal values keep their order)."""
    order = np.argsort(-values, axis=1, kind="stable")  # (R, m)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)


def extra_candidates(R: int, blocked: Pairs, seen: Pairs) -> int:
    """How many more candidates per slot than the search's K + 1 the step must return so that,
    after the blocked tokens are dropped and the seen ones lowered, K + 1 remain that are surely
    the best: at most this many of a slot's top tokens can be blocked or lowered."""
    counts = np.bincount(blocked[0], minlength=R) + np.bincount(seen[0], minlength=R)
    return int(counts.max()) if R else 0


# --- choosing the candidates ---------------------------------------------------------------------


def one_candidate(
    rows: np.ndarray, tokens: np.ndarray, k: int, column: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each slot's chosen token as its only candidate: values (K, k) (-inf after the first),
    ids (K, k). rows: (K, V) by token id, or with `column` (K, m) whose given column is it."""
    K = len(tokens)
    values = np.full((K, k), NEG_INF, np.float32)  # (K, k)
    ids = np.zeros((K, k), np.int64)  # (K, k)
    values[:, 0] = rows[:, column] if column is not None else rows[np.arange(K), tokens]
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


def sample(rows: np.ndarray, controls: Controls, draws: np.ndarray) -> np.ndarray:
    """One token per row (R,) int64 drawn from `sampling_distribution` by the row's uniform draw
    draws (R,) (the most likely one at temperature 0)."""
    if controls.sampling_temperature == 0.0:
        return np.argmax(rows, axis=1).astype(np.int64)
    probs = sampling_distribution(rows, controls)  # (K, V)
    cdf = np.cumsum(probs, axis=1)  # (K, V)
    picks = (cdf < draws[:, None] * cdf[:, -1:]).sum(axis=1)  # (K,)
    return np.minimum(picks, rows.shape[1] - 1).astype(np.int64)


@dataclass(frozen=True)
class SlotRows:
    """What the step gave one sentence's K slots: the top k (values (K, k), ids (K, k), best
    first) and, when read, every token's log-prob (K, V)."""

    values: np.ndarray
    ids: np.ndarray
    full: np.ndarray | None


@dataclass(frozen=True)
class SlotControls:
    """The slots of sentences at one step under the same controls: their tokens so far, and the
    (slot, token) pairs those block or lower."""

    controls: Controls
    step: int
    slots: int
    blocked: Pairs
    seen: Pairs
    end_id: int = -1  # >= 0: the only candidate at this step (force_eos at the last step)

    @classmethod
    def at(
        cls, controls: Controls, seqs: np.ndarray, step: int, eos_id: int, last: bool = False
    ) -> SlotControls:
        """seqs (R, step): each slot's tokens so far; `last`: this step is the sentence's last
        (its maximum length)."""
        R = len(seqs)
        if step < len(controls.prefix):  # forced: nothing else applies
            return cls(controls, step, R, _no_pairs(), _no_pairs())
        if controls.force_eos and last:  # the end of sentence forced: nothing else applies
            return cls(controls, step, R, _no_pairs(), _no_pairs(), end_id=eos_id)
        blocked = blocked_tokens(seqs, step, controls, eos_id)
        return cls(controls, step, R, blocked, seen_tokens(seqs, controls))

    @property
    def extra(self) -> int:
        return extra_candidates(self.slots, self.blocked, self.seen)

    def wanted(self, K: int) -> int:
        """Candidates per slot the step must return: K + 1 and what may be dropped or lowered;
        for top-k sampling from the step's own top k (`samples_from_top`), k and what may be
        dropped."""
        if self.samples_from_top:
            return self.controls.sampling_topk + self.extra
        return K + 1 + self.extra

    @property
    def samples_from_top(self) -> bool:
        """Top-k sampling (k up to MAX_TOP_SAMPLING) with nothing to read of the other tokens: the
        step's own top k are the distribution (after the temperature, top-p, renormalized)."""
        c = self.controls
        return c.sampling and 0 < c.sampling_topk <= MAX_TOP_SAMPLING and not len(self.seen[0])

    @property
    def idle(self) -> bool:
        """Nothing to change at this step: the step's own top k are the candidates."""
        c = self.controls
        return not (
            self.step < len(c.prefix)
            or self.end_id >= 0
            or c.sampling
            or c.greedy_slots(self.step)
            or len(self.blocked[0])
            or len(self.seen[0])
        )

    @property
    def needs_full_rows(self) -> bool:
        """Whether this step reads every token's log-prob: a forced prefix token's (it may lie
        outside the top k), a sample's whole distribution, the seen tokens' under a repetition
        penalty."""
        c = self.controls
        sampling = c.sampling and not self.samples_from_top
        forced = self.step < len(c.prefix) or self.end_id >= 0
        return forced or sampling or len(self.seen[0]) > 0


def candidates(rows: SlotRows, at: SlotControls, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The slots' candidates (R, k) values and ids: the forced prefix token, or the step's top k
    with the blocked tokens dropped and the seen ones penalized (beam search), of which only the
    best when alternatives continue each slot on its own. Sampling: `sampled_candidates`."""
    controls = at.controls
    if at.step < len(controls.prefix):  # the prefix's token, at the model's own log-prob
        assert rows.full is not None
        tokens = np.full(len(rows.ids), controls.prefix[at.step], np.int64)  # (R,)
        return one_candidate(rows.full, tokens, k)
    if at.end_id >= 0:  # the end of sentence at the last step, scored 0 (transformers')
        assert rows.full is not None
        zero = np.zeros_like(rows.full)
        return one_candidate(zero, np.full(len(rows.ids), at.end_id, np.int64), k)
    seen_log_probs = np.zeros(0, np.float32)
    if rows.full is not None and len(at.seen[0]):
        seen_log_probs = rows.full[at.seen]
    values = penalize(rows.values, rows.ids, at.seen, seen_log_probs, controls.repetition_penalty)
    values, ids = reorder(mask(values, rows.ids, at.blocked), rows.ids)
    if controls.greedy_slots(at.step):
        return one_candidate(values, ids[:, 0], k, column=0)
    return values[:, :k], ids[:, :k]


def sampled_candidates(
    rows: SlotRows, at: SlotControls, k: int, draws: np.ndarray, live: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The live slots' samples as their only candidates, drawn by their uniform draws (R,) from
    the step's top k (`samples_from_top`) or from their whole rows, blocked tokens dropped and
    seen ones penalized first; dead slots (live (R,) False) get none."""
    values = np.full((len(draws), k), NEG_INF, np.float32)  # (R, k)
    ids = np.zeros((len(draws), k), np.int64)  # (R, k)
    pick = np.flatnonzero(live)
    if not len(pick):
        return values, ids
    seen = _pairs_of(at.seen, pick)
    blocked = _pairs_of(at.blocked, pick)
    if at.samples_from_top:
        scores, tokens = reorder(mask(rows.values[pick], rows.ids[pick], blocked), rows.ids[pick])
        scores, tokens = (
            scores[:, : at.controls.sampling_topk],
            tokens[:, : at.controls.sampling_topk],
        )
        chosen = sample(scores, at.controls, draws[pick])  # (P,) columns
        values[pick, 0] = scores[np.arange(len(pick)), chosen]
        ids[pick, 0] = tokens[np.arange(len(pick)), chosen]
        return values, ids
    assert rows.full is not None
    full = rows.full[pick]  # (P, V)
    vocab = np.broadcast_to(np.arange(full.shape[1]), full.shape)  # (P, V)
    seen_log_probs = full[seen] if len(seen[0]) else np.zeros(0, np.float32)
    scores = penalize(full, vocab, seen, seen_log_probs, at.controls.repetition_penalty)
    scores = mask(scores, vocab, blocked)  # (P, V)
    chosen = sample(scores, at.controls, draws[pick])  # (P,) token ids
    values[pick, 0] = scores[np.arange(len(pick)), chosen]
    ids[pick, 0] = chosen
    return values, ids


def _pairs_of(pairs: Pairs, pick: np.ndarray) -> Pairs:
    """The pairs of the slots `pick` (P,), renumbered 0..P-1."""
    rows, tokens = pairs
    where = np.full(int(max(rows.max(initial=-1), pick.max(initial=-1))) + 1, -1, np.int64)
    where[pick] = np.arange(len(pick))
    new = where[rows] if len(rows) else rows
    keep = new >= 0
    return new[keep], tokens[keep]
