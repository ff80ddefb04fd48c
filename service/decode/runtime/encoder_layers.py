"""Each decoder layer's encoder keys and values as inputs of their own, cut once per batch.

A Transformer's decoder step reads every layer's cross-attention keys and values from the
encoder's `keys` and `values` (B, S, layers·d), stacked along the last axis (the graph contract's
four encoder outputs), and cuts its layer's part with a Slice at every step: ONNX Runtime copies
each part (it has no views), and the MultiHeadAttention kernel then copies it again into its
per-head layout (B, heads, S, d/heads). At OPUS-MT's shape (32 sentences of 72 source pieces, 6
layers, one thread) the cuts took 12.6 ms and the cross-attentions 2.5 ms more each than with
their keys and values given per head: 20% of a 226 ms step, for tensors that change only when
sentences join or leave.

`split_encoder_inputs` rewrites the step's graph at load: each such Slice becomes a graph input of
its own (`LayerSlice.name`), in the per-head layout where only MultiHeadAttention nodes read it
(as their key and value both: the kernel takes them together or not at all) and (B, S, width)
otherwise. The stacked inputs stay declared (unread), so the graph's contract and its bindings
are unchanged. `split_graph` is the small graph that cuts the parts from the running batch's rows;
service/decode/runtime/runtime.py's EncoderRows runs it when its rows change and binds its outputs, on
the model's device (a GPU runs the same graph).

The parts are a second copy of the running batch's encoder keys and values while it runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

STACKED = ("keys", "values")  # the decoder inputs whose layer parts become inputs of their own
MHA = "MultiHeadAttention"  # com.microsoft: key at input 1, value at input 2
_NAME = re.compile(r"^(keys|values)\.(\d+):(\d+)(?:\.heads(\d+))?$")


@dataclass(frozen=True, order=True)
class LayerSlice:
    """Columns start..end of a stacked input: (B, S, end - start), or with `heads`, the same
    per head (B, heads, S, (end - start) / heads)."""

    source: str
    start: int
    end: int
    heads: int = 0

    @property
    def name(self) -> str:
        """Its graph input's name (`parse_slice` reads it back)."""
        name = f"{self.source}.{self.start}:{self.end}"
        return f"{name}.heads{self.heads}" if self.heads else name


def parse_slice(name: str) -> LayerSlice | None:
    """The LayerSlice an input name stands for; None for any other input."""
    found = _NAME.match(name)
    if found is None:
        return None
    source, start, end, heads = found.groups()
    return LayerSlice(source, int(start), int(end), int(heads or 0))


def layer_slices(input_names: Iterable[str]) -> tuple[LayerSlice, ...]:
    """The layer parts among a session's inputs, in a fixed order."""
    return tuple(sorted(s for s in map(parse_slice, input_names) if s is not None))


def split_encoder_inputs(model: onnx.ModelProto) -> tuple[LayerSlice, ...]:
    """Rewrite, in place, each Slice of a stacked input's last axis (constant bounds, step 1) into
    an input of its own; returns the inputs made (none: the graph is unchanged)."""
    graph = model.graph
    declared = {i.name: i for i in graph.input}
    constants = _constants(graph)
    users = _users(graph)
    outputs = {o.name for o in graph.output}
    parts: dict[str, tuple[onnx.NodeProto, LayerSlice]] = {}
    for node in graph.node:
        if node.op_type != "Slice" or node.input[0] not in STACKED or node.input[0] not in declared:
            continue
        bounds = _last_axis_bounds(node, constants, _dims(declared[node.input[0]]))
        if bounds is not None and node.output[0] not in outputs:
            parts[node.output[0]] = (node, LayerSlice(node.input[0], *bounds))
    if not parts:
        return ()
    heads = _per_head(parts, users, constants)
    made: dict[LayerSlice, None] = {}
    for out, (node, part) in parts.items():
        if out in heads:
            part = LayerSlice(part.source, part.start, part.end, heads[out])
            _forget_shapes(graph, [u.output[0] for u in users.get(out, []) if u.op_type == "Shape"])
        for user in users.get(out, []):
            user.input[:] = [part.name if name == out else name for name in user.input]
        graph.node.remove(node)
        _drop_unread_constants(graph, node.input[1:])
        if part not in made:
            made[part] = None
            graph.input.append(_input_of(declared[part.source], part))
    return tuple(sorted(made))


def split_graph(parts: Sequence[LayerSlice], opset: int = 17) -> bytes:
    """The graph that cuts `parts` from the stacked inputs (B, S, ·): one output per part, named as
    the decoder's input it feeds."""
    sources = sorted({p.source for p in parts})
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [numpy_helper.from_array(np.array([2], np.int64), "axis")]
    for i, part in enumerate(parts):
        inits.append(numpy_helper.from_array(np.array([part.start], np.int64), f"s{i}"))
        inits.append(numpy_helper.from_array(np.array([part.end], np.int64), f"e{i}"))
        cut = part.name if not part.heads else f"cut{i}"
        nodes.append(helper.make_node("Slice", [part.source, f"s{i}", f"e{i}", "axis"], [cut]))
        if part.heads:
            shape = np.array([0, 0, part.heads, -1], np.int64)
            inits.append(numpy_helper.from_array(shape, f"shape{i}"))
            nodes.append(helper.make_node("Reshape", [cut, f"shape{i}"], [f"heads{i}"]))
            nodes.append(
                helper.make_node("Transpose", [f"heads{i}"], [part.name], perm=[0, 2, 1, 3])
            )
    float_ = onnx.TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(s, float_, ["B", "S", f"D_{s}"]) for s in sources]
    outs = [helper.make_tensor_value_info(p.name, float_, None) for p in parts]
    graph = helper.make_graph(nodes, "encoder_layers", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _forget_shapes(graph: onnx.GraphProto, names: Sequence[str]) -> None:
    """Drop the declared shapes of `names`: a Shape of a part now per head has four entries, not
    the three a quantizer's shape inference wrote (ONNX Runtime warns of each at load)."""
    stale = [info for info in graph.value_info if info.name in names]
    for info in stale:
        graph.value_info.remove(info)


def _drop_unread_constants(graph: onnx.GraphProto, names: Iterable[str]) -> None:
    """Remove the Constant nodes and initializers of `names` that nothing reads any more (ONNX
    Runtime warns of each at every load)."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for name in set(names) - read - {""}:
        for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] == name]:
            graph.node.remove(node)
        for init in [i for i in graph.initializer if i.name == name]:
            graph.initializer.remove(init)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _users(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            users.setdefault(name, []).append(node)
    return users


def _dims(arg: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value or None for d in arg.type.tensor_type.shape.dim]


def _scalar(constants: dict[str, np.ndarray], name: str) -> int | None:
    value = constants.get(name)
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _last_axis_bounds(
    node: onnx.NodeProto, constants: dict[str, np.ndarray], dims: list[int | None]
) -> tuple[int, int] | None:
    """(start, end) of a Slice over one stacked input's last axis (of a declared width), from
    non-negative constant bounds within it, step 1; None for any other Slice."""
    inputs = list(node.input) + [""] * (5 - len(node.input))
    start, end = _scalar(constants, inputs[1]), _scalar(constants, inputs[2])
    axis = _scalar(constants, inputs[3]) if inputs[3] else None
    step = _scalar(constants, inputs[4]) if inputs[4] else 1
    if len(dims) != 3 or axis not in (2, -1) or step != 1 or start is None or end is None:
        return None
    width = dims[2]
    return (start, end) if width is not None and 0 <= start < end <= width else None


def _per_head(
    parts: dict[str, tuple[onnx.NodeProto, LayerSlice]],
    users: dict[str, list[onnx.NodeProto]],
    constants: dict[str, np.ndarray],
) -> dict[str, int]:
    """The parts to give per head, and their head counts: read only as a MultiHeadAttention's key
    or value, its other one a part given per head too, or by a Shape whose readers take only the
    batch axis."""
    heads: dict[str, int] = {}
    for out, (_, part) in parts.items():
        counts = set()
        for user in users.get(out, []):
            if user.op_type == MHA and user.domain == "com.microsoft":
                if {i for i, name in enumerate(user.input) if name == out} - {1, 2}:
                    break
                counts.add(_attribute(user, "num_heads"))
            elif not (user.op_type == "Shape" and _batch_only(user, users, constants)):
                break
        else:
            if len(counts) == 1 and (h := counts.pop()) > 0 and (part.end - part.start) % h == 0:
                heads[out] = h
    changed = True
    while changed:  # a key per head needs its value per head, and the other way round
        changed = False
        for out in list(heads):
            for user in users.get(out, []):
                if user.op_type == MHA and not {user.input[1], user.input[2]} <= heads.keys():
                    heads.pop(out, None)
                    changed = True
    return heads


def _batch_only(
    shape: onnx.NodeProto, users: dict[str, list[onnx.NodeProto]], constants: dict
) -> bool:
    """A Shape (of the whole tensor) whose every reader is a Gather of its axis 0 (the batch)."""
    if shape.attribute:
        return False
    readers = users.get(shape.output[0], [])
    return bool(readers) and all(
        r.op_type == "Gather" and r.input[0] == shape.output[0] and _attribute(r, "axis") == 0
        and _scalar(constants, r.input[1]) == 0 and constants[r.input[1]].ndim == 0
        for r in readers
    )  # fmt: skip


def _attribute(node: onnx.NodeProto, name: str) -> int:
    found = next((a for a in node.attribute if a.name == name), None)
    return int(helper.get_attribute_value(found)) if found is not None else 0


def _input_of(stacked: onnx.ValueInfoProto, part: LayerSlice) -> onnx.ValueInfoProto:
    """The new input's declaration: the stacked input's batch and source axes, the part's width."""
    dims = stacked.type.tensor_type.shape.dim
    batch, source = (d.dim_value or d.dim_param or None for d in dims[:2])
    width = part.end - part.start
    shape: list[int | str | None] = (
        [batch, part.heads, source, width // part.heads] if part.heads else [batch, source, width]
    )
    return helper.make_tensor_value_info(part.name, stacked.type.tensor_type.elem_type, shape)


class HostLayerRows:
    """The layer parts of a running batch's encoder rows kept row by row in host memory (the CPU
    provider's): a joining sentence's rows are cut once, as it joins; a leave moves the rows that
    change place, as the stacked rows move; nothing else is copied. Cutting every live row at each
    change of the batch (`split_graph`, once a step under load) cost 12% of a served Transformer's
    engine (py-spy, 64 clients on grc-en-nt-transformer). The parts' values equal the cutter's:
    both are copies of the same columns.

    `buffers` are (capacity, S, width), or per head (capacity, heads, S, width / heads), like
    the stacked rows they are cut from (service/decode/runtime/runtime.py's EncoderRows), which calls
    `write`, `move` and `refit` as it changes its own."""

    def __init__(self, parts: Sequence[LayerSlice], capacity: int, S: int) -> None:
        self.parts = tuple(parts)
        self.buffers = [np.zeros(self.shape(part, capacity, S), np.float32) for part in parts]
        self.values = [ort.OrtValue.ortvalue_from_numpy(b) for b in self.buffers]  # same memory

    @staticmethod
    def shape(part: LayerSlice, rows: int, S: int) -> tuple[int, ...]:
        width = part.end - part.start
        return (rows, part.heads, S, width // part.heads) if part.heads else (rows, S, width)

    def write(self, stacked: dict[str, np.ndarray], first: int, last: int) -> None:
        """Rows first..last of the stacked rows (B, S, ·) by source name, cut into the parts."""
        for part, buffer in zip(self.parts, self.buffers, strict=True):
            cut = stacked[part.source][first:last, :, part.start : part.end]  # (n, S, width)
            if part.heads:
                n, S, width = cut.shape
                cut = cut.reshape(n, S, part.heads, width // part.heads).transpose(0, 2, 1, 3)
            buffer[first:last] = cut

    def move(self, sources: np.ndarray, targets: np.ndarray) -> None:
        for buffer in self.buffers:
            buffer[targets] = buffer[sources]

    def refit(self, rows: int, capacity: int, S: int) -> None:
        """New buffers of `capacity` rows and source length S holding the first `rows`, cut or
        zero-padded along S."""
        for i, (part, old) in enumerate(zip(self.parts, self.buffers, strict=True)):
            new = np.zeros(self.shape(part, capacity, S), np.float32)
            keep = min(S, old.shape[-2])
            new[:rows, ..., :keep, :] = old[:rows, ..., :keep, :]
            self.buffers[i] = new
            self.values[i] = ort.OrtValue.ortvalue_from_numpy(new)

    def shapes(self, rows: int) -> list[tuple[int, ...]]:
        """The parts' shapes over the leading `rows` rows (what a step binds)."""
        return [(rows, *buffer.shape[1:]) for buffer in self.buffers]
