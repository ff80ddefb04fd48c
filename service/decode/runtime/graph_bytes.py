"""The small ONNX graphs the runtime builds itself (the running batch's row updates, the device
search's helpers, a provider's probe), made one way: opset 17 and IR version 8, which every
onnxruntime this project supports (>= 1.18) reads, checked before they are used."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

OPSET = 17
IR_VERSION = 8


def graph_bytes(
    nodes: Sequence[onnx.NodeProto],
    name: str,
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializer: Sequence[onnx.TensorProto] = (),
) -> bytes:
    """A checked model of these nodes, serialized for an InferenceSession."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model.SerializeToString()
