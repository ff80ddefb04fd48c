"""A sentence of the host's beam search: its slots' beams (`Beams`), the history its steps leave
(`StepRecord`, `History`), and its finished hypotheses and stopping rules (`Finished`,
`SentenceBeam`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from service.decode.shared.constraints import Constraints, State
from service.decode.shared.controls import NO_CONTROLS, Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import (
    cannot_improve,
    coverage_penalty,
    heuristic_ends,
    kept_finished,
    normalized_score,
)
from service.decode.shared.search_types import Hypothesis


@dataclass(frozen=True)
class Beams:
    """Per-hypothesis state of the running batch, one row per slot (row n = b*K + j)."""

    tokens: np.ndarray  # (N,) int64 last token of each hypothesis, fed to the next step
    parents: np.ndarray  # (N,) int64 decoder state-buffer row each hypothesis continues
    scores: np.ndarray  # (N,) float64 cumulative score ranked by; -inf marks a dead slot
    coverage: np.ndarray  # (N, S) float32 attention summed over the steps so far
    raw: np.ndarray  # (N,) float64 cumulative log-prob under the model (= scores without controls)
    # (N, L) int64 tokens so far, right-aligned (a sentence's last `steps` columns); kept only
    # while a sentence with controls (which read them) is in the batch: L = 0 otherwise, and the
    # rows of sentences without controls are never read
    seqs: np.ndarray

    @classmethod
    def empty(cls) -> Beams:
        return cls(
            tokens=np.zeros(0, np.int64),  # (0,)
            parents=np.zeros(0, np.int64),  # (0,)
            scores=np.zeros(0, np.float64),  # (0,)
            coverage=np.zeros((0, 0), np.float32),  # (0, 0)
            raw=np.zeros(0, np.float64),  # (0,)
            seqs=np.zeros((0, 0), np.int64),  # (0, 0)
        )

    @classmethod
    def start(cls, K: int, bos_id: int, state_row: int, S: int, live: int = 1) -> Beams:
        """K slots of a joining sentence: the first `live` slots at score 0, the others dead."""
        scores = np.full(K, -np.inf)  # (K,)
        scores[:live] = 0.0
        return cls(
            tokens=np.full(K, bos_id, np.int64),  # (K,)
            parents=np.full(K, state_row, np.int64),  # (K,)
            scores=scores,
            coverage=np.zeros((K, S), np.float32),  # (K, S)
            raw=scores.copy(),
            seqs=np.zeros((K, 0), np.int64),  # (K, 0)
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, rows: np.ndarray) -> Beams:
        """The rows (N',) int64 of every field, in that order."""
        return Beams(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    @classmethod
    def join(cls, parts: Sequence[Beams]) -> Beams:
        """The rows of several parts, in order (coverage padded to the widest source)."""
        if len(parts) == 1:
            return parts[0]
        S = max(p.coverage.shape[1] for p in parts)
        L = max(p.seqs.shape[1] for p in parts)
        return cls(
            tokens=np.concatenate([p.tokens for p in parts]),
            parents=np.concatenate([p.parents for p in parts]),
            scores=np.concatenate([p.scores for p in parts]),
            coverage=np.concatenate([fit_columns(p.coverage, S) for p in parts]),
            raw=np.concatenate([p.raw for p in parts]),
            seqs=np.concatenate([left_pad(p.seqs, L) for p in parts]),
        )


def left_pad(seqs: np.ndarray, L: int) -> np.ndarray:
    """seqs (N, L') right-aligned, padded on the left with -1 or cut on the left to (N, L)."""
    N, L_old = seqs.shape
    if L_old >= L:
        return seqs[:, L_old - L :]
    return np.concatenate([np.full((N, L - L_old), -1, np.int64), seqs], axis=1)  # (N, L)


def fit_columns(matrix: np.ndarray, S: int) -> np.ndarray:
    """matrix (N, S') padded with zeros or cut to (N, S); cut columns are padding, hence 0."""
    N, S_old = matrix.shape
    if S_old >= S:
        return matrix[:, :S]
    return np.concatenate([matrix, np.zeros((N, S - S_old), matrix.dtype)], axis=1)  # (N, S)


@dataclass(frozen=True)
class StepRecord:
    """One step of the whole running batch, for back-tracing; each sentence's history holds it with
    the sentence's row (one record a step for the batch, not three arrays a sentence)."""

    parents: np.ndarray  # (B, K) int64 slot of the previous beam each new slot continues
    tokens: np.ndarray  # (B, K) int64 token each new slot appended
    log_probs: np.ndarray  # (B, K) float32 the model's log-prob of each new slot's token


class History:
    """Back-pointers, tokens and (when asked for) attention of one sentence, one record per step.

    History is kept per sentence rather than per batch step: sentences join and leave at different
    steps, and per sentence a join is a new empty history, a leave drops it, and back-pointers are
    slots 0..K-1 whatever rows the sentence occupies in the running batch. Each entry is the batch's
    record of that step (shared by every sentence then running), the sentence's row in it, and the
    sentence's own attention rows (K, src_len) of that step when it keeps attention.
    """

    def __init__(self, src_len: int, keep_attention: bool) -> None:
        self.src_len = src_len
        self.keep_attention = keep_attention
        self._records: list[tuple[StepRecord, int, np.ndarray | None]] = []

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: StepRecord, row: int, attention: np.ndarray | None) -> None:
        self._records.append((record, row, attention))

    def backtrace(self, slot: int, steps: int) -> tuple[list[int], np.ndarray | None, np.ndarray]:
        """Tokens, attention rows (steps, src_len) and token log-probs (steps,) of the hypothesis
        in `slot` after `steps` steps.

        Step t's record holds the new slots' parents and tokens, and the attention of the previous
        beam's slots: the row that produced a slot's token is the one of its parent.
        """
        attention = np.zeros((steps, self.src_len), np.float32) if self.keep_attention else None
        if not steps:  # ended at its first step
            return [], attention, np.zeros(0, np.float32)
        records = self._records[:steps]
        parents = np.array([r.parents[row] for r, row, _ in records], np.int64)  # (steps, K)
        slots = np.zeros(steps, np.int64)  # (steps,)
        trace_slots(parents, slot, slots)
        at = np.arange(steps)
        tokens = np.array([r.tokens[row] for r, row, _ in records], np.int64)[at, slots]
        log_probs = np.array([r.log_probs[row] for r, row, _ in records], np.float32)[at, slots]
        if attention is not None:  # (steps, src_len)
            for t, (_, _, rows) in enumerate(records):
                if rows is not None:
                    attention[t] = rows[parents[t, slots[t]]]
        return tokens.tolist(), attention, log_probs

    def settled(self, ends: Sequence[tuple[int, int]]) -> Hypothesis:
        """The prefix the hypotheses (slot, steps) in `ends` share (search.Search.settled):
        their tokens traced alone, the first one's log-probs and attention rows cut to it."""
        slot, steps = ends[0]
        records = self._records[: max(n for _, n in ends)]
        parents = np.array([r.parents[row] for r, row, _ in records], np.int64)  # (T, K)
        tokens = np.array([r.tokens[row] for r, row, _ in records], np.int64)  # (T, K)
        n = steps
        first = np.zeros(steps, np.int64)
        trace_slots(parents[:steps], slot, first)
        path = tokens[np.arange(steps), first]
        for other_slot, other_steps in ends[1:]:
            n = min(n, other_steps)
            slots = np.zeros(other_steps, np.int64)
            trace_slots(parents[:other_steps], other_slot, slots)
            differ = path[:n] != tokens[np.arange(n), slots[:n]]
            n = int(np.argmax(differ)) if differ.any() else n
        shared, attention, log_probs = self.backtrace(slot, steps)
        rows = None if attention is None else attention[:n]
        total = float(np.sum(log_probs[:n], dtype=np.float64))
        return Hypothesis(shared[:n], total, total, rows, False, log_probs[:n])


@dataclass(frozen=True)
class Finished:
    """A finished hypothesis before back-tracing: `slot` after `prefix_steps` steps (+ EOS)."""

    score: float
    log_prob: float
    slot: int
    prefix_steps: int
    by_eos: bool
    # every constraint met (a glossary's: service/decode/shared/constraints.py)
    complete: bool = True


@dataclass
class SentenceBeam:
    """One sentence of the running batch: its options, controls, history and best finished
    hypotheses."""

    id: Hashable
    options: SearchOptions
    max_len: int
    history: History
    controls: Controls = NO_CONTROLS
    rng: np.random.Generator | None = None  # sampling: the sentence's own stream
    constraints: Constraints | None = None  # lexical constraints (a glossary's terms)
    # the controls the step's candidates go through (service/decode/shared/controls.py), its group's key
    # (whatever the seed; constraints are the search's own: _constrain); None: none act
    group: Controls | None = None
    states: list[State] = field(default_factory=list)  # (K,) each slot's constraint state
    finished: list[Finished] = field(default_factory=list)  # best first, at most `keep`
    ended: int = 0  # hypotheses finished so far, kept or not (the patience rule counts them)
    # ends the constraints refused: a slot's best next token was the end of sentence before it
    # met every constraint (the patience rule counts them too: the search has seen that many ends)
    refused: int = 0
    top_ended: bool = False  # a step's best-ranked candidate was EOS (the "first" rule)
    reads_history: bool = False  # its controls read its tokens so far (Controls.reads_history)

    @property
    def steps(self) -> int:
        return len(self.history)

    @property
    def width(self) -> int:
        """The slots the sentence uses: its beam (narrowed by the hypotheses ended, under the
        "narrowing" rule), or its samples."""
        if self.controls.sampling:
            return self.options.n_best
        if self.options.stopping == "narrowing":
            return max(0, self.options.beam_size - self.ended)
        return self.options.beam_size

    @property
    def wanted(self) -> int:
        """The finished hypotheses it keeps: its n-best (its beam under the heuristic rule,
        rules.kept_finished), or every alternative."""
        return self.options.beam_size if self.controls.alternatives else kept_finished(self.options)

    def finish(
        self,
        slots: np.ndarray,
        scores: np.ndarray,
        log_probs: np.ndarray,
        coverage: np.ndarray,
        by_eos: bool,
    ) -> None:
        """Score the hypotheses in slots (M,) with their cumulative scores (M,), model log-probs
        (M,) and coverage (M, src_len). Hypotheses that met their constraints rank first (only a
        sentence cut at its maximum length can finish one that did not)."""
        prefix_steps = self.steps - 1 if by_eos else self.steps
        opts = self.options
        new = [
            Finished(
                score=normalized_score(float(score), self.steps, opts)
                + coverage_penalty(cov, opts.coverage_penalty),
                log_prob=float(log_prob),
                slot=int(slot),
                prefix_steps=prefix_steps,
                by_eos=by_eos,
                complete=by_eos or self.met(int(slot)),
            )
            for slot, score, log_prob, cov in zip(slots, scores, log_probs, coverage, strict=True)
        ]
        self.ended += len(new)
        ranked = sorted(self.finished + new, key=lambda f: (not f.complete, -f.score))
        self.finished = ranked[: self.wanted]

    def met(self, slot: int) -> bool:
        """Whether the hypothesis in `slot` has met every constraint (True without any)."""
        return self.constraints is None or self.constraints.complete(self.states[slot])

    @property
    def constrained(self) -> bool:
        """Constraints act at this step: the sentence has some, and its prefix is spelled."""
        return self.constraints is not None and self.steps >= len(self.controls.prefix)

    def done(self, best_live: float) -> bool:
        """Whether the search of this sentence stops now (before its maximum length), by its
        stopping rule: "exact" (nothing live can win), "first" (its best-ranked candidate ended
        at some step) or "patience" (beam_size x patience hypotheses ended)."""
        if best_live == -math.inf:
            return True
        if self.controls.independent or len(self.finished) < self.wanted:
            return False
        rule = self.options.stopping
        if rule == "first":
            return self.top_ended
        if rule == "patience":
            ended = self.ended + self.refused
            return ended >= math.ceil(self.options.beam_size * self.options.patience)
        if rule == "narrowing":
            return self.width == 0
        if rule == "heuristic":
            return heuristic_ends(best_live, self.steps, self.finished[-1].score, self.options)
        return self.cannot_improve(best_live)

    def cannot_improve(self, best_live: float) -> bool:
        """True when n_best hypotheses are finished and no live one can beat the worst of them
        (rules.cannot_improve)."""
        if len(self.finished) < self.wanted:
            return False
        worst = self.finished[-1].score
        return cannot_improve(best_live, self.steps, worst, self.max_len, self.options)

    def n_best(self) -> list[Hypothesis]:
        """The finished hypotheses it returns, best first, back-traced."""
        count = self.wanted if self.controls.alternatives else self.options.n_best
        return [self._hypothesis(f) for f in self.finished[:count]]

    def _hypothesis(self, f: Finished) -> Hypothesis:
        tokens, attention, log_probs = self.history.backtrace(f.slot, f.prefix_steps)
        return Hypothesis(
            tokens=tokens,
            score=f.score,
            log_prob=f.log_prob,
            attention=attention,
            finished_by_eos=f.by_eos,
            token_log_probs=log_probs,
        )


def settled_prefixes(
    sentences: Sequence[SentenceBeam],
    scores: np.ndarray,
    K: int,
    sentence_ids: Collection[Hashable],
) -> dict[Hashable, Hypothesis]:
    """The settled prefix (search.Search.settled) of each of these sentences that has stepped:
    what its live slots (scores (N,) above -inf) and its kept finished hypotheses share."""
    out: dict[Hashable, Hypothesis] = {}
    for b, sentence in enumerate(sentences[: len(scores) // K]):  # (those joined since: no rows)
        if sentence.id not in sentence_ids or not sentence.steps:
            continue
        live = np.flatnonzero(np.isfinite(scores[b * K : (b + 1) * K]))
        ends = [(int(j), sentence.steps) for j in live]
        ends += [(f.slot, f.prefix_steps) for f in sentence.finished]
        if ends:
            out[sentence.id] = sentence.history.settled(ends)
    return out


def trace_slots(parents: np.ndarray, slot: int, out: np.ndarray) -> None:
    """One hypothesis's slot at each step into out (T,) int64, from its sentence's back-pointers
    (T, K) (each new slot's parent slot, step by step) and its slot at the last step: an index a
    step, a Python loop over the arrays' memory (both searches back-trace with it)."""
    T, K = parents.shape
    back = np.ascontiguousarray(parents, np.int64).reshape(-1).data  # a memoryview of its int64s
    into = out.data
    for t in range(T - 1, -1, -1):
        into[t] = slot
        slot = back[t * K + slot]
