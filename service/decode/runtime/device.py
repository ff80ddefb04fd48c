"""The model's device: the one place host↔device copies are made, and the in-place row updates.

`Device` makes every copy between host numpy and device OrtValues and records it in the
`TransferLedger`. `RowOps` runs five tiny ONNX graphs on the same device (built with onnx.helper
when the model loads) that change the running batch's device buffers without a round trip through
the host:

- `append`: scatter joining sentences' rows (uploaded at their own length, padded on the device)
  into rows count..count+n of the capacity buffers, in place;
- `join`: the same, and the decoder state buffer with the joining sentences' initial states after
  it, in one run (a join under load is one graph call, not two);
- `move`: gather rows and scatter them into other rows (the compaction when sentences leave), in
  place;
- `refit`: copy the live rows into new buffers of another capacity or source length (growth, and
  the shrink when long sentences have left);
- `gather_join`: the join of sentences whose encoder outputs stayed on the device: their rows
  gathered from the encoder call's outputs, cut or padded, written in place, and their initial
  states after the decoder state, in one run (only the indices cross).

In place means that the ScatterND's output is bound to the same device memory as its input:
ONNX Runtime's ScatterND (CPU and CUDA) skips its input→output copy when the two are one buffer,
so a join or a leave costs what changes, not the whole buffer (measured on the CPU: 40 µs to move
2 rows of a 4096×60×512 buffer, which a copy would take ~100 ms for).

`HostRowOps` makes the same calls as numpy writes where the device's memory is the host's (the CPU
provider, by default: a graph run costs more there than the rows it writes); `make_row_ops` picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C

from service.decode.runtime.graph_nodes import BOOL, FLOAT
from service.decode.runtime.transfers import TransferLedger

# The three encoder buffers of a running batch: name, element type, rank.
BUFFERS: tuple[tuple[str, int, int], ...] = (
    ("values", FLOAT, 3),
    ("keys", FLOAT, 3),
    ("mask", BOOL, 2),
)
NUMPY_TYPE: dict[int, type] = {FLOAT: np.float32, BOOL: np.bool_}


ORT_TYPES: dict[str, type] = {
    "tensor(float)": np.float32,
    "tensor(bool)": np.bool_,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
}


def numpy_dtype(value: ort.OrtValue) -> type:
    """The numpy type of a device buffer (the row buffers': float32, or bool for the mask; the
    search's: float64 and int64 too)."""
    return ORT_TYPES[value.data_type()]


class Device:
    """Where the model's tensors live (`cpu` or `cuda`, a device id); every copy is recorded."""

    def __init__(self, device_type: str, device_id: int, ledger: TransferLedger) -> None:
        self.type = device_type
        self.id = device_id
        self.ledger = ledger
        # The device as ONNX Runtime's binding calls take it, made once. IOBinding.bind_input and
        # bind_output build it anew at each call (half of a bind's ~6 µs), and a join or a leave
        # binds its buffers six times, so the binds below call the binding's own object with it.
        # Both are private to onnxruntime's Python wrapper (seen in 1.18-1.32): where a release
        # lacks them, `fast_binds` is False and the public bind calls are used instead.
        self.ort_device = _c_device(device_type, device_id)
        self.host_device = _c_device("cpu", 0)
        self.fast_binds = self.ort_device is not None and self.host_device is not None

    def upload(self, array: np.ndarray, reason: str) -> ort.OrtValue:
        """A host array → a new OrtValue on the device (on the CPU it wraps the array, no copy)."""
        array = np.ascontiguousarray(array)
        self.ledger.record("host_to_device", reason, array.nbytes)
        return ort.OrtValue.ortvalue_from_numpy(array, self.type, self.id)

    def wrap(self, array: np.ndarray) -> ort.OrtValue:
        """A contiguous host array as an OrtValue over its own memory (no copy; the OrtValue
        keeps the array), for a device whose memory is the host's: what HostRowOps and the
        device search's host select make. onnxruntime's ortvalue_from_numpy builds its device
        object at each call (1.5 µs against 0.7 with the one made at start)."""
        if self.host_device is not None:
            value = C.OrtValue.ortvalue_from_numpy(array, self.host_device)
            return ort.OrtValue(value, array)
        return ort.OrtValue.ortvalue_from_numpy(array)

    def download(self, value: ort.OrtValue, reason: str) -> np.ndarray:
        """An OrtValue → a host array (a copy)."""
        array = value.numpy()
        self.ledger.record("device_to_host", reason, array.nbytes)
        return array

    def bind_host_input(
        self, binding: ort.IOBinding, name: str, array: np.ndarray, reason: str
    ) -> None:
        """A host array as a graph input: ONNX Runtime copies it to the device for the run."""
        array = np.ascontiguousarray(array)
        self.ledger.record("host_to_device", reason, array.nbytes)
        binding.bind_cpu_input(name, array)

    def bind_host_argument(self, binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        """A host array that the graph reads in host memory (a kernel's CPU input, such as TopK's
        k): nothing crosses, so nothing is counted."""
        binding.bind_cpu_input(name, np.ascontiguousarray(array))

    def bind_device_input(
        self, binding: ort.IOBinding, name: str, value: ort.OrtValue, shape: Sequence[int]
    ) -> None:
        """The leading rows of a device buffer as a graph input of `shape` (no copy)."""
        self._bind(binding, "input", name, numpy_dtype(value), list(shape), value.data_ptr())

    def bind_device_output(
        self, binding: ort.IOBinding, name: str, value: ort.OrtValue, shape: Sequence[int]
    ) -> None:
        """The leading rows of a device buffer as graph output `name` of `shape`: the run writes
        it there (no copy)."""
        self._bind(binding, "output", name, numpy_dtype(value), list(shape), value.data_ptr())

    def bind_in_place(
        self,
        binding: ort.IOBinding,
        name: str,
        value: ort.OrtValue,
        dtype: type,
        shape: Sequence[int],
    ) -> None:
        """The leading rows of a device buffer as graph input `name` and, in the same memory,
        output `out_{name}` (the in-place row updates)."""
        ptr, dims = value.data_ptr(), list(shape)
        self._bind(binding, "input", name, dtype, dims, ptr)
        self._bind(binding, "output", f"out_{name}", dtype, dims, ptr)

    def bind_host_output(self, binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        """Let a graph output be copied into a reusable host array (count it with `fetched`)."""
        ptr = array.__array_interface__["data"][0]
        self._bind(binding, "output", name, array.dtype, list(array.shape), ptr, host=True)

    def _bind(
        self,
        binding: ort.IOBinding,
        kind: str,
        name: str,
        dtype: Any,
        dims: list[int],
        ptr: int,
        host: bool = False,
    ) -> None:
        """bind_input / bind_output of memory at `ptr`, on the device (or the host)."""
        if self.fast_binds:
            device = self.host_device if host else self.ort_device
            getattr(binding._iobinding, f"bind_{kind}")(name, device, dtype, dims, ptr)
        else:
            device_type, device_id = ("cpu", 0) if host else (self.type, self.id)
            getattr(binding, f"bind_{kind}")(name, device_type, device_id, dtype, dims, ptr)

    def bind_value(self, binding: ort.IOBinding, name: str, value: Any) -> None:
        """A device tensor (an OrtValue, or the C-level value `outputs` gives) as an input (no
        copy). The public bind_ortvalue_input costs twice the C-level call (its checks)."""
        if self.fast_binds:
            binding._iobinding.bind_ortvalue_input(name, getattr(value, "_ortvalue", value))
        else:
            binding.bind_ortvalue_input(name, value)

    def bind_new_output(self, binding: ort.IOBinding, name: str) -> None:
        """An output that the next run allocates on the device (the public bind_output builds the
        device anew at each call: 4 µs against 0.4)."""
        if self.fast_binds:
            binding._iobinding.bind_output(name, self.ort_device)
        else:
            binding.bind_output(name, self.type, self.id)

    def outputs(self, binding: ort.IOBinding) -> Sequence[Any]:
        """The last run's outputs (in the order first bound), as values `bind_value` takes: C-level
        ones where this onnxruntime exposes them (not wrapped: 0.4 µs against 2.5 for all)."""
        if self.fast_binds:
            return binding._iobinding.get_outputs()  # type: ignore[no-any-return]
        return binding.get_outputs()

    def output(self, binding: ort.IOBinding, index: int) -> ort.OrtValue:
        """Output `index` (in the order first bound) of the binding's last run. IOBinding.get_outputs
        wraps every output, the ones written in place too; this wraps the one wanted."""
        if self.fast_binds:
            return ort.OrtValue(binding._iobinding.get_outputs()[index])
        return binding.get_outputs()[index]

    def fetched(self, array: np.ndarray, reason: str) -> np.ndarray:
        """Record a host-bound output that a run has just filled."""
        self.ledger.record("device_to_host", reason, array.nbytes)
        return array

    def empty(self, shape: Sequence[int], dtype: type) -> ort.OrtValue:
        """An uninitialised device buffer (no copy)."""
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.type, self.id)


class _Memory:
    """Memory at an address, as numpy's array interface describes it (no copy, no ctypes)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__array_interface__ = {
            "data": (address, False),
            "shape": shape,
            "typestr": dtype.str,
            "version": 3,
        }


def host_view(value: Any, shape: Sequence[int]) -> np.ndarray:
    """A numpy view (no copy) of the leading `shape` elements of a CPU OrtValue's memory (an
    OrtValue, or the C-level value `Device.outputs` gives); valid while `value` lives. An OrtValue
    made from a numpy array keeps it (`_numpy_obj`, private to onnxruntime's wrapper): viewing that
    array costs ~1 µs; other memory is viewed through numpy's array interface (~1 µs as well:
    ctypes' views took ~20)."""
    count = math.prod(shape)
    array = getattr(value, "_numpy_obj", None)  # set only for a contiguous array wrapped as is
    if array is None:
        dtype = np.dtype(numpy_dtype(value))
        if not count:
            return np.zeros(tuple(shape), dtype)
        return np.asarray(_Memory(value.data_ptr(), tuple(shape), dtype))
    return array.reshape(-1)[:count].reshape(tuple(shape))


def _c_device(device_type: str, device_id: int) -> Any:
    """onnxruntime's C-level device object, or None where this release does not expose it."""
    try:
        return ort.OrtDevice.make(device_type, device_id)._get_c_device()
    except AttributeError:
        return None
