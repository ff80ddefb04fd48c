"""Lexically constrained beam search: target token sequences (a glossary's terms) every finished
hypothesis of a sentence contains, by dynamic beam allocation (Post & Vilar, 2018) as fairseq's
`LexicallyConstrainedBeamSearch` does it (Hu et al., 2019).

Each hypothesis carries a small state: the constraints it has met, and how far it is into the one
it is spelling. At each step (service/decode/search/beam.py):
- its candidates are the step's top k and the tokens that advance a constraint (the next token of
  the one it is spelling, the first token of each one not met), at the model's own log-probability;
- the end of sentence is forbidden until every constraint is met, and a piece that would go on
  with the word of a term just completed is forbidden right after it;
- the sentence's candidates are ranked by score inside banks of "constraint tokens met", and the
  beam takes the best of each bank in turn, the fullest bank first (`bank_order`): a hypothesis
  that has met more is never crowded out by better-scored ones that have met less.

Abandoning a constraint half-spelled loses its progress (fairseq's rule). States are small tuples,
advanced one slot at a time (memoized per sentence); what a step needs of them is gathered into a
`SlotTable` of arrays, one row per constrained slot of the batch, so the candidates of every
constrained sentence are extended and ordered at once. Every state is its sentence's own: an answer
does not depend on the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# (bitmask of the constraints met, the one being spelled: -1 none, JUST_MET one was completed by
# the last token, its tokens spelled so far)
State = tuple[int, int, int]
START: State = (0, -1, 0)
JUST_MET = -2


@dataclass(frozen=True)
class SlotInfo:
    """What a step needs of one state."""

    base: int  # constraint tokens met, not counting a half-spelled one (what abandoning leaves)
    spelled: int  # tokens of the one being spelled
    next_token: int  # its next token, -1 for none
    starters: tuple[int, ...]  # the first token of each constraint not met
    complete: bool
    just_met: bool


@dataclass(frozen=True)
class Constraints:
    """One sentence's constraints: token sequences, each to appear in every finished hypothesis."""

    sequences: tuple[tuple[int, ...], ...]
    _infos: dict[State, SlotInfo] = field(default_factory=dict, compare=False, repr=False)
    _moves: dict[tuple[State, int], State] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if any(not seq for seq in self.sequences):
            raise ValueError("a constraint needs at least one token")
        if len(self.sequences) > 63:
            raise ValueError(f"at most 63 constraints a sentence, got {len(self.sequences)}")

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def total(self) -> int:
        """Tokens of all constraints: the banks are 0..total."""
        return sum(len(seq) for seq in self.sequences)

    def complete(self, state: State) -> bool:
        return state[0] == (1 << len(self.sequences)) - 1

    def advance(self, state: State, token: int) -> State:
        """The state after appending `token` (memoized: a sentence meets few states)."""
        found = self._moves.get((state, token))
        if found is None:
            found = self._advance(state, token)
            self._moves[(state, token)] = found
        return found

    def _advance(self, state: State, token: int) -> State:
        met, current, spelled = state
        if current >= 0 and self.sequences[current][spelled] == token:
            if spelled + 1 == len(self.sequences[current]):
                return met | 1 << current, JUST_MET, 0
            return met, current, spelled + 1
        for c, seq in enumerate(self.sequences):  # abandoned (or none): maybe another starts
            if not met >> c & 1 and seq[0] == token:
                return (met | 1 << c, JUST_MET, 0) if len(seq) == 1 else (met, c, 1)
        return met, -1, 0

    def info(self, state: State) -> SlotInfo:
        found = self._infos.get(state)
        if found is None:
            met, current, spelled = state
            unmet = [c for c in range(len(self.sequences)) if not met >> c & 1]
            found = SlotInfo(
                base=self.total - sum(len(self.sequences[c]) for c in unmet),
                spelled=spelled if current >= 0 else 0,
                next_token=self.sequences[current][spelled] if current >= 0 else -1,
                # the first token of each constraint not met, but the one being spelled (starting
                # it again would be no progress)
                starters=tuple(dict.fromkeys(self.sequences[c][0] for c in unmet if c != current)),
                complete=not unmet,
                just_met=current == JUST_MET,
            )
            self._infos[state] = found
        return found

    def met_tokens(self, state: State) -> int:
        """The bank of a state: tokens of the constraints met, and of the one being spelled."""
        info = self.info(state)
        return info.base + info.spelled


@dataclass(frozen=True)
class SlotTable:
    """The states of R constrained slots (rows), as arrays."""

    base: np.ndarray  # (R,) int64
    spelled: np.ndarray  # (R,) int64
    next_token: np.ndarray  # (R,) int64, -1 for none
    starters: np.ndarray  # (R, C) int64, -1 padding
    complete: np.ndarray  # (R,) bool
    just_met: np.ndarray  # (R,) bool

    @classmethod
    def of(cls, slots: Sequence[tuple[Constraints, State]]) -> SlotTable:
        infos = [c.info(s) for c, s in slots]
        C = max((len(i.starters) for i in infos), default=0)
        starters = np.full((len(infos), C), -1, np.int64)  # (R, C)
        for r, info in enumerate(infos):
            starters[r, : len(info.starters)] = info.starters
        return cls(
            base=np.array([i.base for i in infos], np.int64),
            spelled=np.array([i.spelled for i in infos], np.int64),
            next_token=np.array([i.next_token for i in infos], np.int64),
            starters=starters,
            complete=np.array([i.complete for i in infos], bool),
            just_met=np.array([i.just_met for i in infos], bool),
        )

    def banks(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The bank of each candidate: rows (B, M) its slot's row here, tokens (B, M) its token."""
        continues = tokens == self.next_token[rows]  # (B, M)
        starts = (self.starters[rows] == tokens[..., None]).any(axis=-1)  # (B, M)
        step = np.where(continues, self.spelled[rows] + 1, starts.astype(np.int64))
        return self.base[rows] + step  # (B, M)

    def forced(
        self, values: np.ndarray, ids: np.ndarray, full: np.ndarray, eos_id: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The tokens that advance each slot and are not among its live candidates yet (values
        (R, k), ids (R, k)), at the model's log-probability from its whole row full (R, V): extra
        columns values (R, F), ids (R, F), -inf where a slot has fewer. A term is forced even
        where a control (suppress, n-gram blocking) drops it."""
        tokens = np.concatenate([self.next_token[:, None], self.starters], axis=1)  # (R, F)
        F = tokens.shape[1]
        live = np.isfinite(values)  # (R, k)
        have = ((tokens[:, :, None] == ids[:, None, :]) & live[:, None, :]).any(axis=2)  # (R, F)
        earlier = np.triu(np.ones((F, F), bool), 1)  # earlier[i, j]: column i before j
        repeated = ((tokens[:, :, None] == tokens[:, None, :]) & earlier[None]).any(axis=1)
        keep = (tokens >= 0) & (tokens != eos_id) & ~have & ~repeated  # (R, F)
        picked = np.take_along_axis(full, np.maximum(tokens, 0), axis=1)  # (R, F)
        return np.where(keep, picked, -np.inf).astype(np.float32), np.maximum(tokens, 0)


def bank_order(banks: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The order of sentences' candidates (B, M), given best first with their banks (B, M) and
    whether each is live (B, M): the best of every bank, fullest bank first, then the second of
    every bank, and so on; dead candidates last, in their order."""
    B, M = banks.shape
    if not M:
        return np.zeros((B, 0), np.int64)
    top = int(banks.max()) + 1
    one_hot = banks[..., None] == np.arange(top)  # (B, M, top)
    rank = np.take_along_axis(np.cumsum(one_hot, axis=1), banks[..., None], axis=2)[..., 0] - 1
    key = np.where(live, rank * top + (top - 1 - banks), np.iinfo(np.int64).max)  # (B, M)
    return np.argsort(key, axis=1, kind="stable")
