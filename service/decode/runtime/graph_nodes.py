"""Writing ONNX nodes by hand: `Nodes` (onnx.helper with generated names and the few shapes the
search's graph needs), and a node list's order (`topological`), its used part (`used`), a model's opset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

FLOAT, DOUBLE, INT64, BOOL = (
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.INT64,
    TensorProto.BOOL,
)


class Nodes:
    """onnx.helper with generated names: `op` returns its output names (a node is named after
    its first output, which ONNX Runtime's profiler reports)."""

    def __init__(self, prefix: str, opset: int) -> None:
        self.prefix = prefix
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def op(self, op_type: str, *inputs: str, out: str = "", **attrs: Any) -> str:
        """One node; returns its (only) output's name (`out` names it)."""
        names = [out or self.name(op_type.lower())]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, names[0], **attrs))
        return names[0]

    def ops(self, op_type: str, *inputs: str, outputs: int, **attrs: Any) -> list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, names[0], **attrs))
        return names

    def const(self, value: np.ndarray | Sequence[float] | float, dtype: type = np.float64) -> str:
        array: np.ndarray = np.asarray(value, dtype=dtype)
        name = self.name("const")
        self.inits.append(
            helper.make_tensor(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                array.ravel().tolist(),
            )
        )  # fmt: skip
        return name

    def split(self, x: str, parts: int, axis: int) -> list[str]:
        """x split in `parts` equal parts along `axis` (opset 18 names the count)."""
        if self.opset >= 18:
            return self.ops("Split", x, outputs=parts, axis=axis, num_outputs=parts)
        return self.ops("Split", x, outputs=parts, axis=axis)

    def reduce(self, op_type: str, x: str, axis: int) -> str:
        """ReduceMax over one axis, dims kept (its axes became an input at opset 18)."""
        if self.opset >= 18:
            return self.op(op_type, x, self.const([axis], np.int64), keepdims=1)
        return self.op(op_type, x, axes=[axis], keepdims=1)

    def reduce_sum(self, x: str, axis: int, keepdims: int = 1) -> str:
        return self.op("ReduceSum", x, self.const([axis], np.int64), keepdims=keepdims)

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", x, to=to)

    def reshape(self, x: str, *shape: int) -> str:
        return self.op("Reshape", x, self.const(list(shape), np.int64))

    def columns(self, x: str, start: int, end: int) -> str:
        """x[:, start:end]."""
        one = self.const([1], np.int64)
        return self.op("Slice", x, self.const([start], np.int64), self.const([end], np.int64), one)


def topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in an order where each comes after the nodes whose outputs it reads (the given
    order where it already is); a value no node makes is a graph input or an initializer."""
    made = {o for node in nodes for o in node.output}
    ready: set[str] = set()
    out: list[onnx.NodeProto] = []
    waiting = list(nodes)
    while waiting:
        later = []
        for node in waiting:
            if all(i == "" or i not in made or i in ready for i in node.input):
                out.append(node)
                ready.update(node.output)
            else:
                later.append(node)
        if len(later) == len(waiting):
            raise ValueError(f"the search graph has a cycle through {later[0].op_type}")
        waiting = later
    return out


def used(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes (in topological order) that `outputs` depend on: the decoder's values nothing
    reads (its attention, where no sentence of the batch needs it and it does not feed the
    rest) are not computed."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    return kept[::-1]


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
