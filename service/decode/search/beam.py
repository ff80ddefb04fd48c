"""Batched beam search over a decoder step, pure numpy.

The search drives a *running batch*: B sentences with exactly K hypothesis slots each, laid out
sentence-major (row n = b*K + j). Each step sends the decoder the previous token of every slot and
the back-pointers (`reorder`), gets back the top-k next tokens per slot with this step's attention,
and picks each sentence's next beam. Sentences join (`add`) between steps and leave as soon as
they are done, so the batch grows and shrinks while it runs; `beam_search` wraps this for a static
batch.

Scoring follows GNMT (Wu et al., 2016) with Marian's normalization and word penalty: the rules are
service/decode/shared/rules.py's, which the device search shares. The coverage sums the attention of every
step, the EOS step included. Live hypotheses compete by log P alone, which keeps the search standard:
the EOS candidates among a sentence's top `beam_size` candidates finish, the `beam_size` best
non-EOS candidates continue, and asking the decoder for k = K + 1 tokens per slot guarantees
enough non-EOS candidates even when every slot's best token is EOS.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, fields, replace
from typing import cast

import numpy as np

from service.decode.search.beam_sentences import (
    Beams,
    History,
    SentenceBeam,
    StepRecord,
    fit_columns,
    left_pad,
    settled_prefixes,
)
from service.decode.shared import controls as ctl
from service.decode.shared.constraints import START, Constraints, SlotTable, bank_order
from service.decode.shared.controls import NO_CONTROLS, Controls, unusable_controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import (
    max_length,
)
from service.decode.shared.search_types import (
    Decoder,
    Hypothesis,
    RowsDecoder,
    StepOutput,
)


@dataclass(frozen=True)
class _Candidates:
    """Each sentence's K*k candidates, best first."""

    scores: np.ndarray  # (B, K*k) float64 cumulative score
    raw: np.ndarray  # (B, K*k) float64 cumulative log-prob under the model
    step_raw: np.ndarray  # (B, K*k) float32 the model's log-prob of the candidate's token
    tokens: np.ndarray  # (B, K*k) int64
    slots: np.ndarray  # (B, K*k) int64 slot (0..K-1) of the hypothesis each candidate extends


def _rank_candidates(
    beams: Beams, out: StepOutput, step_raw: np.ndarray, B: int, K: int
) -> _Candidates:
    """Every slot's top-k extensions, grouped per sentence and sorted by cumulative score.
    step_raw (N, k): the model's log-prob of each candidate token (out.log_probs without
    controls)."""
    _, k = out.log_probs.shape  # (N, k)
    scores = (beams.scores[:, None] + out.log_probs).reshape(B, K * k)  # (B, K*k) float64
    order = np.argsort(-scores, axis=1, kind="stable")  # (B, K*k) best first
    rows = np.arange(B)[
        :, None
    ]  # (B, 1): indexing along axis 1 (take_along_axis, without its overhead)
    step_raw = step_raw.reshape(B, K * k)[rows, order]  # (B, K*k)
    slots = order // k  # (B, K*k)
    return _Candidates(
        scores=scores[rows, order],
        raw=beams.raw.reshape(B, K)[rows, slots] + step_raw,
        step_raw=step_raw,
        tokens=out.token_ids.reshape(B, K * k)[rows, order],
        slots=slots,
    )


def _eos_choices(cands: _Candidates, widths: np.ndarray, eos_id: int) -> np.ndarray:
    """(B, K*k) bool: EOS candidates among each sentence's top `width` candidates."""
    _, M = cands.tokens.shape  # (B, K*k)
    rank = np.arange(M)  # (M,)
    top = rank[None, :] < widths[:, None]  # (B, M)
    return (cands.tokens == eos_id) & np.isfinite(cands.scores) & top


@dataclass(frozen=True)
class _NextBeam:
    """Each sentence's next K slots."""

    slots: np.ndarray  # (B, K) int64 slot of the previous beam each new slot continues
    tokens: np.ndarray  # (B, K) int64
    scores: np.ndarray  # (B, K) float64, -inf for dead slots
    raw: np.ndarray  # (B, K) float64 cumulative model log-prob, -inf for dead slots
    step_raw: np.ndarray  # (B, K) float32 the model's log-prob of each slot's new token


def _continuations(
    cands: _Candidates, widths: np.ndarray, eos_id: int, K: int, within_top: bool = False
) -> _NextBeam:
    """The `width` best non-EOS candidates of each sentence in slots 0..width-1; other slots dead.

    within_top: only the non-EOS candidates among the top `width` continue (the beam narrows by
    the EOS candidates that finished), the rule of OpenNMT-py's and Joey NMT's beam search."""
    is_eos = cands.tokens == eos_id  # (B, M)
    if within_top:
        rank = np.arange(is_eos.shape[1])[None, :]  # (1, M)
        wanted = ~is_eos & (rank < widths[:, None]) & np.isfinite(cands.scores)  # (B, M)
    else:
        non_eos_rank = np.cumsum(~is_eos, axis=1) - 1  # (B, M)
        wanted = ~is_eos & (non_eos_rank < widths[:, None])  # (B, M)
    picks = np.argsort(~wanted, axis=1, kind="stable")[:, :K]  # (B, K) wanted first, best first
    rows = np.arange(len(picks))[:, None]  # (B, 1)
    scores = cands.scores[rows, picks]  # (B, K)
    live = wanted[rows, picks] & np.isfinite(scores)  # (B, K)
    return _NextBeam(
        slots=cands.slots[rows, picks],
        tokens=cands.tokens[rows, picks],
        scores=np.where(live, scores, -np.inf),
        raw=np.where(live, cands.raw[rows, picks], -np.inf),
        step_raw=cands.step_raw[rows, picks],
    )


def _check_step_output(out: StepOutput, N: int, k: int) -> None:
    """Raise ValueError when the decoder's output does not fit N hypotheses and top-k."""
    if (
        out.log_probs.ndim != 2
        or out.log_probs.shape[0] != N
        or not 1 <= out.log_probs.shape[1] <= k
    ):
        raise ValueError(f"decoder log_probs must be ({N}, <= {k}), got {out.log_probs.shape}")
    if out.token_ids.shape != out.log_probs.shape:
        raise ValueError(
            f"decoder token_ids {out.token_ids.shape} != log_probs {out.log_probs.shape}"
        )
    if out.attention.ndim != 2 or out.attention.shape[0] != N:
        raise ValueError(f"decoder attention must be ({N}, S), got {out.attention.shape}")


def bank_ordered(
    cands: _Candidates, constrained: list[int], table: SlotTable, K: int
) -> _Candidates:
    """The constrained sentences' candidates in dynamic beam allocation's order (by banks of
    constraint tokens met: `bank_order`); the others' by score, as ranked."""
    bs = np.asarray(constrained)  # (Bc,)
    slots = cands.slots[bs]  # (Bc, M)
    banks = table.banks(np.arange(len(bs))[:, None] * K + slots, cands.tokens[bs])
    order = bank_order(banks, np.isfinite(cands.scores[bs]))  # (Bc, M)
    reordered = {}
    for f in fields(cands):
        values = getattr(cands, f.name).copy()
        values[bs] = np.take_along_axis(values[bs], order, axis=1)
        reordered[f.name] = values
    return _Candidates(**reordered)


def model_log_probs(rows: ctl.SlotRows, ids: np.ndarray) -> np.ndarray:
    """The model's log-prob of each candidate ids (K, k): from the whole rows where read, else
    from the step's top k (a candidate is always one of them there)."""
    if rows.full is not None:
        return np.take_along_axis(rows.full, ids, axis=1)
    same = ids[:, :, None] == rows.ids[:, None, :]  # (K, k, m)
    values = np.take_along_axis(rows.values, same.argmax(axis=2), axis=1)  # (K, k)
    return np.where(same.any(axis=2), values, -np.inf).astype(np.float32)


class BeamSearch:
    """Beam search state of a running batch with K slots per sentence over one Decoder.

    Order of calls: `add` joining sentences (their initial decoder states already appended to the
    state buffer at `state_row`), then `step`; finished sentences are returned by `step` and
    dropped from the batch (and from the decoder through `keep_sentences`) before it returns.
    Sentences with active controls (service/decode/shared/controls.py) need a `RowsDecoder`: while one is
    in the batch, each step reads every token's log-prob and their candidates come from it; the
    others' still come from the step's own top-k, so an answer does not depend on its neighbours.
    """

    def __init__(
        self,
        decoder: Decoder,
        beam_size: int,
        bos_id: int,
        eos_id: int,
        vocab_size: int | None = None,
        narrow_on_eos: bool = False,
        continues_word: np.ndarray | None = None,
    ) -> None:
        """narrow_on_eos: continue only the non-EOS candidates among the top beam_size (the beam
        rule of the toolkits imported models come from; see _continuations). continues_word (V,)
        bool: the target tokens that go on with the word before them (subword pieces without a
        word start), which may not follow a glossary term (no "Logos" + "ulsed")."""
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if vocab_size is not None and vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self._decoder = decoder
        self._beam_size = beam_size
        # tokens asked of the decoder per slot: K + 1 leaves K non-EOS ones even if one is EOS
        self._candidates = beam_size + 1 if vocab_size is None else min(beam_size + 1, vocab_size)
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._vocab_size = vocab_size
        self._narrow_on_eos = narrow_on_eos
        self._continues_word = continues_word
        self._table: tuple[list[int], SlotTable] | None = None  # this step's constrained slots
        self._beams = Beams.empty()
        self._joining: list[Beams] = []  # slots of sentences added since the last step
        self._sentences: list[SentenceBeam] = []
        self._ids: set[Hashable] = set()
        # per sentence, in batch order, as arrays: a step reads them without a loop over B
        self._steps = np.zeros(0, np.int64)  # (B,) steps decoded
        self._max_len = np.zeros(0, np.int64)  # (B,) the sentence's maximum length
        self._widths = np.zeros(0, np.int64)  # (B,) slots in use (SentenceBeam.width)
        self._kept = np.zeros(0, np.int64)  # (B,) finished hypotheses held (len(finished))
        self._wanted = np.zeros(0, np.int64)  # (B,) hypotheses wanted (SentenceBeam.wanted)
        self._controlled = 0  # sentences with active controls
        # sentences whose controls read their tokens so far: `Beams.seqs` is kept while any is
        # in the batch (force_eos alone reads none)
        self._reading = 0
        self._constrained = 0  # sentences with constraints (a glossary's terms)
        # sentences whose own controls raised at this step (by batch index), and those failed
        # since `take_failed` was last asked: they leave the batch, which goes on without them
        self._failing: dict[int, Exception] = {}
        self._failed: list[tuple[Hashable, Exception]] = []

    @property
    def beam_size(self) -> int:
        return self._beam_size

    @property
    def sentence_ids(self) -> list[Hashable]:
        """The ids of the sentences still decoding, in batch order."""
        return [s.id for s in self._sentences]

    def __len__(self) -> int:
        return len(self._sentences)

    @property
    def is_empty(self) -> bool:
        return not self._sentences

    def add(
        self,
        sentence_id: Hashable,
        src_len: int,
        options: SearchOptions,
        state_row: int,
        controls: Controls = NO_CONTROLS,
    ) -> None:
        """A sentence joins at the end of the batch; its initial state is decoder buffer row state_row.

        options.beam_size may be below the batch's K: the extra slots stay dead.
        """
        if options.beam_size > self._beam_size:
            raise ValueError(
                f"sentence beam_size {options.beam_size} exceeds the batch's beam size {self._beam_size}"
            )
        if src_len < 1:
            raise ValueError(f"src_len must be >= 1, got {src_len}")
        if state_row < 0:
            raise ValueError(f"state_row must be >= 0, got {state_row}")
        if sentence_id in self._ids:
            raise ValueError(f"sentence {sentence_id!r} is already decoding")
        if controls.active and not hasattr(self._decoder, "step_rows"):
            raise ValueError("decoding controls need a decoder with step_rows")
        problem = unusable_controls(controls, self._vocab_size) if self._vocab_size else None
        if problem:
            raise ValueError(f"sentence {sentence_id!r}: {problem}")
        self._ids.add(sentence_id)
        constraints = Constraints(controls.constraints) if controls.constraints else None
        forced = constraints.total if constraints else 0  # room for the constraints' tokens
        sentence = SentenceBeam(
            id=sentence_id,
            options=options,
            max_len=max_length(options, src_len, len(controls.prefix), forced),
            history=History(src_len, keep_attention=options.return_attention),
            controls=controls,
            rng=np.random.default_rng(controls.seed or None) if controls.sampling else None,
            constraints=constraints,
            states=[START] * self._beam_size if constraints else [],
            group=group if (group := replace(controls, seed=0, constraints=())).active else None,
            reads_history=controls.reads_history,
        )
        self._sentences.append(sentence)
        self._steps = np.append(self._steps, 0)
        self._max_len = np.append(self._max_len, sentence.max_len)
        self._widths = np.append(self._widths, sentence.width)
        self._kept = np.append(self._kept, 0)
        self._wanted = np.append(self._wanted, sentence.wanted)
        self._controlled += controls.active
        self._reading += sentence.reads_history
        self._constrained += constraints is not None
        live = sentence.width if controls.sampling else 1
        self._joining.append(Beams.start(self._beam_size, self._bos_id, state_row, src_len, live))

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Advance every sentence by one token; return the sentences done now with their n-best lists."""
        if not self._sentences:
            return []
        self._merge_joining()
        B, K = len(self._sentences), self._beam_size
        # one decoder call for every slot of every sentence
        out, step_raw = self._decoder_step()
        N, S = out.attention.shape
        # coverage of each current slot including this step's attention
        coverage = fit_columns(self._beams.coverage, S) + out.attention  # (N, S)
        # rank each sentence's candidates; EOS ones in the top `width` finish, the rest continue
        widths = self._widths  # (B,)
        cands = _rank_candidates(self._beams, out, step_raw, B, K)
        if self._table is not None:
            cands = bank_ordered(cands, *self._table, self._beam_size)
        ends = _eos_choices(cands, widths, self._eos_id)  # (B, K*k)
        nxt = _continuations(cands, widths, self._eos_id, K, self._narrow_on_eos)
        self._advance_states(nxt)
        rows = nxt.slots + K * np.arange(B)[:, None]  # (B, K) rows of this step's output
        self._beams = Beams(
            tokens=nxt.tokens.reshape(N),
            parents=rows.reshape(N),
            scores=nxt.scores.reshape(N),
            coverage=coverage[rows.reshape(N)],
            raw=nxt.raw.reshape(N),
            seqs=(
                np.concatenate(
                    [self._beams.seqs[rows.reshape(N)], nxt.tokens.reshape(N, 1)], axis=1
                )  # (N, L + 1)
                if self._reading
                else np.zeros((N, 0), np.int64)  # (N, 0): no sentence reads them
            ),
        )
        self._record(nxt, out.attention.reshape(B, K, S))
        self._steps += 1
        self._finish_eos(cands, ends, coverage)
        return self._retire(self._settle())

    def _decoder_step(self) -> tuple[StepOutput, np.ndarray]:
        """The decoder's top-k for every slot, and the model's log-prob of each candidate (N, k).
        Controlled sentences' rows hold their candidates instead (service/decode/shared/controls.py):
        the step returns as many more candidates as a slot's controls may drop or lower, and every
        token's log-prob only where a control must read it."""
        beams, k = self._beams, self._candidates
        groups = self._control_groups()
        constrained = (
            [b for b, s in enumerate(self._sentences) if s.constrained] if self._constrained else []
        )
        self._table = None
        if constrained:  # every constrained slot's state, as arrays (one row per slot)
            table = SlotTable.of(
                [
                    (c, state)
                    for b in constrained
                    if (c := self._sentences[b].constraints) is not None
                    for state in self._sentences[b].states
                ]
            )
            self._table = (constrained, table)
        if not groups and not constrained:
            out = self._decoder.step(beams.tokens, beams.parents, k)
            _check_step_output(out, len(beams), k)
            return out, out.log_probs
        k = max([k, *(at.wanted(self._beam_size) for _, at, _ in groups)])
        if self._vocab_size is not None:
            k = min(k, self._vocab_size)
        full = None
        if constrained or any(at.needs_full_rows for _, at, _ in groups):
            out, full = cast(RowsDecoder, self._decoder).step_rows(beams.tokens, beams.parents, k)
        else:
            out = self._decoder.step(beams.tokens, beams.parents, k)
        _check_step_output(out, len(beams), k)
        k = out.log_probs.shape[1]
        log_probs, token_ids = out.log_probs.copy(), out.token_ids.copy()  # (N, k) each
        step_raw = log_probs.copy()  # (N, k)
        K = self._beam_size
        for rows, at, rngs in groups:
            given = ctl.SlotRows(
                out.log_probs[rows], out.token_ids[rows], None if full is None else full[rows]
            )
            try:
                if at.controls.sampling and at.step >= len(at.controls.prefix):
                    # each sentence's K uniform draws from its own generator: its samples do not
                    # depend on the batch
                    draws = np.concatenate([rng.random(K) for rng in rngs])  # (R,)
                    live = np.isfinite(beams.scores[rows])  # (R,)
                    values, ids = ctl.sampled_candidates(given, at, k, draws, live)
                else:
                    values, ids = ctl.candidates(given, at, k)
                model = model_log_probs(given, ids)  # (R, k)
            except Exception as err:  # these sentences' controls: they fail, the batch goes on
                self._fail_rows(rows, err)
                log_probs[rows], step_raw[rows] = -np.inf, -np.inf
                continue
            log_probs[rows], token_ids[rows] = values, ids
            step_raw[rows] = np.where(np.isfinite(values), model, -np.inf)
        if self._table is not None:
            assert full is not None
            own = {int(r) // K: at.wanted(K) for rows, at, _ in groups for r in rows}
            log_probs, token_ids, step_raw = self._constrain(
                *self._table, own, log_probs, token_ids, step_raw, full
            )
        return StepOutput(log_probs, token_ids, out.attention), step_raw

    def _constrain(
        self,
        constrained: list[int],
        table: SlotTable,
        own: dict[int, int],
        log_probs: np.ndarray,
        token_ids: np.ndarray,
        step_raw: np.ndarray,
        full: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The constrained sentences' candidates (service/decode/shared/constraints.py): their own k
        (K + 1, or what their controls ask: more columns asked by the batch's other sentences are
        dropped, so the answer does not depend on them), the end of sentence dropped for a slot
        that has not met every constraint, a piece that would go on with a term's word dropped
        right after it, and the tokens that advance a constraint added as extra columns (N, k + F)
        at the model's log-probability."""
        K = self._beam_size
        rows = (np.asarray(constrained)[:, None] * K + np.arange(K)).reshape(-1)  # (R,)
        k = log_probs.shape[1]
        limit = np.repeat([own.get(b, self._candidates) for b in constrained], K)  # (R,)
        values, ids = log_probs[rows], token_ids[rows]  # (R, k) each
        drop = np.arange(k)[None, :] >= limit[:, None]  # (R, k)
        live = np.isfinite(self._beams.scores[rows])  # (R,)
        refused = (ids[:, 0] == self._eos_id) & live & ~table.complete
        for b, n in zip(constrained, refused.reshape(-1, K).sum(axis=1).tolist(), strict=True):
            self._sentences[b].refused += n
        drop |= (ids == self._eos_id) & ~table.complete[:, None]
        if self._continues_word is not None:
            drop |= self._continues_word[ids] & table.just_met[:, None]
        values = np.where(drop, np.float32(-np.inf), values)
        log_probs[rows] = values
        extra, extra_ids = table.forced(values, ids, full[rows], self._eos_id)  # (R, F) each
        N, F = len(log_probs), extra.shape[1]
        if not F:
            return log_probs, token_ids, step_raw
        more = np.full((N, F), -np.inf, np.float32)  # (N, F)
        more_ids = np.zeros((N, F), np.int64)  # (N, F)
        more[rows], more_ids[rows] = extra, extra_ids
        return (
            np.concatenate([log_probs, more], axis=1),  # (N, k + F)
            np.concatenate([token_ids, more_ids], axis=1),
            np.concatenate([step_raw, more], axis=1),
        )

    def _advance_states(self, nxt: _NextBeam) -> None:
        """Each constrained sentence's slot states after this step's tokens."""
        if not self._constrained:
            return
        for b, sentence in enumerate(self._sentences):
            c = sentence.constraints
            if c is None or b in self._failing:
                continue
            try:
                sentence.states = [
                    c.advance(sentence.states[slot], token)
                    for slot, token in zip(
                        nxt.slots[b].tolist(), nxt.tokens[b].tolist(), strict=True
                    )
                ]
            except Exception as err:  # this sentence's constraints: it fails, not its batch
                self._failing[b] = err

    def _fail_rows(self, rows: np.ndarray, err: Exception) -> None:
        """The sentences of slot rows (R,) fail at this step with err."""
        for b in np.unique(rows // self._beam_size).tolist():
            self._failing.setdefault(b, err)

    def take_failed(self) -> list[tuple[Hashable, Exception]]:
        """The sentences whose own controls raised since the last call, with the error: they
        left the batch without an answer (the others decode on)."""
        failed, self._failed = self._failed, []
        return failed

    def _control_groups(
        self,
    ) -> list[tuple[np.ndarray, ctl.SlotControls, list[np.random.Generator]]]:
        """The controlled sentences' slots, grouped by step and controls (a batch that joined
        together is one group; sampling sentences whatever their seeds), each group's rows (R,),
        its SlotControls, and its sampling sentences' generators, in row order (each draws from
        its own). Groups with nothing to change at this step are left out."""
        if not self._controlled:
            return []
        at_last = self._steps == self._max_len - 1  # (B,) at their last step
        if not self._reading and not at_last.any():
            return []  # force_eos alone: nothing to do before a sentence's last step
        K, L = self._beam_size, self._beams.seqs.shape[1]
        members: dict[tuple[int, ctl.Controls, bool], list[int]] = {}
        for b, sentence in enumerate(self._sentences):
            if sentence.group is None or not (sentence.reads_history or at_last[b]):
                continue
            last = sentence.group.force_eos and bool(at_last[b])
            members.setdefault((sentence.steps, sentence.group, last), []).append(b)
        groups = []
        for (steps, controls, last), bs in members.items():
            rows = (np.asarray(bs)[:, None] * K + np.arange(K)).reshape(-1)  # (R,)
            seqs = self._beams.seqs[rows, L - steps :]  # (R, steps)
            at = ctl.SlotControls.at(controls, seqs, steps, self._eos_id, last)
            if not at.idle:
                rngs = [r for r in (self._sentences[b].rng for b in bs) if r is not None]
                groups.append((rows, at, rngs))
        return groups

    def _record(self, nxt: _NextBeam, attention: np.ndarray) -> None:
        """Append this step to every sentence's history: one record of back-pointers, tokens and
        log-probs for the batch; the attention rows (K, src_len) copied per sentence that asked
        for them (the decoder reuses its buffer, and a sentence keeps only its own columns)."""
        record = StepRecord(nxt.slots, nxt.tokens, nxt.step_raw)
        for b, sentence in enumerate(self._sentences):
            history = sentence.history
            rows = attention[b, :, : history.src_len].copy() if history.keep_attention else None
            history.append(record, b, rows)

    def _finish_eos(self, cands: _Candidates, ends: np.ndarray, coverage: np.ndarray) -> None:
        """Finish the candidates ends (B, K*k) marks, with the coverage (N, S) of their slots."""
        K = self._beam_size
        top_eos = ends[:, 0]  # (B,) the best-ranked candidate ended
        for b in np.flatnonzero(ends.any(axis=1)).tolist():
            sentence = self._sentences[b]
            sentence.top_ended = sentence.top_ended or bool(top_eos[b])
            slots = cands.slots[b, ends[b]]  # (M,)
            eos_coverage = coverage[b * K + slots, : sentence.history.src_len]  # (M, src_len)
            sentence.finish(
                slots, cands.scores[b, ends[b]], cands.raw[b, ends[b]], eos_coverage, by_eos=True
            )
            self._widths[b] = sentence.width
            self._kept[b] = len(sentence.finished)

    def _settle(self) -> np.ndarray:
        """(B,) bool: the sentences done after this step. At its max length a sentence's live slots
        finish as they are; otherwise its stopping rule says (`SentenceBeam.done`), which can only
        stop a sentence with every live slot dead or its n-best list full: the others are not
        looked at one by one."""
        B, K = len(self._sentences), self._beam_size
        scores = self._beams.scores.reshape(B, K)  # (B, K)
        raw = self._beams.raw.reshape(B, K)  # (B, K)
        best_live = scores.max(axis=1)  # (B,)
        at_max = self._steps >= self._max_len  # (B,)
        done = np.zeros(B, bool)  # (B,)
        ask = at_max | ~np.isfinite(best_live) | (self._kept >= self._wanted)  # (B,)
        for b in np.flatnonzero(ask).tolist():
            sentence = self._sentences[b]
            if at_max[b]:
                src_len = sentence.history.src_len
                live = np.flatnonzero(np.isfinite(scores[b]))  # (L,)
                live_coverage = self._beams.coverage[b * K + live, :src_len]  # (L, src_len)
                sentence.finish(live, scores[b, live], raw[b, live], live_coverage, by_eos=False)
                done[b] = True
            else:
                done[b] = sentence.done(float(best_live[b]))
        return done

    def _retire(self, done: np.ndarray) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Drop the done sentences and those that failed at this step from the batch and the
        decoder; return the done ones' n-best lists (the failed ones go to `take_failed`)."""
        failing, self._failing = self._failing, {}
        if failing:
            done = done.copy()
            done[list(failing)] = True
            self._failed += [(self._sentences[b].id, err) for b, err in failing.items()]
        if not done.any():
            return []
        results = [
            (s.id, s.n_best())
            for b, (s, d) in enumerate(zip(self._sentences, done, strict=True))
            if d and b not in failing
        ]
        self._drop(done)
        return results

    def remove(self, sentence_ids: Collection[Hashable]) -> list[Hashable]:
        """Drop sentences before they finish (cancelled, deadline passed); returns the ids removed."""
        drop = np.array([s.id in sentence_ids for s in self._sentences], bool)  # (B,)
        removed = [s.id for s, d in zip(self._sentences, drop, strict=True) if d]
        if removed:
            self._drop(drop)
        return removed

    def settled(self, sentence_ids: Collection[Hashable]) -> dict[Hashable, Hypothesis]:
        """Search.settled (beam_sentences.settled_prefixes)."""
        return settled_prefixes(self._sentences, self._beams.scores, self._beam_size, sentence_ids)

    def _merge_joining(self) -> None:
        """One concatenation for every sentence added since the last step (not one per sentence)."""
        if self._joining:
            self._beams = Beams.join([self._beams, *self._joining])
            self._joining = []

    def _drop(self, done: np.ndarray) -> None:
        """Remove the sentences done (B,) marks from the beams, the batch and the decoder."""
        self._merge_joining()
        K = self._beam_size
        keep = compaction_order(done)  # (B',) int64
        rows = (keep[:, None] * K + np.arange(K)).reshape(-1)  # (B'*K,)
        self._beams = self._beams.select(rows)
        self._ids.difference_update(self._sentences[b].id for b in np.flatnonzero(done))
        gone = [self._sentences[b] for b in np.flatnonzero(done)]
        self._controlled -= sum(s.controls.active for s in gone)
        self._reading -= sum(s.reads_history for s in gone)
        self._constrained -= sum(s.constraints is not None for s in gone)
        self._sentences = [self._sentences[b] for b in keep]
        self._steps, self._max_len = self._steps[keep], self._max_len[keep]
        self._widths, self._kept, self._wanted = (
            self._widths[keep],
            self._kept[keep],
            self._wanted[keep],
        )
        self._decoder.keep_sentences(keep)
        # the token columns the remaining sentences whose controls read them still use
        longest = 0
        if self._reading:
            longest = max((s.steps for s in self._sentences if s.reads_history), default=0)
        if self._beams.seqs.shape[1] > longest:
            self._beams = replace(self._beams, seqs=left_pad(self._beams.seqs, longest))


def compaction_order(done: np.ndarray) -> np.ndarray:
    """The surviving sentences (B',) of done (B,) in the order that moves the fewest rows.

    Survivors among the first B' rows stay where they are; each dropped row there is filled by one
    of the survivors beyond B' (there are exactly as many). Under iteration-level batching some
    sentence leaves at almost every step, and an order-preserving compaction would move every row
    after the first one dropped (the encoder tensors of half the batch, per step, on average).
    """
    B_new = int(len(done) - np.count_nonzero(done))
    order = np.arange(B_new, dtype=np.int64)  # (B',)
    holes = np.flatnonzero(done[:B_new])  # dropped rows that survivors must fill
    order[holes] = np.flatnonzero(~done[B_new:]) + B_new  # survivors from beyond B'
    return order


def beam_search(
    decoder: Decoder,
    src_lens: Sequence[int],
    options: SearchOptions,
    bos_id: int,
    eos_id: int,
    vocab_size: int | None = None,
) -> list[list[Hypothesis]]:
    """Decode a static batch whose decoder state buffer holds one initial row per sentence.

    Returns each sentence's n-best list (best first) in input order. Greedy is beam_size 1.
    """
    search = BeamSearch(decoder, options.beam_size, bos_id, eos_id, vocab_size=vocab_size)
    for b, src_len in enumerate(src_lens):
        search.add(b, src_len, options, state_row=b)
    results: dict[Hashable, list[Hypothesis]] = {}
    while not search.is_empty:
        results.update(search.step())
    return [results[b] for b in range(len(src_lens))]
