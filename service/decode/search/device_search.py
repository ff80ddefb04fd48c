"""The running batch's beam search on the model's device: one graph run a step, and the host reads
one flag per sentence.

`DeviceSearch` is a `Search` (service/decode/search/search.py) and gives the host search's answers
(tests/test_device_search.py and tests/test_search_schedules.py hold them equal on every bundle):
the rules are service/decode/shared/rules.py's, carried out by the graph of service/decode/runtime/search_graph.py,
appended to the decoder step at load. What a step costs the host:

- a step binds the previous step's outputs as its inputs (device tensors: nothing crosses), runs,
  and reads `done` (B,) bool: the only per-step transfer;
- when sentences join or leave, the batch's tensors are picked before the step (`_select`): on a
  device whose memory is the host's (the CPU provider), numpy writes the next step's inputs from
  the last step's outputs in place; elsewhere `select_graph` does, and the index array that picks
  the sentences and the joining sentences' fields and settings go up once (a few small arrays;
  their encoder rows and initial states are copied device to device by `EncoderRows`);
- when a sentence finishes, its fields and its block of the history (tokens, back-pointers,
  log-probs, its finished hypotheses, attention rows) are read once (gathered on the device and
  copied down in one transfer, or read in place on the CPU); the host ranks its n-best list from
  its finished hypotheses and back-traces their paths (a step back per step, for all of the
  finishing sentences' hypotheses at once).

Sentences with the controls the graph applies (a target prefix, single suppressed tokens, a
minimum length: `device_controls`) decode here too, in a variant of the graph used while one is in
the batch; RunningBatch gives the others to the numpy search (docs/decoding.md says which control
takes which path and what it costs).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnxruntime as ort

from service.decode.runtime.device import Device, host_view
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.encoder_rows import EncoderRows, HostBuffer
from service.decode.runtime.runtime import OnnxModel
from service.decode.runtime.search_graph import sentence_width
from service.decode.runtime.search_variant import (
    PARAMS,
    SENTENCE_FIELDS,
    SearchVariant,
)
from service.decode.search.beam import compaction_order
from service.decode.search.device_history import History
from service.decode.search.device_sentences import (
    COVERAGE,
    NEG_INF,
    POOL,
    STEPS,
    WANTED,
    KnownOptions,
    SentenceEntry,
    control_inputs,
    device_controls,
    finished_hypotheses,
    joining_columns,
    settled_prefixes,
)
from service.decode.search.search import Joining
from service.decode.search.search_memory import search_memory
from service.decode.shared.controls import NO_CONTROLS, Controls, unusable_controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import max_length
from service.decode.shared.search_types import Hypothesis


def settled_of(
    search: DeviceSearch, sentence_ids: Collection[Hashable]
) -> dict[Hashable, Hypothesis]:
    """DeviceSearch.settled: its stepped sentences' fields and histories read as a finished
    sentence's are (one gather), their live slots and kept hypotheses back-traced, their shared
    prefix (device_sentences.settled_prefixes)."""
    entries, meta = search._entries, search._meta
    rows = np.array([b for b, e in enumerate(entries) if e.id in sentence_ids], np.int64)
    rows = rows[meta[rows, STEPS] > 0]
    if search._state is None or not len(rows):
        return {}
    chosen = [entries[b] for b in rows.tolist()]
    found = settled_prefixes(
        *search._finished_rows(rows), meta[rows, STEPS], meta[rows, WANTED], chosen,
        search.beam_size,
    )  # fmt: skip
    return {e.id: prefix for e, prefix in zip(chosen, found, strict=True) if prefix is not None}


class DeviceSearch:
    """A running batch's beam search on the model's device (the module docstring)."""

    def __init__(
        self,
        model: OnnxModel,
        beam_size: int,
        bos_id: int,
        eos_id: int,
        vocab_size: int,
        narrow_on_eos: bool = False,
    ) -> None:
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        self.model = model
        self._beam_size = K = beam_size
        self.bos_id, self.eos_id = bos_id, eos_id
        self.narrow_on_eos = narrow_on_eos
        # the step's graph for this batch, with what its sentences need (SearchVariant)
        self.variant = SearchVariant(K, K + 1, bos_id, eos_id, narrow_on_eos, attention=False)
        self.session = model.search_session(self.variant)
        self.device = model.device
        self.rows = EncoderRows(
            model.row_ops,
            keys_follow_source=model.bundle.architecture.attention != "none",
            cutter=model.cut_session,
        )
        # where its tensors live, and how the host picks and reads them (chosen once)
        self.memory = search_memory(model, model.row_ops)
        self.history = History(self.memory, K)
        # the state tensors the architecture declares beside `state` (none for the RNNs): the
        # step computes their positions itself, from its sentences' steps (search_graph)
        self.declared = model.declared_states()
        self.in_place = model.caches_in_place  # the host arranges the caches before each step
        self.binding = self.session.io_binding()
        self._outputs_bound: list[str] = []  # the binding's outputs, in the order first bound
        self._taken: list[tuple[str, int]] | None = None  # `_take_outputs`' map, made once
        self.done = HostBuffer(np.bool_)
        self._entries: list[SentenceEntry] = []
        self._ids: set[Hashable] = set()
        self._meta = np.zeros((0, 7), np.int64)  # (B, 7) per sentence, in its order: STEPS..
        self._max_steps = 0  # the most steps a sentence of the batch has taken
        # the next step's inputs (device tensors): the last step's outputs, picked
        self._state: dict[str, Any] | None = None
        self._S_prev = 0  # the coverage's source axis, as the last step left it
        # what changed since the last step: sentences kept (in their new order), and joining
        self._keep: np.ndarray | None = None  # (B',) int64 into the last step's sentences
        self._joining: list[tuple[SentenceEntry, EncodedSentence]] = []
        self._bound: dict[str, object] = {}  # what the binding holds, by input name
        self._aranges = DeviceAranges(self.device, K)
        self._known: dict[int, KnownOptions] = {}  # by the options object's id (kept alive here)
        self._done_view = self.done.view((0,))  # (B,): what `done` is copied into
        self._S = 0  # the source axis of this step's encoder rows
        self._changed = True  # the batch changed before this step (picked anew)

    # --- BeamSearch's interface ----------------------------------------------------------------

    @property
    def beam_size(self) -> int:
        return self._beam_size

    @property
    def sentence_ids(self) -> list[Hashable]:
        return [e.id for e in self._entries] + [e.id for e, _ in self._joining]

    def __len__(self) -> int:
        return len(self._entries) + len(self._joining)

    @property
    def is_empty(self) -> bool:
        return not len(self)

    def add(self, joining: Sequence[Joining]) -> None:
        """Sentences join at the next step (after the others, in this order): their rows are
        written then, in one device call a run of one encoder call's (`_join`)."""
        for j in joining:
            self._add(j.id, j.encoded, j.options, j.controls)

    def _add(
        self,
        sentence_id: Hashable,
        encoded: EncodedSentence,
        options: SearchOptions,
        controls: Controls = NO_CONTROLS,
    ) -> None:
        if options.beam_size > self._beam_size:
            raise ValueError(
                f"sentence beam_size {options.beam_size} exceeds the batch's beam size "
                f"{self._beam_size}"
            )
        if not self.takes(options, controls):
            raise ValueError("the device search does not take these options or controls")
        problem = unusable_controls(controls, self.model.bundle.architecture.tgt_vocab_size)
        if problem:
            raise ValueError(f"sentence {sentence_id!r}: {problem}")
        if sentence_id in self._ids:
            raise ValueError(f"sentence {sentence_id!r} is already decoding")
        src_len = encoded.length
        max_len = self._known_of(options).max_len(src_len)
        if controls.prefix:
            max_len = max_length(options, src_len, len(controls.prefix))
        self._ids.add(sentence_id)
        entry = SentenceEntry(sentence_id, options, src_len, max_len, self.history.take(), controls)
        self._joining.append((entry, encoded))

    def _known_of(self, options: SearchOptions) -> KnownOptions:
        known = self._known.get(id(options))
        if known is None or known.options is not options:
            if len(self._known) > 256:
                self._known.clear()
            known = self._known[id(options)] = KnownOptions.of(options)
        return known

    def takes(self, options: SearchOptions, controls: Controls) -> bool:
        """Whether the device search applies these controls (`device_controls`) on this model's
        graph, and its stopping rule (not "heuristic", whose finished set is the beam's); the
        others stay with the numpy search: docs/decoding.md."""
        if options.stopping == "heuristic":
            return False
        if not controls.active:
            return True
        if not device_controls(controls):
            return False
        return self.model.search_takes_controls()

    def remove(self, sentence_ids: Collection[Hashable]) -> list[Hashable]:
        """Drop sentences before they finish; returns the ids removed."""
        removed = [e.id for e, _ in self._joining if e.id in sentence_ids]
        self.history.give_back([e.pool for e, _ in self._joining if e.id in sentence_ids])
        self._joining = [(e, s) for e, s in self._joining if e.id not in sentence_ids]
        self._ids.difference_update(removed)
        drop = np.array([e.id in sentence_ids for e in self._entries], bool)  # (B,)
        if drop.any():
            removed += [e.id for e, d in zip(self._entries, drop, strict=True) if d]
            self._drop(drop)  # their history rows go back with them
        if not len(self):
            self._reset()
        return removed

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Advance every sentence by one token; return the sentences done now with their n-best."""
        if not len(self):
            return []
        if self._joining or self._keep is not None or self._state is None:
            self._bind_changes()
        self._bind_step()
        self.model.run_step(self.session, self.binding)
        self.history.live = True
        self._take_outputs()
        done = self.device.fetched(self._done_view, "done")  # (B,) bool
        self._meta[:, STEPS] += 1
        self._max_steps += 1
        self._changed = False
        if not done.any():
            return []
        results = self._finish(np.flatnonzero(done))
        self._drop(done.copy())
        if not len(self):
            self._reset()
        return results

    settled = settled_of  # Search.settled

    def take_failed(self) -> list[tuple[Hashable, Exception]]:
        """None here: the controls the graph applies are checked when a sentence joins (`add`),
        and what fails in the graph fails the step."""
        return []

    # --- the batch's membership ----------------------------------------------------------------

    def _drop(self, drop: np.ndarray) -> None:
        """Sentences drop (B,) marks leave: the rows that stay, in `compaction_order` (each row
        dropped among the first B' is filled by a survivor from beyond them)."""
        keep = compaction_order(drop)  # (B',)
        gone = np.flatnonzero(drop)
        self.history.give_back(self._meta[gone, POOL].tolist())
        entries = self._entries
        self._ids.difference_update(entries[b].id for b in gone.tolist())
        B_new = len(keep)
        for hole in np.flatnonzero(keep != np.arange(B_new)).tolist():
            entries[hole] = entries[int(keep[hole])]
        del entries[B_new:]
        self._meta = self._meta[keep]
        self._max_steps = int(self._meta[:, STEPS].max(initial=0))
        self._keep = keep if self._keep is None else self._keep[keep]
        self.rows.keep(keep)

    def _reset(self) -> None:
        """The batch is empty: its device state goes. The binding and the history's buffers stay
        for the next sentences (under churn at small batches a batch empties at every step),
        unless the history has grown large."""
        self._state = None
        self._keep = None
        self._S_prev = 0
        if self.declared is not None:
            self.declared.reset()
        self.history.reset()
        if self.history.fields is None:
            self._bound.pop("history", None)

    def _join(self, joining: list[tuple[SentenceEntry, EncodedSentence]]) -> np.ndarray:
        """The joining sentences become the batch's last rows: their encoder rows and initial
        states (after the decoder state's rows), their per-sentence columns; returns their
        settings (len(PARAMS), n), made once per options object and maximum length."""
        entries = [e for e, _ in joining]
        state = as_ortvalue(self._state["new_state"]) if self._state is not None else None
        new_state = self.rows.append([s for _, s in joining], state)
        if self._state is None:
            self._state = {}
        self._state["new_state"] = new_state
        self._entries += entries
        n = len(entries)
        if self.declared is not None:
            self.declared.join(n)
        meta, settings = joining_columns(entries, self._known_of)
        self._meta = np.concatenate([self._meta, meta])
        return settings

    def _bind_changes(self) -> None:
        """Before a step after joins or leaves: the joining sentences join (`_join`), the graph
        follows what the batch needs (SearchVariant), the batch is picked (`_select`), and what
        depends on its size is bound."""
        K, device = self._beam_size, self.device
        joining, self._joining = self._joining, []
        # the previous step's sentences and rows (before the leaves since: `_keep` picks from them)
        state = self._state
        B_prev = int(state["sentences"].shape()[1]) if state and "sentences" in state else 0
        N_prev = 0 if state is None else int(state["new_state"].shape()[0])
        settings = self._join(joining) if joining else None
        needs: list[bool] = np.any(self._meta[:, COVERAGE:], axis=0).tolist()
        coverage, controls, attention, wide = needs
        variant = self.model.search_variant_for(
            replace(
                self.variant, coverage=coverage, controls=controls, attention=attention, wide=wide
            )
        )
        if variant != self.variant:  # the other graph: a new binding, every input bound again
            self._switch(variant)
        if coverage_follows(self._state, self.variant.coverage, self.device):
            self._S_prev = 0
        self._select(B_prev, N_prev, settings)
        self._changed = True
        self._max_steps = int(self._meta[:, STEPS].max(initial=0))
        state, binding = self._state, self.binding
        assert state is not None
        B = len(self._entries)
        self._S = S = self.rows.source_len
        if self._bound.get("settings") is not state["settings"]:
            device.bind_value(binding, "settings", state["settings"])
            self._bound["settings"] = state["settings"]
        _, row_bases = self._aranges.for_rows(B)
        if self._bound.get("row_base") != (B, row_bases.data_ptr()):
            device.bind_device_input(binding, "row_base", row_bases, (1, B))
            self._bound["row_base"] = (B, row_bases.data_ptr())
        self._done_view = done = self.done.view((B,))
        if self._bound.get("done") != (B, self.done.generation):
            device.bind_host_output(binding, "done", done)
            self._note_output("done")
            self._bound["done"] = (B, self.done.generation)
        if self.variant.attention and self._bound.get("S") != (S, B):
            device.bind_host_argument(binding, "attention_shape", np.array([B, K, S], np.int64))
            self._bound["S"] = (S, B)
        rows_key = self.rows.binding_key()
        if rows_key != self._bound.get("encoder"):
            self.rows.bind(binding, self.session)
            self._bound["encoder"] = rows_key

    def _bind_step(self) -> None:
        """Bind this step's inputs: the last step's outputs (picked, where the batch changed), a
        history column for it, new outputs."""
        device, binding, state = self.device, self.binding, self._state
        assert state is not None
        # a column for this step's record (its index: the steps so far)
        if self.history.fit(self._max_steps + 1, self._S, self.variant.attention) or (
            "history" not in self._bound
        ):
            self._bind_history()
        device.bind_value(binding, "state", state["new_state"])
        if self.declared is not None:
            if self.in_place:  # the back-pointers are in host memory (the CPU provider's)
                reorder = host_view(state["reorder"], (len(self._entries) * self._beam_size,))
                steps = np.repeat(self._meta[:, STEPS], self._beam_size)  # (N,) each row's entries
                self.declared.arrange(reorder, steps)
            self.declared.bind(binding)
            if self.in_place:  # the step writes them where it reads them
                self.declared.bind_outputs(binding)
                for spec in self.declared.specs:
                    self._note_output("new_" + spec.name)
        device.bind_value(binding, "tokens", state["tokens"])
        device.bind_value(binding, "reorder", state["reorder"])
        device.bind_value(binding, "sentences", state["sentences"])
        if self.variant.coverage:
            self._bind_coverage()
            self._bind_coverage_fit(self._S)
        if self.variant.controls:
            self._bind_controls()
        outputs = step_outputs(self.declared, self.in_place, self.variant.coverage)
        for name in outputs:
            device.bind_new_output(binding, name)  # a new tensor: the inputs stay
        if self._taken is None:
            for name in outputs:
                self._note_output(name)

    def _keep_base(self) -> np.ndarray:
        """The last step's sentences that are still in the batch, as indices into them."""
        assert self._state is not None
        if self._keep is not None:
            return self._keep
        B_prev = int(self._state["sentences"].shape()[1])
        return np.arange(B_prev, dtype=np.int64)

    def _select(self, B_prev: int, N_prev: int, settings: np.ndarray | None) -> None:
        """The next step's sentences, tokens, back-pointers and settings: the last step's that
        stay (`_keep`, or all of them), then the joining sentences' (no steps, nothing finished,
        one live slot at BOS whose back-pointer is the sentence's initial state: rows N_prev.. of
        the decoder state), picked by the search's memory (SearchMemory.select)."""
        assert self._state is not None
        K, W = self._beam_size, self.sentence_rows
        kept = np.arange(0, dtype=np.int64) if "sentences" not in self._state else self._keep_base()
        self._keep = None
        n = 0 if settings is None else settings.shape[1]
        joins: dict[str, np.ndarray] = {}
        if settings is not None and n:
            joins = joining_rows(settings, K, W, N_prev, self.bos_id, self.declared)
        B = len(kept) + n
        self.device.ledger.record("host_to_device", "indices", B * 8)
        moved = sum(a.nbytes for a in joins.values())
        self.device.ledger.record("host_to_device", "search", moved)
        self.memory.select(self._state, kept, joins, B_prev, K, W, len(PARAMS))
        if self.variant.coverage:  # the rows of those sentences (joining ones: past N_prev)
            row_select = np.concatenate(
                [(kept[:, None] * K + np.arange(K)).reshape(-1), N_prev + np.arange(n * K)]
            ).astype(np.int64)  # (N,)
            self._upload("row_select", row_select, "indices")
            self._bound["identity"] = None

    def _upload(self, name: str, array: np.ndarray, reason: str) -> None:
        value = self.device.upload(array, reason)
        self.device.bind_value(self.binding, name, value)
        self._bound[name] = value  # the device copy lives while it is bound

    def _bind_coverage(self) -> None:
        """The coverage's inputs: the last step's coverage and the rows it continues (an identity
        view where nobody joined or left; `_select` uploads them otherwise)."""
        K, device, binding = self._beam_size, self.device, self.binding
        assert self._state is not None
        device.bind_value(binding, "coverage", self._state["coverage"])
        B = len(self._entries)
        aranges, _ = self._aranges.for_rows(B)
        if not self._changed and self._bound.get("identity") != (B, aranges.data_ptr()):
            device.bind_device_input(binding, "row_select", aranges, (B * K,))
            self._bound["identity"] = (B, aranges.data_ptr())

    def _bind_coverage_fit(self, S: int) -> None:
        """The coverage fitted to this step's source axis S (from the last step's)."""
        if self._bound.get("coverage_S") != (self._S_prev, S):
            cut = min(self._S_prev, S)
            self.device.bind_host_argument(self.binding, "coverage_ends", np.array([S], np.int64))
            self.device.bind_host_argument(
                self.binding, "coverage_pads", np.array([0, 0, 0, S - cut], np.int64)
            )
            self._bound["coverage_S"] = (self._S_prev, S)
        self._S_prev = S

    @property
    def sentence_rows(self) -> int:
        """W: a sentence's fields in `sentences` (search_graph.sentence_width)."""
        return sentence_width(self._beam_size)

    def _bind_history(self) -> None:
        history = self.history
        fields, attention = history.fields, history.attention
        assert fields is not None
        self.device.bind_in_place(self.binding, "history", fields, np.float32, history.fields_shape)
        self._note_output("out_history")
        if self.variant.attention:
            assert attention is not None
            self.device.bind_in_place(
                self.binding, "attention_history", attention, np.float32, history.shape
            )
            self._note_output("out_attention_history")
        self._bound["history"] = (fields, attention, history.shape)

    def _note_output(self, name: str) -> None:
        if name not in self._outputs_bound:
            self._outputs_bound.append(name)
            self._taken = None

    def _take_outputs(self) -> None:
        """This step's outputs become the next step's inputs (by the order the binding's outputs
        were first bound)."""
        outputs = self.device.outputs(self.binding)
        state = self._state
        assert state is not None
        if self._taken is None:  # (state key, output index) for each output a step hands on
            at = {name: i for i, name in enumerate(self._outputs_bound)}
            self._taken = [
                (name.removeprefix("out_"), at[name])
                for name in step_outputs(self.declared, self.in_place, self.variant.coverage)
            ]
        for key, index in self._taken:
            state[key] = outputs[index]
        if self.declared is not None and not self.in_place:  # theirs, after this step; cut
            self.declared.values = {s.name: state.pop("new_" + s.name) for s in self.declared.specs}
            self.declared.cut(self._max_steps + 1)  # to the entries rows read

    def _bind_controls(self) -> None:
        """This step's controls as the graph's inputs: each row's forced token (a prefix's, -1
        for none) and the (row, token) pairs blocked (suppressed tokens; the end of sentence
        before the minimum length), from the controlled sentences' own steps."""
        forced, blocked = control_inputs(self._entries, self._meta, self._beam_size, self.eos_id)
        self._upload("forced", forced, "tokens")
        self._upload("blocked", blocked.astype(np.int64), "tokens")

    def _switch(self, variant: SearchVariant) -> None:
        """To the step's graph with what the batch's sentences need (SearchVariant): a batch whose
        last sentence with a coverage penalty (controls, an alignment, an n-best list) left stops
        paying for it."""
        self.variant = variant
        self.session = self.model.search_session(variant)
        self.binding = self.session.io_binding()
        self._outputs_bound = []
        self._taken = None
        self._bound = {}

    # --- finished sentences ----------------------------------------------------------------------

    def _finish(self, rows: np.ndarray) -> list[tuple[Hashable, list[Hypothesis]]]:
        """The n-best lists of the sentences in rows (D,) of the batch (their finished hypotheses,
        best first: their first `keep` entries with a score), back-traced together."""
        entries = [self._entries[b] for b in rows.tolist()]
        found = finished_hypotheses(
            *self._finished_rows(rows), self._meta[rows, WANTED], entries, self._beam_size
        )
        return [(entry.id, found[i]) for i, entry in enumerate(entries)]

    def _finished_rows(
        self, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The finished sentences' fields (D, W) float64, and the histories (·, T, 2, K) and
        attention rows (·, T, K, S) float32 that hold theirs, at rows `where` (D,) (T: the most
        steps among them): SearchMemory.finished (state columns mapped by `_keep`)."""
        history = self.history
        assert self._state is not None and history.fields is not None
        pools, T = self._meta[rows, POOL], int(self._meta[rows, STEPS].max())
        attention_on = self.variant.attention and history.attention is not None
        columns = rows if self._keep is None else self._keep[rows]  # (left at a step: at the next)
        return self.memory.finished(
            self._state, history, columns, pools, T, self.sentence_rows, attention_on
        )


class DeviceAranges:
    """Device buffers of 0, 1, ... and of 0, K, 2K, ..., long enough for B sentences' rows (grown
    by doubling; bound as views, and bound again when they grow)."""

    def __init__(self, device: Device, K: int) -> None:
        self.device, self.K = device, K
        self.arange: Any = None
        self.row_bases: Any = None

    def for_rows(self, B: int) -> tuple[Any, Any]:
        K = self.K
        if self.arange is None or self.arange.shape()[0] < B * K:
            rows = np.arange(max(2 * B * K, 64), dtype=np.int64)
            self.arange = self.device.upload(rows, "indices")
            self.row_bases = self.device.upload(rows * K, "indices")
        return self.arange, self.row_bases


def joining_rows(
    settings: np.ndarray, K: int, W: int, N_prev: int, bos_id: int, declared: Any
) -> dict[str, np.ndarray]:
    """The joining sentences' columns and rows for `select`: no steps, nothing finished, one live
    slot at BOS whose back-pointer is the sentence's initial state (rows N_prev.. of the decoder
    state)."""
    n = settings.shape[1]
    rows = np.zeros((W, n), np.float64)  # (W, n)
    rows[SENTENCE_FIELDS : SENTENCE_FIELDS + K] = NEG_INF  # nothing finished
    rows[SENTENCE_FIELDS + 3 * K + 1 :] = NEG_INF  # one live slot: the K starts are one
    starts = np.repeat((N_prev + np.arange(n, dtype=np.int64))[:, None], K, axis=1)
    if declared is not None:  # a lazy join's rows read row 0's (masked) entries
        starts = declared.cache_reorder(starts)
    return {
        "sentences": rows,
        "tokens": np.full((n, K), bos_id, np.int64),
        "reorder": starts,
        "settings": settings,
    }


def step_outputs(declared: Any, in_place: bool, coverage: bool) -> tuple[str, ...]:
    """The outputs a step makes for the next: new device tensors every step."""
    names: tuple[str, ...] = ("out_tokens", "out_reorder", "out_sentences", "new_state")
    if declared is not None and not in_place:  # in place: bound with the inputs
        names = (*names, *("new_" + spec.name for spec in declared.specs))
    return (*names, "out_coverage") if coverage else names


def coverage_follows(state: dict[str, Any] | None, coverage: bool, device: Device) -> bool:
    """The state holds a coverage exactly while the graph takes one, whatever came before: a
        switch of graphs, or a batch that emptied (its state went with it) under the coverage
        graph and fills again. A new coverage starts at zero: it matters only to the sentences
        with the penalty, which join now; so do the attention rows.

    Whether the state changed."""
    assert state is not None
    if coverage == ("coverage" in state):
        return False
    if coverage:
        N = int(state["new_state"].shape()[0])
        state["coverage"] = device.upload(np.zeros((N, 0), np.float32), "state")
    else:
        del state["coverage"]
    return True


def as_ortvalue(value: Any) -> ort.OrtValue:
    """An OrtValue of a value `Device.outputs` gave (C-level where onnxruntime exposes them)."""
    return value if isinstance(value, ort.OrtValue) else ort.OrtValue(value)
