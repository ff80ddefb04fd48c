"""The running batch's beam search on the model's device: one graph run a step, and the host reads
one flag per sentence.

`DeviceSearch` has `BeamSearch`'s interface (service/decode/beam.py: add, step, remove,
sentence_ids, len) and gives its answers (tests/test_device_search.py holds them equal on every
bundle): the rules are beam.py's, carried out by the graph of service/decode/search_graph.py,
appended to the decoder step at load. What a step costs the host:

- a step binds the previous step's outputs as its inputs (device tensors: nothing crosses), runs,
  and reads `done` (B,) bool: the only per-step transfer;
- when sentences join or leave, the index array that picks the batch's sentences and the joining
  sentences' settings and initial fields go up once (a few small arrays; their encoder rows and
  initial states are copied device to device by `EncoderRows`);
- when a sentence finishes, its n-best entries and its block of the history (tokens, back-pointers,
  log-probs, attention rows) come down in one gather, and the host back-traces its n-best paths (a
  step back per step, over small lists: cheaper than a device loop of one graph run a step).

Sentences with the controls the graph applies (a target prefix, single suppressed tokens, a
minimum length: `device_controls`) decode here too, in a variant of the graph used while one is in
the batch; RunningBatch gives the others to the numpy search (docs/decoding.md says which control
takes which path and what it costs).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnxruntime as ort

from service.decode.beam import Hypothesis, compaction_order, length_penalty
from service.decode.controls import NO_CONTROLS, Controls
from service.decode.device import HostRowOps, host_view
from service.decode.options import SearchOptions
from service.decode.runtime import EncodedSentence, EncoderRows, HostBuffer, OnnxModel
from service.decode.search_graph import (
    CODE,
    PARAMS,
    RULES,
    SENTENCE_FIELDS,
    SearchShape,
    sentence_width,
)

NEG_INF = -math.inf


@dataclass
class _Entry:
    """A sentence of the batch, as the host knows it."""

    id: Hashable
    options: SearchOptions
    src_len: int
    max_len: int
    pool: int  # its row of the history buffer
    controls: Controls = NO_CONTROLS  # a prefix, single suppressed tokens, a minimum length

    @property
    def keep(self) -> int:
        return self.options.n_best


def device_controls(controls: Controls) -> bool:
    """Whether the device search applies a sentence's controls: a target prefix (forced), single
    suppressed tokens and a minimum length (masks). What reads a hypothesis's own tokens (n-gram
    blocking, a suppressed sequence, a repetition penalty), samples, alternatives and glossary
    constraints stay with the numpy search."""
    return (
        all(len(seq) == 1 for seq in controls.suppress)
        and not controls.no_repeat_ngram_size
        and controls.repetition_penalty == 1.0
        and not controls.alternatives
        and not controls.sampling
        and not controls.constraints
    )


def sentence_params(options: SearchOptions, max_len: int, pool: int) -> np.ndarray:
    """The sentence's row of the graph's `params` (search_graph.PARAMS) (P,) float64."""
    values = {
        "beam": options.beam_size,
        "keep": options.n_best,
        "max_len": max_len,
        "alpha": options.length_penalty,
        "beta": options.coverage_penalty,
        "normalize": options.normalize,
        "word_penalty": options.word_penalty,
        "narrowing": float(options.stopping == "narrowing"),
        "patience_ends": math.ceil(options.beam_size * options.patience),
        "max_lp": length_penalty(max_len, options.length_penalty) * max_len**options.normalize,
        "pool": pool,
    }
    return np.array([values[name] for name in PARAMS], np.float64)


def sentence_rules(options: SearchOptions) -> np.ndarray:
    """The sentence's row of `rules` (RULES) (4,) bool: its stopping rule (exact only with a word
    penalty >= 0: a reward leaves no bound)."""
    rule = options.stopping
    if rule == "exact" and options.word_penalty < 0:
        return np.zeros(len(RULES), bool)
    return np.array([r == rule for r in RULES], bool)


class History:
    """The history buffers on the device, one row per sentence of the pool, one column per step:
    `fields` (P, L, 2, K) float32 (codes and log-probs) and `attention` (P, L, K, S) float32, on
    the batch's source axis S: `shape` (P, L, K, S) is read over the leading elements of buffers
    that may be larger. They grow (larger buffers, the live entries copied) when a sentence needs a
    row or a step beyond them, follow S when it changes (cut columns are padding: every sentence
    left has a shorter source); with no live entry (an emptied batch: under churn at small batches,
    at every step) a new shape is read over the same buffers, nothing copied. `on_host`: the
    device's memory is the host's (the CPU provider's host row ops): numpy instead of graph runs."""

    MIN_ROWS, MIN_STEPS = 16, 32
    KEEP_BYTES = 16 << 20  # an emptied batch keeps history buffers up to this size

    def __init__(self, model: OnnxModel, K: int, on_host: bool) -> None:
        self.model = model
        self.K = K
        self.on_host = on_host
        self.fields: ort.OrtValue | None = None
        self.attention: ort.OrtValue | None = None
        self.shape: tuple[int, int, int, int] = (0, 0, K, 0)  # (P, L, K, S)
        self.live = False  # entries of sentences still decoding are in the buffers
        self.free: list[int] = []
        self.used = 0  # rows handed out so far (free rows are reused first)

    @property
    def fields_shape(self) -> tuple[int, int, int, int]:
        """(P, L, 2, K)."""
        P, L, K, _ = self.shape
        return (P, L, 2, K)

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.used += 1
        return self.used - 1

    def give_back(self, rows: Sequence[int]) -> None:
        self.free.extend(rows)

    def fit(self, steps: int, source_len: int) -> bool:
        """Room for `used` rows and `steps` steps, on a source axis of `source_len`; True when the
        buffers or their shape changed (a binding to the old ones is stale)."""
        P, L, K, S = self.shape
        if self.fields is not None and self.used <= P and steps <= L and source_len == S:
            return False
        shape = (
            P if self.used <= P else max(2 * P, self.used, self.MIN_ROWS),
            L if steps <= L else max(2 * L, steps, self.MIN_STEPS),
            K,
            source_len,
        )
        fields_shape = (shape[0], shape[1], 2, K)
        if self.live:  # entries to keep: new buffers, the entries copied
            self.fields = self._refit(self.fields, self.fields_shape, fields_shape)
            self.attention = self._refit(self.attention, self.shape, shape)
        elif not (fits(self.fields, fields_shape) and fits(self.attention, shape)):
            self.fields = self._empty(fields_shape)
            self.attention = self._empty(shape)
        self.shape = shape
        return True

    def _empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        if self.on_host:  # numpy's memory: `host_view` reads it without ctypes
            return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
        return self.model.device.empty(shape, np.float32)

    def _refit(
        self, old: ort.OrtValue | None, have: tuple[int, ...], shape: tuple[int, ...]
    ) -> ort.OrtValue:
        """A buffer of `shape` holding old's entries (read as `have`; cut to its last axis where
        shorter)."""
        device = self.model.device
        if old is None:
            return self._empty(shape)
        if self.on_host:
            new = np.zeros(shape, np.float32)
            P, L, Y, X = have
            X = min(X, shape[3])
            new[:P, :L, :Y, :X] = host_view(old, have)[..., :X]
            return ort.OrtValue.ortvalue_from_numpy(new)
        ends = np.array([*have[:3], min(have[3], shape[3])], np.int64)
        pads = np.zeros(8, np.int64)
        pads[4:] = np.subtract(shape, ends)
        session = self.model.search_helper("grow")
        binding = session.io_binding()
        device.bind_device_input(binding, "history", old, have)
        device.bind_host_argument(binding, "starts", np.zeros(4, np.int64))
        device.bind_host_argument(binding, "ends", ends)
        device.bind_host_argument(binding, "pads", pads)
        binding.bind_output("grown", device.type, device.id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def reset(self) -> None:
        """No sentence holds a row any more: the buffers stay (the large ones go), with no live
        entry."""
        self.free = []
        self.used = 0
        self.live = False
        P, L, K, S = self.shape
        if P * L * K * (S + 2) * 4 > self.KEEP_BYTES:
            self.fields = self.attention = None
            self.shape = (0, 0, self.K, 0)


def fits(buffer: ort.OrtValue | None, shape: tuple[int, ...]) -> bool:
    """Whether a buffer holds at least the elements of `shape`."""
    return buffer is not None and math.prod(buffer.shape()) >= math.prod(shape)


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
        # the step's graph for this batch; with the coverage while a sentence has a coverage
        # penalty, with the controls while a sentence has controls (each costs the others)
        self.shape = SearchShape(K, K + 1, bos_id, eos_id, narrow_on_eos)
        self.session = model.search_session(self.shape)
        self._takes_controls: bool | None = None  # whether the graph can apply them (`takes`)
        self.device = model.device
        self.rows = EncoderRows(
            model.row_ops, keys_follow_source=model.bundle.architecture.attention != "none"
        )
        # the device's memory is the host's: finished sentences are read in place, not gathered
        self.on_host = isinstance(model.row_ops, HostRowOps)
        self.history = History(model, K, self.on_host)
        self.binding = self.session.io_binding()
        self.done = HostBuffer(np.bool_)
        self._entries: list[_Entry] = []
        self._ids: set[Hashable] = set()
        self._steps = np.zeros(0, np.int64)  # (B,) steps decoded, as the device counts them
        # the previous step's outputs (None: nothing decoded since the batch was empty)
        self._state: dict[str, Any] | None = None  # device tensors (Device.outputs' values)
        self._D = 0  # decoder state width (the first join tells)
        self._S_prev = 0  # the coverage's source axis, as the last step left it
        # what changed since the last step: sentences kept (in their new order), and joining
        self._keep: np.ndarray | None = None  # (B',) int64 into the last step's sentences
        self._joining: list[tuple[_Entry, EncodedSentence]] = []
        self._bound: dict[str, object] = {}  # what the binding holds, by input name
        # device buffers of 0, 1, ... and of b·K, whose leading views are bound (`_aranges`), and
        # the empty join of a step where nobody joins
        self._arange: Any = None
        self._row_bases: Any = None
        self._no_join: Any = None
        self._empties: dict[tuple[int, bool], dict[str, Any]] = {}  # `_empty_state`'s, by shape
        self._penalized = 0  # sentences with a coverage penalty (the coverage is kept for them)
        self._controlled: list[int] = []  # the batch's sentences with controls (indices)

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

    def add(
        self,
        sentence_id: Hashable,
        encoded: EncodedSentence,
        options: SearchOptions,
        controls: Controls = NO_CONTROLS,
    ) -> None:
        """A sentence joins at the next step (after the others, in the order added)."""
        if options.beam_size > self._beam_size:
            raise ValueError(
                f"sentence beam_size {options.beam_size} exceeds the batch's beam size "
                f"{self._beam_size}"
            )
        if controls.active and not self.takes(controls):
            raise ValueError("the device search does not take these decoding controls")
        if sentence_id in self._ids:
            raise ValueError(f"sentence {sentence_id!r} is already decoding")
        src_len = encoded.length
        # a prefix is always decoded whole (cut only by max_length), as beam.py's add says
        room = max(options.max_len(src_len), len(controls.prefix) + 1)
        max_len = min(options.max_length, room)
        self._ids.add(sentence_id)
        entry = _Entry(sentence_id, options, src_len, max_len, self.history.take(), controls)
        self._joining.append((entry, encoded))

    def takes(self, controls: Controls) -> bool:
        """Whether the device search applies these controls (`device_controls`) on this model's
        graph (the others stay with the numpy search: docs/decoding.md)."""
        if not controls.active:
            return True
        if not device_controls(controls):
            return False
        if self._takes_controls is None:
            try:
                self.model.search_session(replace(self.shape, controls=True))
                self._takes_controls = True
            except ValueError:
                self._takes_controls = False
        return self._takes_controls

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
        self._bind_batch()
        self.session.run_with_iobinding(self.binding)
        self.history.live = True
        self._take_outputs()
        B = len(self._entries)
        done = self.device.fetched(self.done.view((B,)), "done")  # (B,) bool
        self._steps += 1
        if not done.any():
            return []
        results = self._finish(np.flatnonzero(done))
        self._drop(done.copy())
        if not len(self):
            self._reset()
        return results

    # --- the batch's membership ----------------------------------------------------------------

    def _drop(self, drop: np.ndarray) -> None:
        """Sentences drop (B,) marks leave: the rows that stay, in `compaction_order`."""
        keep = compaction_order(drop)  # (B',)
        self._penalized -= sum(
            self._entries[b].options.coverage_penalty > 0 for b in np.flatnonzero(drop)
        )
        self.history.give_back([self._entries[b].pool for b in np.flatnonzero(drop)])
        self._ids.difference_update(self._entries[b].id for b in np.flatnonzero(drop))
        self._entries = [self._entries[b] for b in keep]
        self._steps = self._steps[keep]
        self._keep = keep if self._keep is None else self._keep[keep]
        self.rows.keep(keep)

    def _reset(self) -> None:
        """The batch is empty: its device state goes. The binding and the history's buffers stay
        for the next sentences (under churn at small batches a batch empties at every step),
        unless the history has grown large."""
        self._state = None
        self._controlled = []
        self._keep = None
        self._S_prev = 0
        self.history.reset()
        if self.history.fields is None:
            self._bound.pop("history", None)

    def _bind_batch(self) -> None:
        """Bind this step's inputs: the joins and leaves since the last step as index arrays, the
        previous step's outputs as this one's inputs."""
        K, device, binding = self._beam_size, self.device, self.binding
        joining, self._joining = self._joining, []
        # the previous step's sentences and rows (before the leaves since: `_keep` picks from them)
        B_prev = 0 if self._state is None else int(self._state["out_sentences"].shape()[1])
        N_prev = 0 if self._state is None else int(self._state["new_state"].shape()[0])
        changed = bool(joining) or self._keep is not None or self._state is None
        self._penalized += sum(e.options.coverage_penalty > 0 for e, _ in joining)
        if joining or self._keep is not None:
            everyone = self._entries + [e for e, _ in joining]
            self._controlled = [b for b, e in enumerate(everyone) if e.controls.active]
        shape = replace(self.shape, coverage=self._penalized > 0, controls=bool(self._controlled))
        if shape != self.shape:  # the other graph: a new binding, every input bound again
            self._switch(shape)
            changed = True
        if self._state is None:
            self._D = self._D or joining[0][1].state_width
            self._state = self._empty_state()
        if joining:  # their encoder rows, and their initial states after the others'
            state = as_ortvalue(self._state["new_state"])
            self._state["new_state"] = self.rows.append([s for _, s in joining], state)
            self._entries += [e for e, _ in joining]
            self._steps = np.concatenate([self._steps, np.zeros(len(joining), np.int64)])
        B, S = len(self._entries), self.rows.source_len
        # a column for this step's record (its index: the steps so far)
        if self.history.fit(int(self._steps.max(initial=0)) + 1, S) or "history" not in self._bound:
            self._bind_history()
        binding = self.binding
        for name in ("sentences", "coverage") if self.shape.coverage else ("sentences",):
            device.bind_value(binding, name, self._state[f"out_{name}"])
        device.bind_value(binding, "state", self._state["new_state"])
        if changed:
            kept = np.arange(B_prev, dtype=np.int64) if self._keep is None else self._keep
            self._keep = None
            n = len(joining)
            sent_select = np.concatenate([kept, B_prev + np.arange(n)]).astype(np.int64)  # (B,)
            self._upload("sent_select", sent_select, "indices")
            if self.shape.coverage:  # the rows of those sentences (joining ones: past N_prev)
                row_select = np.concatenate(
                    [(kept[:, None] * K + np.arange(K)).reshape(-1), N_prev + np.arange(n * K)]
                ).astype(np.int64)  # (N,)
                self._upload("row_select", row_select, "indices")
            self._upload_joins(joining, N_prev)
            self._bind_row_base(B)
            self._bound["identity"] = False
        elif not self._bound.get("identity"):
            self._bind_identity(B)
        if self._bound.get("S") != (self._S_prev, S, B):
            if self.shape.coverage:
                cut = min(self._S_prev, S)
                device.bind_host_argument(binding, "coverage_ends", np.array([S], np.int64))
                device.bind_host_argument(
                    binding, "coverage_pads", np.array([0, 0, 0, S - cut], np.int64)
                )
            device.bind_host_argument(binding, "attention_shape", np.array([B, K, S], np.int64))
            self._bound["S"] = (self._S_prev, S, B)
        rows_key = self.rows.binding_key()
        if rows_key != self._bound.get("encoder"):
            self.rows.bind(binding)
            self._bound["encoder"] = rows_key
        if self.shape.controls:
            self._bind_controls()
        for name in self._outputs:
            device.bind_new_output(binding, name)  # a new tensor: the inputs stay
        done = self.done.view((B,))
        if self._bound.get("done") != (B, self.done.generation):
            device.bind_host_output(binding, "done", done)
            self._bound["done"] = (B, self.done.generation)
        self._S_prev = S

    def _upload(self, name: str, array: np.ndarray, reason: str) -> None:
        value = self.device.upload(array, reason)
        self.device.bind_value(self.binding, name, value)
        self._bound[name] = value  # the device copy lives while it is bound

    def _bind_identity(self, B: int) -> None:
        """The selects of a step where nobody joined or left: every sentence (and row) where it
        was, no joining sentence; views of device buffers made once, so nothing crosses."""
        K = self._beam_size
        aranges, _ = self._aranges(B)
        self.device.bind_device_input(self.binding, "sent_select", aranges, (B,))
        if self.shape.coverage:
            self.device.bind_device_input(self.binding, "row_select", aranges, (B * K,))
        if self._no_join is None:
            self._no_join = self.device.upload(np.zeros((self.width, 0), np.float64), "search")
        self.device.bind_value(self.binding, "join_sentences", self._no_join)
        self._bind_row_base(B)
        self._bound["identity"] = True

    def _aranges(self, B: int) -> tuple[Any, Any]:
        """Device buffers of 0, 1, ... and of 0, K, 2K, ..., long enough for B sentences' rows
        (grown by doubling; bound as views, so a binding to the old ones is never left: every
        step binds them again)."""
        K = self._beam_size
        if self._arange is None or self._arange.shape()[0] < B * K:
            size = max(2 * B * K, 64)
            self._arange = self.device.upload(np.arange(size, dtype=np.int64), "indices")
            self._row_bases = self.device.upload(
                np.arange(size, dtype=np.int64)[None, :] * K, "indices"
            )
        return self._arange, self._row_bases

    def _bind_row_base(self, B: int) -> None:
        """row_base (1, B) int64 = b·K: a view of a device buffer (nothing crosses per join)."""
        _, row_bases = self._aranges(B)
        self.device.bind_device_input(self.binding, "row_base", row_bases, (1, B))

    def _upload_joins(self, joining: list[tuple[_Entry, EncodedSentence]], N_prev: int) -> None:
        """The joining sentences' rows of `sentences`: no steps, empty n-best lists, one live slot
        at BOS whose back-pointer is the sentence's initial state (their states follow the
        others' in the decoder state: rows N_prev.., `EncoderRows.append`)."""
        K, n = self._beam_size, len(joining)
        rows = np.zeros((n, self.width), np.float64)  # (n, W)
        nbest = SENTENCE_FIELDS
        rows[:, nbest : nbest + 2 * K] = NEG_INF  # empty n-best lists
        slots = nbest + 3 * K  # then the slots' tokens, back-pointers, scores, log-probs
        rows[:, slots : slots + K] = self.bos_id
        rows[:, slots + K : slots + 2 * K] = (N_prev + np.arange(n))[:, None]
        scores = np.full((n, K), NEG_INF)
        scores[:, 0] = 0.0  # one live slot: the K starts are one hypothesis
        rows[:, slots + 2 * K : slots + 3 * K] = rows[:, slots + 3 * K : slots + 4 * K] = scores
        settings = slots + 4 * K  # then its settings and stopping rule
        for i, (entry, _) in enumerate(joining):
            rows[i, settings : settings + len(PARAMS)] = sentence_params(
                entry.options, entry.max_len, entry.pool
            )
            rows[i, settings + len(PARAMS) :] = sentence_rules(entry.options)
        self._upload("join_sentences", rows.T, "search")

    def _empty_state(self) -> dict[str, Any]:
        """The outputs of a step of no sentences: what the first step continues (made once a
        shape: they are read, never written)."""
        key = (self._D, self.shape.coverage)
        if key not in self._empties:
            empty: dict[str, np.ndarray] = {
                "out_sentences": np.zeros((self.width, 0), np.float64),
                "new_state": np.zeros((0, self._D), np.float32),
            }
            if self.shape.coverage:
                empty["out_coverage"] = np.zeros((0, 0), np.float32)
            values = {name: self.device.upload(a, "state") for name, a in empty.items()}
            self._empties[key] = values
        return dict(self._empties[key])

    @property
    def width(self) -> int:
        """W: a sentence's row of `sentences` (search_graph: its fields, n-best and slots)."""
        return sentence_width(self._beam_size)

    def _bind_history(self) -> None:
        history = self.history
        fields, attention = history.fields, history.attention
        assert fields is not None and attention is not None
        self.device.bind_in_place(self.binding, "history", fields, np.float32, history.fields_shape)
        self.device.bind_in_place(
            self.binding, "attention_history", attention, np.float32, history.shape
        )
        self._bound["history"] = (fields, history.shape)

    def _take_outputs(self) -> None:
        """This step's outputs become the next step's inputs. The binding's outputs are in the
        order first bound: the histories (bound in place with their inputs), then these, then
        done."""
        outputs = self.device.outputs(self.binding)
        self._state = {name: outputs[2 + i] for i, name in enumerate(self._outputs)}

    @property
    def _outputs(self) -> tuple[str, ...]:
        """The outputs a step makes for the next: new device tensors every step."""
        if self.shape.coverage:
            return ("out_sentences", "new_state", "out_coverage")
        return ("out_sentences", "new_state")

    def _bind_controls(self) -> None:
        """This step's controls as the graph's inputs: each row's forced token (a prefix's, -1
        for none) and the (row, token) pairs blocked (suppressed tokens; the end of sentence
        before the minimum length), from the controlled sentences' own steps."""
        K = self._beam_size
        forced = np.full(len(self._entries) * K, -1, np.int64)  # (N,)
        pairs: list[np.ndarray] = []
        for b in self._controlled:
            controls, step = self._entries[b].controls, int(self._steps[b])
            if step < len(controls.prefix):  # forced: nothing else applies
                forced[b * K : (b + 1) * K] = controls.prefix[step]
                continue
            tokens = [seq[0] for seq in controls.suppress]
            if step < controls.min_length:
                tokens.append(self.eos_id)
            if tokens:
                rows = np.repeat(np.arange(b * K, (b + 1) * K), len(tokens))
                pairs.append(np.stack([rows, np.tile(tokens, K)], axis=1))
        blocked = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)  # (P, 2)
        self._upload("forced", forced, "tokens")
        self._upload("blocked", blocked.astype(np.int64), "tokens")

    def _switch(self, shape: SearchShape) -> None:
        """To the step's graph with the coverage kept or not, with the controls or not: a batch
        whose last sentence with a coverage penalty (controls) left stops paying for it. The
        coverage starts at zero: it matters only to the sentences with the penalty, which join
        with the switch."""
        coverage = shape.coverage
        self.shape = shape
        self.session = self.model.search_session(shape)
        self.binding = self.session.io_binding()
        self._bound = {}
        if self._state is not None and coverage != ("out_coverage" in self._state):
            if coverage:
                N = int(self._state["new_state"].shape()[0])
                zeros = np.zeros((N, 0), np.float32)
                self._state["out_coverage"] = self.device.upload(zeros, "state")
            else:
                self._state.pop("out_coverage", None)
            self._S_prev = 0

    # --- finished sentences ----------------------------------------------------------------------

    def _finish(self, rows: np.ndarray) -> list[tuple[Hashable, list[Hypothesis]]]:
        """The n-best lists of the sentences in rows (D,) of the batch, back-traced together."""
        K = self._beam_size
        fields, history, attention, where = self._finished_rows(rows)
        entries: list[tuple[int, int, float, float]] = []  # (d, code, score, raw) best first
        for d, b in enumerate(rows.tolist()):
            values = fields[d].tolist()  # (W,)
            n = SENTENCE_FIELDS
            scores, raw, codes = values[n : n + K], values[n + K : n + 2 * K], values[n + 2 * K :]
            keep = min(self._entries[b].keep, K)
            entries += [
                (d, int(codes[j]), scores[j], raw[j]) for j in range(keep) if scores[j] > NEG_INF
            ]
        paths = backtrace(history, where[[d for d, *_ in entries]], [c for _, c, *_ in entries])
        out: dict[int, list[Hypothesis]] = {d: [] for d in range(len(rows))}
        for e, (d, _, score, raw) in enumerate(entries):
            entry = self._entries[int(rows[d])]
            out[d].append(paths.hypothesis(e, score, raw, attention, where[d], entry))
        return [(self._entries[int(b)].id, out[d]) for d, b in enumerate(rows)]

    def _finished_rows(
        self, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The finished sentences' fields (D, W) float64, and the histories (·, T, 2, K) and
        attention rows (·, T, K, S) float32 that hold theirs, at rows `where` (D,) (T: the most
        steps among them): the pool's buffers themselves where the device's memory is the host's,
        else the sentences' rows gathered on the device and copied down once."""
        history = self.history
        assert self._state is not None and history.fields is not None
        assert history.attention is not None
        pools = np.array([self._entries[b].pool for b in rows.tolist()], np.int64)
        T = int(self._steps[rows].max())
        if self.on_host:  # the ledger counts what the finished gather would copy down
            columns = host_view(self._state["out_sentences"], (self.width, len(self._entries)))
            meta = host_view(history.fields, history.fields_shape)
            attention = host_view(history.attention, history.shape)
            _, _, K, S = attention.shape
            moved = len(rows) * (self.width * 8 + T * K * (2 + S) * 4)
            self.device.ledger.record("device_to_host", "hypotheses", moved)
            return columns[:, rows].T, meta, attention, pools
        session = self.model.search_helper("finished")
        binding = session.io_binding()
        self.device.bind_value(binding, "sentences", self._state["out_sentences"])
        self.device.bind_device_input(binding, "history", history.fields, history.fields_shape)
        self.device.bind_device_input(
            binding, "attention_history", history.attention, history.shape
        )
        self.device.bind_host_input(binding, "rows", rows.astype(np.int64), "indices")
        self.device.bind_host_input(binding, "pools", pools, "indices")
        for name, value in (("steps", T), ("zero", 0), ("one", 1)):
            self.device.bind_host_argument(binding, name, np.array([value], np.int64))
        for name in ("fields", "blocks", "attention"):
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        fields, blocks, attention = (v.numpy() for v in binding.get_outputs())
        moved = fields.nbytes + blocks.nbytes + attention.nbytes
        self.device.ledger.record("device_to_host", "hypotheses", moved)
        return fields, blocks, attention, np.arange(len(rows))


@dataclass(frozen=True)
class Paths:
    """Finished hypotheses back-traced: for entry e, its tokens, back-pointers and slots at each
    step t < steps[e] (E, T) int64 each."""

    tokens: np.ndarray
    parents: np.ndarray
    slots: np.ndarray
    steps: np.ndarray  # (E,)
    by_eos: np.ndarray  # (E,) bool
    log_probs: np.ndarray  # (E, T) float32

    def hypothesis(
        self, e: int, score: float, raw: float, attention: np.ndarray, row: int, entry: _Entry
    ) -> Hypothesis:
        """Entry e as a Hypothesis; its attention rows from attention (·, T, K, S) at `row`."""
        T = int(self.steps[e])
        rows = None
        if entry.options.return_attention:
            at = np.arange(T)
            rows = attention[row, at, self.parents[e, :T], : entry.src_len]  # (T, src_len)
        return Hypothesis(
            tokens=self.tokens[e, :T].tolist(),
            score=score,
            log_prob=raw,
            attention=rows,
            finished_by_eos=bool(self.by_eos[e]),
            token_log_probs=self.log_probs[e, :T],
        )


def backtrace(history: np.ndarray, rows: np.ndarray, codes: Sequence[int]) -> Paths:
    """The paths of E finished hypotheses from the histories (·, T, 2, K) at rows (E,) and their
    n-best codes (slot + CODE·(2·steps + by_eos)), all at once: a step back for every entry per
    numpy call (the same loop in Python per entry costs ~10 µs each, and a static batch finishes
    hundreds together).

    Step t's column holds each new slot's token and back-pointer (code = token · CODE + parent)
    and that token's log-prob; the attention row that produced a slot's token is its parent's
    (beam.py's _History.backtrace)."""
    code = np.asarray(codes, np.int64)  # (E,)
    slot, rest = code % CODE, code // CODE
    steps, by_eos = rest // 2, (rest % 2).astype(bool)
    E, T = len(code), int(steps.max(initial=0))
    tokens = np.zeros((E, T), np.int64)
    parents = np.zeros((E, T), np.int64)
    slots = np.zeros((E, T), np.int64)
    at = np.arange(E)
    if E < VECTOR_ENTRIES:  # a few entries: each in Python, over small lists
        for e in range(E):
            row = history[rows[e], : steps[e], 0].astype(np.int64).tolist()  # (steps, K)
            tokens[e, : steps[e]], parents[e, : steps[e]], slots[e, : steps[e]] = _chase(
                row, int(slot[e])
            )
    else:  # many: a step back for all of them per numpy call
        table = history[rows[:, None], np.arange(T)[None, :], 0].astype(np.int64)  # (E, T, K)
        for t in range(T - 1, -1, -1):
            token, parent = np.divmod(table[at, t, slot], CODE)  # (E,) each
            tokens[:, t], parents[:, t], slots[:, t] = token, parent, slot
            slot = np.where(t < steps, parent, slot)  # entries shorter than t stay put
    log_probs = history[rows[:, None], np.arange(T)[None, :], 1][at[:, None], np.arange(T), slots]
    return Paths(tokens, parents, slots, steps, by_eos, log_probs.astype(np.float32, copy=False))


VECTOR_ENTRIES = 16  # from this many finished hypotheses on, `backtrace` goes step by step


def _chase(codes: list[list[int]], slot: int) -> tuple[list[int], list[int], list[int]]:
    """One hypothesis's tokens, back-pointers and slots from its history's codes (T, K), its
    slot at the last step."""
    T = len(codes)
    tokens, parents, slots = [0] * T, [0] * T, [0] * T
    for t in range(T - 1, -1, -1):
        slots[t] = slot
        tokens[t], parents[t] = divmod(codes[t][slot], CODE)
        slot = parents[t]
    return tokens, parents, slots


def as_ortvalue(value: Any) -> ort.OrtValue:
    """An OrtValue of a value `Device.outputs` gave (C-level where onnxruntime exposes them)."""
    return value if isinstance(value, ort.OrtValue) else ort.OrtValue(value)
