"""Align's choice of a Transformer's cross-attention: the decoder graph with its `attention`
output read from one decoder layer's weights, one head or the heads averaged, instead of the
bundle's alignment heads.

A Transformer's step computes every layer's cross-attention, but only the alignment layer's
weights reach an output: the other layers attend through ONNX Runtime's MultiHeadAttention kernel,
which gives no weights. The chosen layer's weights are recomputed beside the kernel from the
kernel's own inputs (its query, the layer's cached source keys and the source mask: softmax(q·kᵀ /
√dₕ) over the unmasked keys, as the kernel computes them); the alignment layer's are read from its
softmax. The graph is changed, not re-exported, so every Transformer bundle gets the choice as it
is. Only Align runs these graphs (service/decode/runtime/runtime.py OnnxModel.choice_session): the search
keeps the step as exported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from service.decode.runtime.graph_nodes import Nodes, opset_of

KERNEL = "MultiHeadAttention"
CROSS_KEYS = "keys"  # the step's input: every layer's source keys side by side (B, S, layers·d)
PASS_THROUGH = ("Slice", "Split", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze")


@dataclass(frozen=True)
class AttentionChoice:
    """A decoder layer (0-based) and one of its heads (None: the heads averaged)."""

    layer: int
    head: int | None = None


@dataclass(frozen=True)
class CrossSite:
    """Where one layer's cross-attention is computed: the kernel (its node) or plain ops (the
    softmax whose output, (G, M, heads, S), holds the weights)."""

    node: onnx.NodeProto

    @property
    def kernel(self) -> bool:
        return self.node.op_type == KERNEL


def reads_cross_keys(tensor: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether `tensor` is the step's source keys input, through slices and reshapes only."""
    while tensor != CROSS_KEYS:
        node = producers.get(tensor)
        if node is None or node.op_type not in PASS_THROUGH:
            return False
        tensor = node.input[0]
    return True


def scores_product(
    softmax: onnx.NodeProto, producers: dict[str, onnx.NodeProto]
) -> onnx.NodeProto | None:
    """The MatMul a softmax's scores come from (through the scaling, the mask and reshapes)."""
    tensor = softmax.input[0]
    for _ in range(8):
        node = producers.get(tensor)
        if node is None:
            return None
        if node.op_type == "MatMul":
            return node
        # Where(mask, fill, scores) carries the scores as its last input, the others their first
        tensor = node.input[-1] if node.op_type == "Where" else node.input[0]
    return None


def cross_sites(graph: onnx.GraphProto) -> list[CrossSite]:
    """Each decoder layer's cross-attention, in layer order (the order the step computes them):
    a kernel node without past keys that reads the source keys, or a softmax over scores whose
    product reads them."""
    producers = {out: node for node in graph.node for out in node.output}
    sites = []
    for node in graph.node:
        if node.op_type == KERNEL:
            no_past = len(node.input) < 7 or not node.input[6]
            if no_past and reads_cross_keys(node.input[1], producers):
                sites.append(CrossSite(node))
        elif node.op_type == "Softmax":
            product = scores_product(node, producers)
            if product is not None and any(reads_cross_keys(i, producers) for i in product.input):
                sites.append(CrossSite(node))
    return sites


def attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    for a in node.attribute:
        if a.name == name:
            return float(onnx.helper.get_attribute_value(a))
    return default


def kernel_weights(g: Nodes, node: onnx.NodeProto, heads: int, head_dim: int) -> str:
    """The kernel's attention weights recomputed from its inputs: q (B, K, d), keys (B, S, d),
    mask (B, S) int32 (0: not read) → (B·K, heads, S)."""
    q, keys, mask = node.input[0], node.input[1], node.input[4]
    split = g.const([0, 0, heads, head_dim], np.int64)
    qh = g.op("Transpose", g.op("Reshape", q, split), perm=[0, 2, 1, 3])  # (B, h, K, dh)
    kh = g.op("Transpose", g.op("Reshape", keys, split), perm=[0, 2, 3, 1])  # (B, h, dh, S)
    scale = attribute(node, "scale", head_dim**-0.5)
    scores = g.op("Mul", g.op("MatMul", qh, kh), g.const(scale, np.float32))  # (B, h, K, S)
    masked = g.op("Equal", mask, g.const(0, np.int32))  # (B, S)
    masked = g.op("Unsqueeze", masked, g.const([1, 2], np.int64))  # (B, 1, 1, S)
    fill = attribute(node, "mask_filter_value", float(np.finfo(np.float32).min))
    scores = g.op("Where", masked, g.const(fill, np.float32), scores)
    weights = g.op("Transpose", g.op("Softmax", scores, axis=-1), perm=[0, 2, 1, 3])
    return hypothesis_rows(g, weights, heads)  # (B·K, h, S)


def hypothesis_rows(g: Nodes, weights: str, heads: int) -> str:
    """Weights (G, M, heads, S), a sentence's hypotheses side by side → (G·M, heads, S)."""
    rows = g.op("Flatten", weights, axis=2)  # (G·M, heads·S)
    return g.op("Reshape", rows, g.const([0, heads, -1], np.int64))


def choose_attention(
    model: onnx.ModelProto, choice: AttentionChoice, heads: int, d_model: int
) -> onnx.ModelProto:
    """`model` (a Transformer's decoder step, changed in place and returned) with its `attention`
    output (N, S) read from `choice`'s layer and head. ValueError where the graph does not show
    the layer's cross-attention."""
    graph = model.graph
    sites = cross_sites(graph)
    if choice.layer >= len(sites):
        raise ValueError(
            f"the decoder graph shows {len(sites)} layers' cross-attention, not layer "
            f"{choice.layer}: re-import the model"
        )
    if "attention" not in {o.name for o in graph.output}:
        raise ValueError("the decoder graph has no attention output")
    g = Nodes("choice_", opset_of(model))
    site = sites[choice.layer].node
    if sites[choice.layer].kernel:
        weights = kernel_weights(g, site, heads, d_model // heads)
    else:
        weights = hypothesis_rows(g, site.output[0], heads)
    for node in graph.node:  # the bundle's own alignment goes nowhere now
        node.output[:] = ["choice_unused_attention" if o == "attention" else o for o in node.output]
    if choice.head is None and g.opset >= 18:  # ReduceMean's axes became an input at 18
        g.op("ReduceMean", weights, g.const([1], np.int64), keepdims=0, out="attention")
    elif choice.head is None:
        g.op("ReduceMean", weights, axes=[1], keepdims=0, out="attention")
    else:
        g.op("Gather", weights, g.const(choice.head, np.int64), axis=1, out="attention")
    graph.node.extend(g.nodes)
    graph.initializer.extend(g.inits)
    return model
