"""The device search's small graphs around its step: the batch after its joins and leaves
(`select_graph`), a finished sentence's history read out (`finished_graph`), the history's buffers
grown (`grow_graph`).
"""

from __future__ import annotations

from onnx import helper

from service.decode.runtime.graph_bytes import graph_bytes
from service.decode.runtime.graph_nodes import DOUBLE, FLOAT, INT64


def select_graph() -> bytes:
    """The batch after its joins and leaves, on the device (where its memory is not the host's:
    `DeviceSearch._select` does the same with numpy there): sentences (W, B_prev) f64, tokens and
    reorder (B_prev·K,) int64, settings (P, B_prev) f64, the joining sentences' join_sentences
    (W, n), join_tokens and join_reorder (n, K), join_settings (P, n), sent_select (B,) int64 into
    the previous sentences then the joining ones → out_sentences (W, B), out_tokens, out_reorder
    (B·K,), out_settings (P, B)."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    nodes = [
        n("Shape", ["join_tokens"], ["join_shape"]),
        n("Slice", ["join_shape", "one", "two"], ["K"]),
        n("Concat", ["minus_one", "K"], ["by_sentence"], axis=0),
    ]
    inits = [
        helper.make_tensor("one", INT64, [1], [1]),
        helper.make_tensor("two", INT64, [1], [2]),
        helper.make_tensor("minus_one", INT64, [1], [-1]),
    ]
    inputs, outputs = [vi("sent_select", INT64, ["B"])], []
    for name, dtype, dims, axis in (
        ("sentences", DOUBLE, ["W", "B_prev"], 1),
        ("tokens", INT64, ["N_prev"], 0),
        ("reorder", INT64, ["N_prev"], 0),
        ("settings", DOUBLE, ["P", "B_prev"], 1),
    ):
        rows = name in ("tokens", "reorder")  # (B·K,), picked by sentence: (B, K) rows
        join_dims = ["n", "K"] if rows else (["n", dims[1]] if axis == 0 else [dims[0], "n"])
        inputs += [vi(name, dtype, dims), vi(f"join_{name}", dtype, join_dims)]
        source = name
        if rows:
            nodes.append(n("Reshape", [name, "by_sentence"], [f"{name}_rows"]))
            source = f"{name}_rows"
        nodes += [
            n("Concat", [source, f"join_{name}"], [f"all_{name}"], axis=axis),
            n("Gather", [f"all_{name}", "sent_select"], [f"picked_{name}"], axis=axis),
        ]
        if rows:
            nodes.append(n("Reshape", [f"picked_{name}", "minus_one"], [f"out_{name}"]))
            outputs.append(vi(f"out_{name}", dtype, ["N"]))
        else:
            nodes.append(n("Identity", [f"picked_{name}"], [f"out_{name}"]))
            out_dims = ["B", dims[1]] if axis == 0 else [dims[0], "B"]
            outputs.append(vi(f"out_{name}", dtype, out_dims))
    return graph_bytes(nodes, "select_sentences", inputs, outputs, inits)


def finished_graph(attention: bool = True) -> bytes:
    """sentences (W, B) f64, history (P, L, 2, K) and (with `attention`) attention_history
    (P, L, K, S) f32, rows (D,), pools (D,), steps (1,) int64 → fields (D, W), blocks (D, steps,
    2, K) (and attention (D, steps, K, S)): the finished sentences' n-best entries and histories,
    gathered on the device to come down in one copy each."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    nodes = [
        n("Gather", ["sentences", "rows"], ["columns"], axis=1),
        n("Transpose", ["columns"], ["fields"]),
        n("Gather", ["history", "pools"], ["history_rows"], axis=0),
        n("Slice", ["history_rows", "zero", "steps", "one"], ["blocks"]),
    ]
    inputs = [
        vi("sentences", DOUBLE, ["W", "B"]),
        vi("history", FLOAT, ["P", "L", 2, "K"]),
        vi("rows", INT64, ["D"]),
        vi("pools", INT64, ["D"]),
        vi("steps", INT64, [1]),
        vi("zero", INT64, [1]),
        vi("one", INT64, [1]),
    ]
    outputs = [
        vi("fields", DOUBLE, ["D", "W"]),
        vi("blocks", FLOAT, ["D", "T", 2, "K"]),
    ]
    if attention:
        nodes += [
            n("Gather", ["attention_history", "pools"], ["attention_rows"], axis=0),
            n("Slice", ["attention_rows", "zero", "steps", "one"], ["attention"]),
        ]
        inputs.append(vi("attention_history", FLOAT, ["P", "L", "K", "S"]))
        outputs.append(vi("attention", FLOAT, ["D", "T", "K", "S"]))
    return graph_bytes(nodes, "finished_sentences", inputs, outputs)


def grow_graph() -> bytes:
    """history (P, L, Y, X) f32, ends (4,), pads (8,) int64 → the history cut to `ends` then
    zero-padded by `pads` (a buffer with more rows or steps, or another source axis, holding the
    old one's entries)."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    nodes = [
        n("Slice", ["history", "starts", "ends"], ["cut"]),
        n("Pad", ["cut", "pads"], ["grown"]),
    ]
    inputs = [
        vi("history", FLOAT, ["P", "L", "Y", "X"]),
        vi("starts", INT64, [4]),
        vi("ends", INT64, [4]),
        vi("pads", INT64, [8]),
    ]
    return graph_bytes(nodes, "grow", inputs, [vi("grown", FLOAT, ["P2", "L2", "Y", "X2"])])
