"""The running batch's rows: its encoder tensors in device buffers with spare capacity (EncoderRows),
the decoder's declared states (DeclaredStates), and reusable host buffers (HostBuffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from service.decode.runtime.device import host_view
from service.decode.runtime.encoded import EncodedSentence, first_widths
from service.decode.runtime.encoder_layers import (
    HostLayerRows,
    LayerSlice,
    layer_slices,
)
from service.decode.runtime.row_ops import HostRowOps, RowUpdates
from service.model.architecture import ModelConfig, StateSpec


class EncoderRows:
    """The running batch's encoder tensors, one row per sentence, in device buffers with spare capacity.

    Sentences join and leave between almost every step under load, so rows are written and compacted
    in place on the device (`RowOps`) rather than rebuilt on the host and uploaded: a join uploads
    only the joining rows (at their own length; the device pads them), a leave moves only the rows
    whose place changes (the search's `compaction_order` keeps that to one per row dropped), and
    nothing else crosses. The source axis is the longest source present (shorter rows are masked)
    and shrinks when the remaining sentences need at most half of it. Rows at and beyond `count`
    hold nothing the step reads: it is bound to the leading `count` rows.
    """

    def __init__(
        self,
        ops: RowUpdates,
        keys_follow_source: bool,
        cutter: Callable[[tuple[LayerSlice, ...]], ort.InferenceSession] | None = None,
    ) -> None:
        self.ops = ops
        self.keys_follow_source = keys_follow_source  # False for attention "none": keys (B, 1, Dk)
        self.count = 0
        self.version = (
            0  # counts the changes to the rows (a leave and a join keep count and buffers)
        )
        # the layer parts of keys and values that sessions read (service/decode/runtime/encoder_layers.py),
        # cut from the rows of `version` by the session `cutter` gives, on the device
        self.cutter = cutter
        self._parts: dict[tuple[LayerSlice, ...], list[Any]] = {}
        self._parts_version = -1
        # on the CPU provider the parts are kept row by row instead (HostLayerRows): cut as
        # sentences join, moved as they leave
        self.host_parts = isinstance(ops, HostRowOps)
        self._kept: dict[tuple[LayerSlice, ...], HostLayerRows] = {}
        # values (capacity, S, D), keys (capacity, S or 1, Dk), mask (capacity, S) bool, on the device
        self.buffers: list[ort.OrtValue] | None = None
        self.lengths = np.zeros(0, np.int64)  # (capacity,) real source length per row, on the host
        self.D = self.Dk = self.key_len = 0

    @property
    def capacity(self) -> int:
        return len(self.lengths)

    @property
    def source_len(self) -> int:
        return 0 if self.buffers is None else int(self.buffers[2].shape()[1])

    def shapes(self, rows: int, S: int | None = None) -> list[tuple[int, ...]]:
        """The buffers' shapes over `rows` rows (and source length S, by default the current one)."""
        S = self.source_len if S is None else S
        key_len = S if self.keys_follow_source else self.key_len
        return [(rows, S, self.D), (rows, key_len, self.Dk), (rows, S)]

    def append(
        self, sentences: Sequence[EncodedSentence], state: ort.OrtValue | None = None
    ) -> ort.OrtValue:
        """Write joining sentences' rows after the current ones, and return the decoder `state`
        (R, D) on the device (None: none yet) with the sentences' initial states after it.

        Rows left on the device by the encoder are copied there (`RowOps.gather_append`, one call
        per run of sentences of the same encoder call): only indices cross. Host rows cross at
        their own length (the device pads them)."""
        n, S_new = len(sentences), max(s.length for s in sentences)
        first = sentences[0]
        self.version += 1
        if self.buffers is None:
            self.D, self.Dk, self.key_len = first_widths(first)
            capacity = max(16, 2 * n)
            self.buffers = [
                self.ops.empty(shape, dtype)
                for shape, dtype in zip(
                    self.shapes(capacity, S_new), (np.float32, np.float32, np.bool_), strict=True
                )
            ]
            self.lengths = np.zeros(capacity, np.int64)
        elif self.count + n > self.capacity or S_new > self.source_len:
            self.refit(max(self.capacity, 2 * (self.count + n)), max(self.source_len, S_new))
        assert self.buffers is not None
        if state is None:
            empty = np.zeros((0, first.state_width), np.float32)  # (0, D_state)
            state = self.ops.device.upload(empty, "state")
        first_row = self.count
        if all(s.on_device for s in sentences):
            joined = self._gather(sentences, state)
        else:
            joined = self._upload(sentences, state)
        assert joined is not None
        if self._kept:
            stacked = self._stacked_views()
            for kept in self._kept.values():
                kept.write(stacked, first_row, self.count)
        return joined

    def _gather(self, sentences: Sequence[EncodedSentence], state: ort.OrtValue) -> ort.OrtValue:
        """Device rows: one gather per run of sentences of the same encoder call."""
        assert self.buffers is not None
        start = 0
        while start < len(sentences):
            batch = sentences[start].batch
            end = start
            while end < len(sentences) and sentences[end].batch is batch:
                end += 1
            assert batch is not None
            run = sentences[start:end]
            index = np.array([s.row for s in run], np.int64)  # (r,)
            self.lengths[self.count : self.count + len(run)] = [s.length for s in run]
            state = self.ops.gather_append(
                self.buffers, self.shapes(self.capacity), self.count, batch.tensors, index, state
            )
            self.count += len(run)
            start = end
        return state

    def _upload(
        self, sentences: Sequence[EncodedSentence], state: ort.OrtValue
    ) -> ort.OrtValue | None:
        """Host rows, uploaded at their own length, their initial states after `state`."""
        assert self.buffers is not None
        n, S_new = len(sentences), max(s.length for s in sentences)
        first = sentences[0]
        if n == 1:  # one sentence (the usual join under load): its own arrays, no padding
            values, keys = first.values[None], first.keys[None]  # (1, S_i, D), (1, S_i or 1, Dk)
            mask = np.ones((1, first.length), np.bool_)  # (1, S_i)
            self.lengths[self.count] = first.length
        else:  # the joining rows, zero-padded to the longest of them
            values_shape, keys_shape, mask_shape = self.shapes(n, S_new)
            values = np.zeros(values_shape, np.float32)  # (n, S_new, D)
            keys = np.zeros(keys_shape, np.float32)  # (n, S_new or 1, Dk)
            mask = np.zeros(mask_shape, np.bool_)  # (n, S_new)
            for i, sentence in enumerate(sentences):
                values[i, : sentence.length] = sentence.values
                keys[i, : sentence.keys.shape[0]] = sentence.keys
                mask[i, : sentence.length] = True
                self.lengths[self.count + i] = sentence.length
        new_state = np.stack([s.state for s in sentences])  # (n, D_state)
        joined = self.ops.append(
            self.buffers,
            self.shapes(self.capacity),
            self.count,
            [values, keys, mask],
            state,
            new_state,
        )
        self.count += n
        return joined

    def keep(self, keep: np.ndarray) -> None:
        """Keep the rows `keep` (B',), in that order."""
        self.version += 1
        if len(keep) == 0:
            self.count = 0
            self.buffers = None
            self.lengths = np.zeros(0, np.int64)
            self._kept = {}
            return
        assert self.buffers is not None
        moved = np.flatnonzero(keep != np.arange(len(keep)))  # only the rows that change place
        if len(moved):
            sources = keep[moved]
            self.ops.move(self.buffers, self.shapes(self.count), sources, moved)
            self.lengths[moved] = self.lengths[sources]
            for kept in self._kept.values():
                kept.move(sources, moved)
        self.count = len(keep)
        needed = int(self.lengths[: self.count].max())
        if needed <= self.source_len // 2:
            self.refit(self.capacity, needed)

    def refit(self, capacity: int, S: int) -> None:
        """New device buffers of (capacity, S, ·) holding the current rows, cut or zero-padded to S."""
        assert self.buffers is not None
        self.version += 1
        self.buffers = self.ops.refit(
            self.buffers, self.shapes(self.count), self.shapes(capacity, S)
        )
        for kept in self._kept.values():
            kept.refit(self.count, capacity, S)
        lengths = np.zeros(capacity, np.int64)
        lengths[: self.count] = self.lengths[: self.count]
        self.lengths = lengths

    def binding_key(self) -> tuple[int, ...]:
        """What `bind` binds: while it is unchanged, a binding made by `bind` still holds (the
        version: the layer parts are cut anew at every change of the rows)."""
        assert self.buffers is not None
        buffers = (b.data_ptr() for b in self.buffers)
        return (self.version, self.count, *buffers, *self.buffers[2].shape())

    def bind(self, binding: ort.IOBinding, session: ort.InferenceSession) -> None:
        """Bind the live rows as `session`'s values (B, S, D), keys, mask (B, S) (no copy), and the
        layer parts of keys and values it reads (cut when the rows have changed since the last
        cut)."""
        assert self.buffers is not None
        device = self.ops.device
        for name, buffer, shape in zip(
            ("values", "keys", "mask"), self.buffers, self.shapes(self.count), strict=True
        ):
            device.bind_device_input(binding, name, buffer, shape)
        parts = layer_slices(arg.name for arg in session.get_inputs())
        if parts and self.host_parts:
            kept = self._kept_parts(parts)
            for part, value, shape in zip(parts, kept.values, kept.shapes(self.count), strict=True):
                device.bind_device_input(binding, part.name, value, shape)
        elif parts:
            for part, value in zip(parts, self._cut(parts), strict=True):
                device.bind_value(binding, part.name, value)

    def _kept_parts(self, parts: tuple[LayerSlice, ...]) -> HostLayerRows:
        """The parts kept row by row (HostLayerRows), every live row cut the first time."""
        kept = self._kept.get(parts)
        if kept is None:
            kept = self._kept[parts] = HostLayerRows(parts, self.capacity, self.source_len)
            kept.write(self._stacked_views(), 0, self.count)
        return kept

    def _stacked_views(self) -> dict[str, np.ndarray]:
        """The stacked rows' buffers, values (capacity, S, D) and keys, viewed in host memory."""
        assert self.buffers is not None
        shapes = self.shapes(self.capacity)
        values, keys = (host_view(self.buffers[i], shapes[i]) for i in (0, 1))
        return {"values": values, "keys": keys}

    def _cut(self, parts: tuple[LayerSlice, ...]) -> list[Any]:
        """The layer parts of the live rows' keys and values, on the device: one run of the
        cutter's graph per change of the rows (and set of parts)."""
        assert self.buffers is not None and self.cutter is not None
        if self._parts_version != self.version:
            self._parts, self._parts_version = {}, self.version
        cut = self._parts.get(parts)
        if cut is None:
            session = self.cutter(parts)
            binding, device = session.io_binding(), self.ops.device
            sources = {part.source for part in parts}
            for name, buffer, shape in zip(
                ("values", "keys"), self.buffers, self.shapes(self.count), strict=False
            ):
                if name in sources:
                    device.bind_device_input(binding, name, buffer, shape)
            for part in parts:
                device.bind_new_output(binding, part.name)
            session.run_with_iobinding(binding)
            cut = self._parts[parts] = list(device.outputs(binding))
        return cut


class DeclaredStates:
    """A running batch's declared decoder state tensors beside `state` (ModelConfig.decoder_states:
    service/model/graph_contract.py), one row per row of `state`: joined at zeros, reordered by the
    step itself, each written anew by it (`new_<name>`). `positions` (R,) int64 are the state rows'
    tokens decoded so far, which a step that reads a growing tensor is given (its rows' entries
    are the last `positions` of its L); the growing axis is cut to what the rows still read once
    it is twice that (each step adds an entry to every row).

    `lazy_join` (every tensor growing, and `state` zero wide: a Transformer's): a joining
    sentence's rows get no rows of zeros appended to every cache (a copy of all of them, at nearly
    every step under a steady load); until the step writes their first entries they read row 0's,
    all masked (their positions are 0), through `cache_reorder`."""

    def __init__(
        self, specs: Sequence[StateSpec], ops: RowUpdates, lazy_join: bool = False
    ) -> None:
        self.specs = tuple(specs)
        self.ops = ops
        self.growing = any(spec.growing for spec in self.specs)
        self.lazy_join = lazy_join and all(spec.growing for spec in self.specs)
        self.values: dict[str, ort.OrtValue] = {}  # by name: StateSpec's shapes
        self.positions = np.zeros(0, np.int64)  # (R,)

    @classmethod
    def of(cls, cfg: ModelConfig, ops: RowUpdates) -> DeclaredStates | None:
        """The architecture's declared tensors (None where it declares none: the RNNs), joined
        lazily where `state` has no columns."""
        if not cfg.decoder_states:
            return None
        return cls(cfg.decoder_states, ops, lazy_join=cfg.state_dim == 0)

    @property
    def rows(self) -> int:
        """The rows the tensors hold (fewer than `positions` after a lazy join)."""
        return int(next(iter(self.values.values())).shape()[0]) if self.values else 0

    def join(self, n: int) -> None:
        """n joining sentences' rows, after the others (as `state`'s)."""
        self.positions = np.concatenate([self.positions, np.zeros(n, np.int64)])
        if self.lazy_join and self.rows:
            return
        for spec in self.specs:
            value = self.values.get(spec.name)
            if value is None:
                empty = np.zeros(spec.shape(0, 0), np.float32)
                value = self.ops.device.upload(empty, "state")
            self.values[spec.name] = self.ops.zero_rows(value, n)

    def arrange(self, reorder: np.ndarray, lengths: np.ndarray) -> None:
        """Nothing before a step: the step's graph gathers the tensors by the back-pointers."""

    def cache_reorder(self, reorder: np.ndarray) -> np.ndarray:
        """The step's reorder over the rows the tensors hold: a row joined lazily reads row 0."""
        return np.where(reorder < self.rows, reorder, 0) if self.lazy_join else reorder

    def bind(self, binding: ort.IOBinding, positions: np.ndarray | None = None) -> None:
        """The tensors as the step's inputs, and its positions (N,) where given (a step that
        computes them itself: the device search's, from its sentences' steps, binds none)."""
        device = self.ops.device
        for spec in self.specs:
            device.bind_value(binding, spec.name, self.values[spec.name])
        if positions is not None and self.growing:
            device.bind_host_input(binding, "positions", positions, "tokens")

    def bind_outputs(self, binding: ort.IOBinding) -> None:
        device = self.ops.device
        for spec in self.specs:
            device.bind_new_output(binding, "new_" + spec.name)  # on the device

    def stepped(self, outputs: Sequence[ort.OrtValue], positions: np.ndarray) -> None:
        """A step's `new_<name>` outputs (in `specs`' order) and the positions it read: theirs
        after it (one more token each); the growing axis cut where half of it is unread."""
        self.values = {s.name: v for s, v in zip(self.specs, outputs, strict=True)}
        self.positions = positions + 1
        self.cut(int(self.positions.max(initial=0)))

    def cut(self, needed: int) -> None:
        """Each growing tensor cut to its last `needed` entries where it holds twice as many."""
        for spec in self.specs:
            value = self.values.get(spec.name)
            if spec.growing and value is not None and int(value.shape()[-2]) >= max(2 * needed, 8):
                self.values[spec.name] = self.ops.keep_last(value, needed)

    def reset(self) -> None:
        self.values = {}
        self.positions = np.zeros(0, np.int64)


class HostBuffer:
    """A reusable host array that a step's output is copied into; grows, never shrinks."""

    def __init__(self, dtype: type) -> None:
        self.flat: np.ndarray = np.zeros(0, dtype)
        self.generation = 0  # counts the reallocations: a binding to an older array is stale

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        if size > len(self.flat):
            self.flat = np.zeros(max(size, 2 * len(self.flat)), self.flat.dtype)
            self.generation += 1
        return self.flat[:size].reshape(shape)
