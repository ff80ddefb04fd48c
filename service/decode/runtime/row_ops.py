"""The running batch's rows updated in place on the device: joins appended (with their gathered
rows), leaves moved out, buffers refit, states zeroed or cut, as small ONNX graphs (`RowOps`) or,
where the device memory is the host's, as numpy writes (`HostRowOps`); `RowUpdates` is what both do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from service.decode.runtime.device import BUFFERS, NUMPY_TYPE, Device, host_view, numpy_dtype
from service.decode.runtime.graph_bytes import graph_bytes
from service.decode.runtime.graph_nodes import BOOL, FLOAT, INT64


def _dims(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(rank)]


def _pad(dtype: int, x: str, pads: str, out: str) -> list[onnx.NodeProto]:
    """Zero-pad x by pads into out. A bool tensor is padded as float: ONNX Runtime's CUDA Pad
    kernel is registered for float, double and float16 only, and a node it cannot place runs on
    the CPU behind hidden copies (the mask is a small tensor: the casts cost next to nothing)."""
    if dtype != BOOL:
        return [helper.make_node("Pad", [x, pads], [out])]
    return [
        helper.make_node("Cast", [x], [f"{x}_f"], to=FLOAT),
        helper.make_node("Pad", [f"{x}_f", pads], [f"{out}_f"]),
        helper.make_node("Cast", [f"{out}_f"], [out], to=BOOL),
    ]


def append_graph(with_state: bool = False) -> bytes:
    """buffers (C, S, ·), rows (n, 1), new rows (n, S_i, ·), pads (2·rank,) → the buffers with the
    new rows zero-padded to S and written at `rows` (outputs bound to the inputs' memory). With
    `with_state` (the join graph), also state (R, D), new_state (n, D) → out_state (R + n, D)."""
    nodes, inputs, outputs = [], [], []
    inputs.append(helper.make_tensor_value_info("rows", INT64, ["n", 1]))
    for name, dtype, rank in BUFFERS:
        inputs += [
            helper.make_tensor_value_info(name, dtype, _dims(f"{name}_c", rank)),
            helper.make_tensor_value_info(f"new_{name}", dtype, _dims(f"{name}_n", rank)),
            helper.make_tensor_value_info(f"pads_{name}", INT64, [2 * rank]),
        ]
        nodes += _pad(dtype, f"new_{name}", f"pads_{name}", f"padded_{name}")
        nodes.append(
            helper.make_node("ScatterND", [name, "rows", f"padded_{name}"], [f"out_{name}"])
        )
        outputs.append(
            helper.make_tensor_value_info(f"out_{name}", dtype, _dims(f"{name}_c", rank))
        )
    if with_state:
        inputs += [
            helper.make_tensor_value_info("state", FLOAT, ["R", "D"]),
            helper.make_tensor_value_info("new_state", FLOAT, ["n", "D"]),
        ]
        nodes.append(helper.make_node("Concat", ["state", "new_state"], ["out_state"], axis=0))
        outputs.append(helper.make_tensor_value_info("out_state", FLOAT, ["M", "D"]))
    return graph_bytes(nodes, "join_rows" if with_state else "append_rows", inputs, outputs)


def gather_join_graph() -> bytes:
    """buffers (C, S, ·) bound in place, an encoder call's outputs src_* (Be, Se, ·) and its
    initial states src_state (Be, D), index (n,) of the joining sentences among them, rows (n, 1)
    of the buffers to write, ends (1,) and pads (2·rank,) per buffer, the decoder state (R, D) →
    the sentences' rows cut to S and zero-padded, written at `rows`; out_state (R + n, D): the
    state with theirs after it. The join of sentences whose encoder outputs never left the device."""
    nodes, inputs, outputs = [], [], []
    inputs += [
        helper.make_tensor_value_info("rows", INT64, ["n", 1]),
        helper.make_tensor_value_info("index", INT64, ["n"]),
        helper.make_tensor_value_info("starts", INT64, [1]),
        helper.make_tensor_value_info("axes", INT64, [1]),
    ]
    for name, dtype, rank in BUFFERS:
        inputs += [
            helper.make_tensor_value_info(name, dtype, _dims(f"{name}_c", rank)),
            helper.make_tensor_value_info(f"src_{name}", dtype, _dims(f"{name}_e", rank)),
            helper.make_tensor_value_info(f"ends_{name}", INT64, [1]),
            helper.make_tensor_value_info(f"pads_{name}", INT64, [2 * rank]),
        ]
        nodes += [
            helper.make_node("Gather", [f"src_{name}", "index"], [f"picked_{name}"], axis=0),
            helper.make_node(
                "Slice", [f"picked_{name}", "starts", f"ends_{name}", "axes"], [f"cut_{name}"]
            ),
        ]
        nodes += _pad(dtype, f"cut_{name}", f"pads_{name}", f"padded_{name}")
        nodes.append(
            helper.make_node("ScatterND", [name, "rows", f"padded_{name}"], [f"out_{name}"])
        )
        outputs.append(
            helper.make_tensor_value_info(f"out_{name}", dtype, _dims(f"{name}_c", rank))
        )
    inputs += [
        helper.make_tensor_value_info("state", FLOAT, ["R", "D"]),
        helper.make_tensor_value_info("src_state", FLOAT, ["Be", "D"]),
    ]
    nodes += [
        helper.make_node("Gather", ["src_state", "index"], ["new_state"], axis=0),
        helper.make_node("Concat", ["state", "new_state"], ["out_state"], axis=0),
    ]
    outputs.append(helper.make_tensor_value_info("out_state", FLOAT, ["M", "D"]))
    return graph_bytes(nodes, "gather_join_rows", inputs, outputs)


def move_graph() -> bytes:
    """buffers (B, S, ·), src (m,), dst (m, 1) → the buffers with rows src copied into rows dst
    (gathered before any write; outputs bound to the inputs' memory)."""
    nodes, inputs, outputs = [], [], []
    inputs.append(helper.make_tensor_value_info("src", INT64, ["m"]))
    inputs.append(helper.make_tensor_value_info("dst", INT64, ["m", 1]))
    for name, dtype, rank in BUFFERS:
        inputs.append(helper.make_tensor_value_info(name, dtype, _dims(f"{name}_b", rank)))
        nodes += [
            helper.make_node("Gather", [name, "src"], [f"moved_{name}"], axis=0),
            helper.make_node("ScatterND", [name, "dst", f"moved_{name}"], [f"out_{name}"]),
        ]
        outputs.append(
            helper.make_tensor_value_info(f"out_{name}", dtype, _dims(f"{name}_b", rank))
        )
    return graph_bytes(nodes, "move_rows", inputs, outputs)


def refit_graph() -> bytes:
    """live rows (B, S, ·), ends (1,) per buffer, pads (2·rank,) per buffer → new buffers: the rows
    cut to `ends` along the source axis, then zero-padded to the new capacity and source length."""
    nodes, inputs, outputs = [], [], []
    inputs += [
        helper.make_tensor_value_info("starts", INT64, [1]),
        helper.make_tensor_value_info("axes", INT64, [1]),
    ]
    for name, dtype, rank in BUFFERS:
        inputs += [
            helper.make_tensor_value_info(name, dtype, _dims(f"{name}_b", rank)),
            helper.make_tensor_value_info(f"ends_{name}", INT64, [1]),
            helper.make_tensor_value_info(f"pads_{name}", INT64, [2 * rank]),
        ]
        nodes += [
            helper.make_node("Slice", [name, "starts", f"ends_{name}", "axes"], [f"cut_{name}"]),
            helper.make_node("Pad", [f"cut_{name}", f"pads_{name}"], [f"out_{name}"]),
        ]
        outputs.append(
            helper.make_tensor_value_info(f"out_{name}", dtype, _dims(f"{name}_o", rank))
        )
    return graph_bytes(nodes, "refit_rows", inputs, outputs)


class RowUpdates(Protocol):
    """The running batch's row updates, one protocol over the two memories: `RowOps` (graphs on
    the model's device) and `HostRowOps` (numpy writes where the device's memory is the host's),
    chosen once per model (`make_row_ops`)."""

    device: Device

    def empty(self, shape: Sequence[int], dtype: type) -> ort.OrtValue: ...

    def append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        new_rows: Sequence[np.ndarray],
        state: ort.OrtValue | None = None,
        new_state: np.ndarray | None = None,
    ) -> ort.OrtValue | None: ...

    def gather_append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        sources: Sequence[Any],
        index: np.ndarray,
        state: Any,
    ) -> ort.OrtValue: ...

    def move(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        src: np.ndarray,
        dst: np.ndarray,
    ) -> None: ...

    def refit(
        self,
        buffers: Sequence[ort.OrtValue],
        live: Sequence[tuple[int, ...]],
        target: Sequence[tuple[int, ...]],
    ) -> list[ort.OrtValue]: ...

    def zero_rows(self, state: ort.OrtValue, n: int) -> ort.OrtValue:
        """A decoder state tensor (R, ...) with n rows of zeros after its own (R + n, ...): the
        joining sentences' start of a declared state (a growing one's: no entry of their own)."""
        ...

    def keep_last(self, state: ort.OrtValue, entries: int) -> ort.OrtValue:
        """A growing state tensor (R, [H,] L, W) cut to its last `entries` along L: those its
        rows still read (a row's entries are its last `positions`)."""
        ...


def zero_rows_graph(rank: int) -> bytes:
    """state (R, ...) of `rank` axes, n (1,) int64 → out (R + n, ...): n rows of zeros after."""
    dims = _dims("d", rank - 1)
    inputs = [
        helper.make_tensor_value_info("state", FLOAT, ["R", *dims]),
        helper.make_tensor_value_info("n", INT64, [1]),
    ]
    nodes = [
        helper.make_node("Shape", ["state"], ["shape"], start=1),
        helper.make_node("Concat", ["n", "shape"], ["zeros_shape"], axis=0),
        helper.make_node(
            "ConstantOfShape", ["zeros_shape"], ["zeros"],
            value=helper.make_tensor("zero", FLOAT, [1], [0.0]),
        ),
        helper.make_node("Concat", ["state", "zeros"], ["out"], axis=0),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info("out", FLOAT, ["M", *dims])]
    return graph_bytes(nodes, f"zero_rows_{rank}", inputs, outputs)


def keep_last_graph(rank: int) -> bytes:
    """state (R, ..., L, W) of `rank` axes, starts (1,) int64 → out (R, ..., L - starts, W): axis
    -2 from `starts` on."""
    inputs = [
        helper.make_tensor_value_info("state", FLOAT, ["R", *_dims("h", rank - 3), "L", "W"]),
        helper.make_tensor_value_info("starts", INT64, [1]),
    ]
    nodes = [
        helper.make_node("Constant", [], ["ends"], value=helper.make_tensor("e", INT64, [1], [2**62])),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("a", INT64, [1], [-2])),
        helper.make_node("Slice", ["state", "starts", "ends", "axes"], ["out"]),
    ]  # fmt: skip
    dims = ["R", *_dims("h", rank - 3), "K", "W"]
    outputs = [helper.make_tensor_value_info("out", FLOAT, dims)]
    return graph_bytes(nodes, f"keep_last_{rank}", inputs, outputs)


class RowOps:
    """The row graphs as sessions on the model's device (one thread each: they are tiny)."""

    def __init__(self, device: Device, providers: list[str], provider_options: list[dict]) -> None:
        self.device = device
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")

        def session(model: bytes) -> ort.InferenceSession:
            return ort.InferenceSession(
                model, sess_options=options, providers=providers, provider_options=provider_options
            )

        self.append_session = session(append_graph())
        self.join_session = session(append_graph(with_state=True))
        self.move_session = session(move_graph())
        self.refit_session = session(refit_graph())
        self.gather_join_session = session(gather_join_graph())
        self.zero_rows_sessions = {rank: session(zero_rows_graph(rank)) for rank in (2, 3, 4)}
        self.keep_last_sessions = {rank: session(keep_last_graph(rank)) for rank in (3, 4)}

    # --- the encoder buffers -------------------------------------------------------------------

    def empty(self, shape: Sequence[int], dtype: type) -> ort.OrtValue:
        """A new row buffer on the device (uninitialised)."""
        return self.device.empty(shape, dtype)

    def append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        new_rows: Sequence[np.ndarray],
        state: ort.OrtValue | None = None,
        new_state: np.ndarray | None = None,
    ) -> ort.OrtValue | None:
        """Write new_rows (values (n, S_i, D), keys (n, S_i or 1, Dk), mask (n, S_i)) into rows
        first_row.. of the buffers of full `shapes`, zero-padded on the device to their source axis.

        With the decoder `state` (R, D) on the device and the joining sentences' `new_state` (n, D)
        from the host, the same run returns state + new_state (R + n, D) on the device (only the
        new rows cross)."""
        n = int(new_rows[0].shape[0])
        session = self.append_session if state is None else self.join_session
        binding = session.io_binding()
        rows = np.arange(first_row, first_row + n, dtype=np.int64)[:, None]  # (n, 1)
        self.device.bind_host_input(binding, "rows", rows, "indices")
        for (name, dtype, rank), buffer, shape, new in zip(
            BUFFERS, buffers, shapes, new_rows, strict=True
        ):
            pads = np.zeros(2 * rank, np.int64)  # (begin..., end...)
            pads[rank + 1] = shape[1] - new.shape[1]  # pad the source axis at its end
            self.device.bind_in_place(binding, name, buffer, NUMPY_TYPE[dtype], shape)
            self.device.bind_host_input(binding, f"new_{name}", new, "encoder_rows")
            self.device.bind_host_input(binding, f"pads_{name}", pads, "indices")
        if state is None:
            session.run_with_iobinding(binding)
            return None
        assert new_state is not None
        binding.bind_ortvalue_input("state", state)
        self.device.bind_host_input(binding, "new_state", new_state, "state")
        binding.bind_output("out_state", self.device.type, self.device.id)
        session.run_with_iobinding(binding)
        return self.device.output(binding, len(BUFFERS))  # after the buffers' outputs

    def gather_append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        sources: Sequence[Any],
        index: np.ndarray,
        state: Any,
    ) -> ort.OrtValue:
        """Write rows index (n,) of an encoder call's outputs sources (values (Be, Se, D), keys
        (Be, Se or 1, Dk), mask (Be, Se), initial states (Be, D)), on the device, into rows
        first_row.. of the buffers of full `shapes`, cut or zero-padded to their source axis; returns
        the decoder `state` (R, D) with their states after it. Only the indices cross.

        Past a sentence's own length a row holds what the encoder wrote there (the mask says so,
        and the attention gives those positions weight 0: the answers are those of zeroed rows,
        tests/test_transfers.py's host reference checks it exactly)."""
        n = len(index)
        binding = self.gather_join_session.io_binding()
        rows = np.arange(first_row, first_row + n, dtype=np.int64)[:, None]  # (n, 1)
        self.device.bind_host_input(binding, "rows", rows, "indices")
        self.device.bind_host_input(binding, "index", index.astype(np.int64), "indices")
        self.device.bind_host_argument(binding, "starts", np.zeros(1, np.int64))
        self.device.bind_host_argument(binding, "axes", np.ones(1, np.int64))
        for (name, dtype, rank), buffer, shape, source in zip(
            BUFFERS, buffers, shapes, sources[:3], strict=True
        ):
            width = min(int(source.shape()[1]), shape[1])
            pads = np.zeros(2 * rank, np.int64)
            pads[rank + 1] = shape[1] - width  # pad the source axis at its end
            self.device.bind_in_place(binding, name, buffer, NUMPY_TYPE[dtype], shape)
            self.device.bind_value(binding, f"src_{name}", source)
            self.device.bind_host_argument(binding, f"ends_{name}", np.array([width], np.int64))
            self.device.bind_host_argument(binding, f"pads_{name}", pads)
        self.device.bind_value(binding, "state", state)
        self.device.bind_value(binding, "src_state", sources[3])
        binding.bind_output("out_state", self.device.type, self.device.id)
        self.gather_join_session.run_with_iobinding(binding)
        return self.device.output(binding, len(BUFFERS))  # after the buffers' outputs

    def move(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        src: np.ndarray,
        dst: np.ndarray,
    ) -> None:
        """Copy rows src (m,) into rows dst (m,) of each buffer, on the device; shapes (B, S, ·) cover
        the live rows only."""
        binding = self.move_session.io_binding()
        self.device.bind_host_input(binding, "src", src.astype(np.int64), "indices")
        self.device.bind_host_input(binding, "dst", dst.astype(np.int64)[:, None], "indices")
        for (name, dtype, _), buffer, shape in zip(BUFFERS, buffers, shapes, strict=True):
            self.device.bind_in_place(binding, name, buffer, NUMPY_TYPE[dtype], shape)
        self.move_session.run_with_iobinding(binding)

    def refit(
        self,
        buffers: Sequence[ort.OrtValue],
        live: Sequence[tuple[int, ...]],
        target: Sequence[tuple[int, ...]],
    ) -> list[ort.OrtValue]:
        """New device buffers of shapes `target` (C', S', ·) holding the live rows (shapes `live`,
        (B, S, ·)) cut or zero-padded along the source axis; rows B..C'-1 are zeros."""
        binding = self.refit_session.io_binding()
        self.device.bind_host_input(binding, "starts", np.zeros(1, np.int64), "indices")
        self.device.bind_host_input(binding, "axes", np.ones(1, np.int64), "indices")
        for (name, _, rank), buffer, have, want in zip(BUFFERS, buffers, live, target, strict=True):
            ends = np.array([want[1]], np.int64)
            pads = np.zeros(2 * rank, np.int64)
            pads[rank] = want[0] - have[0]  # more rows
            pads[rank + 1] = want[1] - min(have[1], want[1])  # a longer source axis
            self.device.bind_device_input(binding, name, buffer, have)
            self.device.bind_host_input(binding, f"ends_{name}", ends, "indices")
            self.device.bind_host_input(binding, f"pads_{name}", pads, "indices")
            binding.bind_output(f"out_{name}", self.device.type, self.device.id)
        self.refit_session.run_with_iobinding(binding)
        return list(binding.get_outputs())

    def zero_rows(self, state: ort.OrtValue, n: int) -> ort.OrtValue:
        """RowUpdates.zero_rows, one graph run on the device."""
        session = self.zero_rows_sessions[len(state.shape())]
        binding = session.io_binding()
        self.device.bind_value(binding, "state", state)
        self.device.bind_host_argument(binding, "n", np.array([n], np.int64))
        binding.bind_output("out", self.device.type, self.device.id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def keep_last(self, state: ort.OrtValue, entries: int) -> ort.OrtValue:
        """RowUpdates.keep_last, one graph run on the device."""
        session = self.keep_last_sessions[len(state.shape())]
        binding = session.io_binding()
        self.device.bind_value(binding, "state", state)
        starts = np.array([int(state.shape()[-2]) - entries], np.int64)
        self.device.bind_host_argument(binding, "starts", starts)
        binding.bind_output("out", self.device.type, self.device.id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]


class HostRowOps:
    """RowOps for a device whose memory is the host's (the CPU provider): the same calls, done as
    numpy writes into the buffers' own memory.

    On the CPU a tiny graph run costs more than the row copy it makes (a session run and its binds
    are ~30-50 µs; a numpy row write a few), and there is no bus to spare, so this is what the CPU
    provider uses by default (RuntimeConfig.row_ops). The ledger records the same host→device
    rows a device would receive; the graphs (`RowOps`) stay tested on the CPU too."""

    def __init__(self, device: Device) -> None:
        if device.type != "cpu":
            raise ValueError(f"host row ops need host memory, not device {device.type!r}")
        self.device = device
        self._views: dict[int, tuple[Any, np.ndarray]] = {}  # `_view`'s, by the value's id

    def empty(self, shape: Sequence[int], dtype: type) -> ort.OrtValue:
        """A new row buffer in host memory (numpy's, so `host_view` is cheap)."""
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(tuple(shape), dtype))

    def append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        new_rows: Sequence[np.ndarray],
        state: ort.OrtValue | None = None,
        new_state: np.ndarray | None = None,
    ) -> ort.OrtValue | None:
        """RowOps.append's contract, written in place with numpy."""
        n = int(new_rows[0].shape[0])
        for buffer, shape, new in zip(buffers, shapes, new_rows, strict=True):
            self.device.ledger.record("host_to_device", "encoder_rows", new.nbytes)
            rows = host_view(buffer, shape)[first_row : first_row + n]  # (n, S, ·)
            width = new.shape[1]
            rows[:, :width] = new
            rows[:, width:] = 0
        if state is None:
            return None
        assert new_state is not None
        self.device.ledger.record("host_to_device", "state", new_state.nbytes)
        old = state.numpy()  # (R, D): read only (a view or a copy, by onnxruntime release)
        joined = np.concatenate([old, new_state.astype(np.float32, copy=False)])  # (R + n, D)
        return ort.OrtValue.ortvalue_from_numpy(joined)

    def gather_append(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        first_row: int,
        sources: Sequence[Any],
        index: np.ndarray,
        state: Any,
    ) -> ort.OrtValue:
        """RowOps.gather_append's contract, with numpy over views of the encoder's outputs (they
        are in host memory: nothing is copied but the rows written)."""
        n = len(index)
        for buffer, shape, source in zip(buffers, shapes, sources[:3], strict=True):
            rows = host_view(buffer, shape)[first_row : first_row + n]  # (n, S, ·)
            picked = self._view(source)[index]  # (n, Se, ·)
            width = min(picked.shape[1], shape[1])
            rows[:, :width] = picked[:, :width]
            if width < shape[1]:
                rows[:, width:] = 0
        states = self._view(sources[3])[index]  # (n, D)
        old = host_view(state, state.shape())  # (R, D)
        return self.device.wrap(np.concatenate([old, states]))  # (R + n, D)

    def _view(self, value: Any) -> np.ndarray:
        """The whole of an encoder call's output, viewed once (its sentences join one or a few
        at a time, under load at every step)."""
        known = self._views.get(id(value))
        if known is None or known[0] is not value:
            if len(self._views) >= 64:
                self._views.clear()
            known = self._views[id(value)] = (value, host_view(value, value.shape()))
        return known[1]

    def move(
        self,
        buffers: Sequence[ort.OrtValue],
        shapes: Sequence[tuple[int, ...]],
        src: np.ndarray,
        dst: np.ndarray,
    ) -> None:
        """RowOps.move's contract: rows src copied into rows dst (gathered before any write)."""
        for buffer, shape in zip(buffers, shapes, strict=True):
            view = host_view(buffer, shape)
            view[dst] = view[src]

    def refit(
        self,
        buffers: Sequence[ort.OrtValue],
        live: Sequence[tuple[int, ...]],
        target: Sequence[tuple[int, ...]],
    ) -> list[ort.OrtValue]:
        """RowOps.refit's contract: new buffers of shapes `target` holding the live rows."""
        out = []
        for buffer, have, want in zip(buffers, live, target, strict=True):
            new: np.ndarray = np.zeros(want, numpy_dtype(buffer))
            width = min(have[1], want[1])
            new[: have[0], :width] = host_view(buffer, have)[:, :width]
            out.append(ort.OrtValue.ortvalue_from_numpy(new))
        return out

    def zero_rows(self, state: ort.OrtValue, n: int) -> ort.OrtValue:
        """RowUpdates.zero_rows with numpy."""
        old = host_view(state, state.shape())
        return ort.OrtValue.ortvalue_from_numpy(
            np.concatenate([old, np.zeros((n, *old.shape[1:]), old.dtype)])
        )

    def keep_last(self, state: ort.OrtValue, entries: int) -> ort.OrtValue:
        """RowUpdates.keep_last with numpy (a copy: the step writes a new tensor anyway)."""
        old = host_view(state, state.shape())
        return ort.OrtValue.ortvalue_from_numpy(
            np.ascontiguousarray(old[..., old.shape[-2] - entries :, :])
        )


def make_row_ops(
    device: Device, providers: list[str], provider_options: list[dict], kind: str
) -> RowUpdates:
    """The row ops for `kind` ("auto": numpy writes where the device memory is the host's, the
    row graphs elsewhere; "graph"; "host")."""
    if kind == "host" or (kind == "auto" and device.type == "cpu"):
        return HostRowOps(device)
    return RowOps(device, providers, provider_options)
