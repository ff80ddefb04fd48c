"""The decoder step's top k over a large vocabulary in two stages, with the same answer.

ONNX Runtime's CPU TopK walks every element of every row through its selection: at OPUS-MT's
shape (160 rows of 32,000 log-probs, k = 6) it took 11.7 ms of a 181 ms step, more than the
log-softmax before it. In two stages the row is read once, by a ReduceMax over fixed blocks of
`block` entries; the k best entries lie in the k blocks with the best maxima (each of those
entries is at least its block's maximum), so TopK runs over the block maxima, the chosen blocks
are gathered in vocabulary order, and a last TopK over their k·block entries gives the values and
the ids (1.9 ms there). Ties keep ONNX TopK's order (the lower index first): the candidate blocks
are laid out in ascending order, so a candidate's position orders as its vocabulary id does.

Only for the CPU provider (`OnnxModel`): on CUDA the TopK kernel is already quick, and k must stay
in host memory (step_graph.topk_reads_k_on_the_host), which the stage's Min(k, blocks) would not."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

# below this many tokens one TopK is quick enough (a row of 1,000 is a few microseconds)
MIN_VOCAB = 2048
# the block: a divisor of the vocabulary near BLOCK (64-128 measured alike at 32,000), between
# SMALLEST and LARGEST; without one, BLOCK, the last part row's entries candidates of their own
BLOCK, SMALLEST, LARGEST = 96, 32, 256


def block_size(vocab: int) -> int | None:
    """The block for a row of `vocab` entries: the divisor of it nearest BLOCK (by ratio) between
    SMALLEST and LARGEST (the row read in place), else BLOCK (the whole blocks copied out of the
    row first, 2 ms at OPUS-MT's shape); None for a short row (the TopK stays as it is)."""
    if vocab < MIN_VOCAB:
        return None
    divisors = [b for b in range(SMALLEST, LARGEST + 1) if vocab % b == 0]
    return min(divisors, key=lambda b: abs(math.log(b / BLOCK)), default=BLOCK)


def block_topk(model: onnx.ModelProto, output: str, vocab: int) -> bool:
    """Replace the TopK that produces `output` (over the last axis of (N, vocab) rows, the largest
    k, sorted; k a (1,) tensor) by the two-stage one; False (graph unchanged) where there is no
    such TopK or `vocab` has no block (`block_size`)."""
    graph = model.graph
    node = next((n for n in graph.node if n.op_type == "TopK" and output in n.output), None)
    block = block_size(vocab)
    if node is None or block is None or not _plain_topk(node):
        return False
    at = list(graph.node).index(node)
    graph.node.remove(node)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    for offset, new in enumerate(_two_stage(node, vocab, block, opset)):
        graph.node.insert(at + offset, new)
    return True


def _plain_topk(node: onnx.NodeProto) -> bool:
    """The TopK `block_topk` rewrites: the last axis, the largest, sorted, both outputs used."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (
        attrs.get("axis", -1) in (-1, 1)
        and attrs.get("largest", 1) == 1
        and attrs.get("sorted", 1) == 1
        and len(node.output) == 2
        and all(node.output)
    )


def _reduce_max(x: str, out: str, opset: int, axis: onnx.NodeProto) -> list[onnx.NodeProto]:
    """ReduceMax over axis 2 without keeping it: the axes an attribute before opset 18, an input
    (the Constant `axis`) from it."""
    if opset < 18:
        return [helper.make_node("ReduceMax", [x], [out], axes=[2], keepdims=0)]
    return [axis, helper.make_node("ReduceMax", [x, axis.output[0]], [out], keepdims=0)]


def _two_stage(node: onnx.NodeProto, vocab: int, block: int, opset: int) -> list[onnx.NodeProto]:
    """The nodes that compute `node`'s values and ids (N, k) from its row (N, vocab) and k. Where
    `block` does not divide `vocab`, the whole blocks are sliced out of the row and the rest (fewer
    than `block` entries, at its end) are candidates in every row, as one more block."""
    row, k = node.input[0], node.input[1]
    values, ids = node.output
    p = f"{node.name or 'topk'}/blocked"
    blocks, rest = divmod(vocab, block)

    def name(hint: str) -> str:
        return f"{p}/{hint}"

    def const(hint: str, value: int | list[int] | list[list[int]]) -> onnx.NodeProto:
        tensor = numpy_helper.from_array(np.array(value, dtype=np.int64), name(hint))
        return helper.make_node("Constant", [], [name(hint)], value=tensor)

    n = helper.make_node
    whole = row
    nodes = [
        const("by_block", [0, blocks, block]),
        const("per_row", [0, -1]),
        const("blocks", [blocks]),
        const("block", [block]),
        const("last_axis", [-1]),
    ]
    if rest:
        whole = name("whole")
        nodes += [
            const("start", [0]),
            const("end", [blocks * block]),
            const("last", [vocab]),
            const("pad_one_column", [0, 0, 0, 1]),
            const("rest_block", blocks),
            const("axis1", [1]),
            n("Slice", [row, name("start"), name("end"), name("axis1")], [whole]),
            n("Slice", [row, name("end"), name("last"), name("axis1")], [name("rest")]),
        ]
    nodes += [
        # 1. each block's maximum, (N, blocks), and the best min(k, blocks) of them
        n("Reshape", [whole, name("by_block")], [name("row3")]),  # (N, blocks, block)
        *_reduce_max(name("row3"), name("maxima"), opset, const("axis2", [2])),
        n("Min", [k, name("blocks")], [name("k1")]),
        n("TopK", [name("maxima"), name("k1")], [name("_best_max"), name("best")], axis=1),
        # in ascending block order (TopK of the negated ids), so that ties fall as one TopK's do
        n("Neg", [name("best")], [name("negated")]),
        n("TopK", [name("negated"), name("k1")], [name("ascending_neg"), name("_order")], axis=1),
        n("Neg", [name("ascending_neg")], [name("chosen")]),  # (N, k1) block ids
        # 2. the chosen blocks' entries, (N, k1 * block) (and the rest after them), their top k
        n("Unsqueeze", [name("chosen"), name("last_axis")], [name("chosen3")]),
        n("GatherND", [name("row3"), name("chosen3")], [name("candidates3")], batch_dims=1),
        n("Reshape", [name("candidates3"), name("per_row")], [name("in_blocks")]),
    ]
    candidates, chosen = name("in_blocks"), name("chosen")
    if rest:  # the rest reads as block `blocks`, after the chosen ones
        candidates, chosen = name("candidates"), name("chosen_and_rest")
        nodes += [
            n("Concat", [name("in_blocks"), name("rest")], [candidates], axis=1),
            n("Pad", [name("chosen"), name("pad_one_column"), name("rest_block")], [chosen]),
        ]
    return [
        *nodes,
        n("TopK", [candidates, k], [values, name("position")], axis=1),
        # 3. a candidate's position back to its vocabulary id
        n("Div", [name("position"), name("block")], [name("which")]),
        n("Mod", [name("position"), name("block")], [name("within")]),
        n("GatherElements", [chosen, name("which")], [name("its_block")], axis=1),
        n("Mul", [name("its_block"), name("block")], [name("block_start")]),
        n("Add", [name("block_start"), name("within")], [ids]),
    ]
