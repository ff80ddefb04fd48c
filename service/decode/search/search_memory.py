"""Where the device search's tensors live, and how the host picks and reads them: one protocol,
two implementations, chosen once per search (`search_memory`).

- `HostMemory`: the device's memory is the host's (the CPU provider with its numpy row writes,
  service/decode/runtime/device.py's HostRowOps): the batch is picked with numpy over the last step's
  outputs in place, and finished sentences are read in place, with nothing copied.
- `DeviceMemory`: elsewhere (a GPU): the batch is picked by `select_graph` on the device (only the
  index array and the joining sentences' rows go up), the history grows by `grow_graph`, and the
  finished sentences are gathered by `finished_graph` and copied down once.

`state` is the search's next-step inputs by name (service/decode/search/device_search.py's `_state`):
`sentences` (W, B) and `settings` (P, B) float64, a column per sentence; `tokens` and `reorder`
(B·K,) int64, K rows per sentence.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from service.decode.runtime.device import Device, host_view
from service.decode.runtime.row_ops import HostRowOps, RowUpdates
from service.decode.runtime.runtime import OnnxModel

State = dict[str, Any]  # the search's device tensors by name
Finished = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SearchMemory(Protocol):
    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        """A float32 buffer of `shape` (zeros where the host writes it)."""
        ...

    def refit(
        self, old: ort.OrtValue, have: tuple[int, ...], shape: tuple[int, ...]
    ) -> ort.OrtValue:
        """A float32 buffer of `shape` (P, L, Y, X) holding old's entries, read as `have` (cut to
        its last axis where shorter)."""
        ...

    def select(
        self, state: State, kept: np.ndarray, joins: dict[str, np.ndarray], B_prev: int,
        K: int, W: int, P: int,
    ) -> None:  # fmt: skip
        """The next step's sentences (W, B), tokens, back-pointers (B·K,) and settings (P, B) in
        `state`: the last step's sentences `kept` (B',) (indices into its B_prev), then the
        joining ones' `joins` (each a host array of theirs; {} when none join)."""
        ...

    def finished(
        self, state: State, history: Any, rows: np.ndarray, pools: np.ndarray, T: int, W: int,
        attention: bool,
    ) -> Finished:  # fmt: skip
        """The finished sentences' fields (D, W) float64, and the histories (·, T, 2, K) and
        attention rows (·, T, K, S) float32 that hold theirs, and where (D,) theirs are in
        them: sentences at batch rows `rows` (D,), of history rows `pools` (D,)."""
        ...


class HostMemory:
    def __init__(self, device: Device) -> None:
        self.device = device

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))

    def refit(
        self, old: ort.OrtValue, have: tuple[int, ...], shape: tuple[int, ...]
    ) -> ort.OrtValue:
        new = np.zeros(shape, np.float32)
        P, L, Y, X = have
        X = min(X, shape[3])
        new[:P, :L, :Y, :X] = host_view(old, have)[..., :X]
        return ort.OrtValue.ortvalue_from_numpy(new)

    def select(
        self, state: State, kept: np.ndarray, joins: dict[str, np.ndarray], B_prev: int,
        K: int, W: int, P: int,
    ) -> None:  # fmt: skip
        """With numpy over the last step's outputs (or from the joining rows alone, at a batch's
        first step). `compaction_order` leaves the survivors among the first B' in place and fills
        the holes from beyond them: the prefix is one copy, the holes a few."""
        Bk = len(kept)
        holes = np.flatnonzero(kept != np.arange(Bk))
        sources = kept[holes]
        n = len(joins["tokens"]) if joins else 0
        for name, rows in (("sentences", W), ("settings", P)):  # a column per sentence
            out = np.empty((rows, Bk + n))
            if Bk:
                previous = host_view(state[name], (rows, B_prev))
                out[:, :Bk] = previous[:, :Bk]
                if len(holes):
                    out[:, holes] = previous[:, sources]
            if n:
                out[:, Bk:] = joins[name]
            state[name] = self.device.wrap(out)
        for name in ("tokens", "reorder"):  # K rows per sentence
            flat = np.empty((Bk + n, K), np.int64)
            if Bk:
                previous = host_view(state[name], (B_prev, K))
                flat[:Bk] = previous[:Bk]
                if len(holes):
                    flat[holes] = previous[sources]
            if n:
                flat[Bk:] = joins[name]
            state[name] = self.device.wrap(flat.reshape(-1))

    def finished(
        self, state: State, history: Any, rows: np.ndarray, pools: np.ndarray, T: int, W: int,
        attention: bool,
    ) -> Finished:  # fmt: skip
        """Read in place; the ledger counts what the finished gather would copy down."""
        _, _, K, S = history.shape
        B = int(state["sentences"].shape()[1])
        sentences = host_view(state["sentences"], (W, B))
        blocks = host_view(history.fields, history.fields_shape)
        rows_attention = (
            host_view(history.attention, history.shape)
            if attention
            else np.zeros((0, 0, K, 0), np.float32)
        )
        moved = len(rows) * (W * 8 + T * K * (2 + (S if attention else 0)) * 4)
        self.device.ledger.record("device_to_host", "hypotheses", moved)
        return sentences[:, rows].T, blocks, rows_attention, pools


class DeviceMemory:
    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self.device = model.device
        self.host = HostMemory(model.device)  # a batch's first pick: nothing on the device yet

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return self.device.empty(shape, np.float32)

    def refit(
        self, old: ort.OrtValue, have: tuple[int, ...], shape: tuple[int, ...]
    ) -> ort.OrtValue:
        device = self.device
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

    def select(
        self, state: State, kept: np.ndarray, joins: dict[str, np.ndarray], B_prev: int,
        K: int, W: int, P: int,
    ) -> None:  # fmt: skip
        """By `select_graph`: only the index array and the joining sentences' rows go up."""
        if "sentences" not in state:  # a batch's first step: the joining rows alone
            self.host.select(state, kept, joins, B_prev, K, W, P)
            return
        device = self.device
        session = self.model.search_helper("select")
        binding = session.io_binding()
        n = len(joins["tokens"]) if joins else 0
        sent_select = np.concatenate([kept, B_prev + np.arange(n)]).astype(np.int64)
        device.bind_host_argument(binding, "sent_select", sent_select)
        empty = {
            "sentences": np.zeros((W, 0)), "tokens": np.zeros((0, K), np.int64),
            "reorder": np.zeros((0, K), np.int64), "settings": np.zeros((P, 0)),
        }  # fmt: skip
        shapes = {
            "sentences": (W, B_prev), "tokens": (B_prev * K,), "reorder": (B_prev * K,),
            "settings": (P, B_prev),
        }  # fmt: skip
        for name, shape in shapes.items():
            device.bind_device_input(binding, name, state[name], shape)
            device.bind_host_argument(binding, f"join_{name}", joins.get(name, empty[name]))
            binding.bind_output(f"out_{name}", device.type, device.id)
        session.run_with_iobinding(binding)
        for name, value in zip(shapes, binding.get_outputs(), strict=True):
            state[name] = value

    def finished(
        self, state: State, history: Any, rows: np.ndarray, pools: np.ndarray, T: int, W: int,
        attention: bool,
    ) -> Finished:  # fmt: skip
        """Gathered on the device by `finished_graph` and copied down in one transfer."""
        device = self.device
        _, _, K, _ = history.shape
        session = self.model.search_helper("finished" if attention else "finished_plain")
        binding = session.io_binding()
        device.bind_value(binding, "sentences", state["sentences"])
        device.bind_device_input(binding, "history", history.fields, history.fields_shape)
        if attention:
            device.bind_device_input(binding, "attention_history", history.attention, history.shape)
        device.bind_host_input(binding, "rows", rows.astype(np.int64), "indices")
        device.bind_host_input(binding, "pools", pools, "indices")
        for name, value in (("steps", T), ("zero", 0), ("one", 1)):
            device.bind_host_argument(binding, name, np.array([value], np.int64))
        names = ("fields", "blocks", "attention") if attention else ("fields", "blocks")
        for name in names:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        arrays = [v.numpy() for v in binding.get_outputs()]
        device.ledger.record("device_to_host", "hypotheses", sum(a.nbytes for a in arrays))
        rows_attention = arrays[2] if attention else np.zeros((0, 0, K, 0), np.float32)
        return arrays[0], arrays[1], rows_attention, np.arange(len(rows))


def search_memory(model: OnnxModel, row_ops: RowUpdates) -> SearchMemory:
    """The memory of a model's device search, chosen once: the host's where its row ops are."""
    return HostMemory(model.device) if isinstance(row_ops, HostRowOps) else DeviceMemory(model)
