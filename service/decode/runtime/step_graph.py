"""The decoder step's graph as the runtime loads it: its full log-softmax row exposed where Align
needs it, float16 where asked, the top k in two stages over a large vocabulary, the encoder's keys
per layer as inputs of their own; and the inputs it declares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from service.decode.runtime.blocked_topk import block_topk
from service.decode.runtime.cache_in_place import (
    attend_in_place,
)
from service.decode.runtime.encoder_layers import (
    split_encoder_inputs,
)
from service.model.architecture import StateSpec

FULL_LOG_PROBS = "full_log_probs"  # (N, V): the decoder step's whole log-softmax row


def expose_full_log_probs(model: onnx.ModelProto) -> bool:
    """Make the input of the decoder-step graph's TopK (the log-softmax over the target vocabulary,
    in vocabulary order) also an output, FULL_LOG_PROBS; False when no TopK produces the
    contract's `log_probs` (True, unchanged, where the graph has that output already).

    Align's teacher forcing needs the log-prob of one given token per row, not the top k: asking
    the graph's TopK for k = V sorts every row of V (measured: a third of greedy decoding's tokens
    per second at V = 8,000); this reads the row before the TopK, from the same weights and step."""
    graph = model.graph
    if any(o.name == FULL_LOG_PROBS for o in graph.output):
        return True
    topk = next((n for n in graph.node if n.op_type == "TopK" and "log_probs" in n.output), None)
    if topk is None:
        return False
    graph.node.append(helper.make_node("Identity", [topk.input[0]], [FULL_LOG_PROBS]))
    graph.output.append(
        helper.make_tensor_value_info(FULL_LOG_PROBS, onnx.TensorProto.FLOAT, ["N", "V"])
    )
    return True


def topk_reads_k_on_the_host(model: onnx.ModelProto) -> bool:
    """Let the step's TopK read `k` as it is bound, in host memory; False (graph unchanged) where
    the graph is not the exporter's `Reshape(k, [1]) → TopK`.

    The contract's `k` is a scalar and TopK wants a 1-element tensor in host memory. The exporter's
    Reshape between them has a CUDA kernel, so under the CUDA provider ONNX Runtime copied k to the
    GPU, reshaped it there and copied it back for the TopK: a Memcpy node and a synchronization in
    every step. With `k` declared (1,) and fed to the TopK directly, nothing crosses."""
    graph = model.graph
    k = next((i for i in graph.input if i.name == "k"), None)
    if k is None or len(k.type.tensor_type.shape.dim) != 0:
        return False
    users = [n for n in graph.node if "k" in n.input]
    if len(users) != 1 or users[0].op_type != "Reshape" or users[0].input[0] != "k":
        return False
    reshaped = users[0].output[0]
    readers = [n for n in graph.node if reshaped in n.input]
    if not readers or any(
        n.op_type != "TopK" or list(n.input) != [n.input[0], reshaped] for n in readers
    ):
        return False
    if any(o.name == reshaped for o in graph.output):
        return False
    for n in readers:
        n.input[1] = "k"
    shape = users[0].input[1]
    graph.node.remove(users[0])
    if not any(shape in n.input for n in graph.node):  # the Reshape's target was its alone
        for n in [n for n in graph.node if n.op_type == "Constant" and shape in n.output]:
            graph.node.remove(n)
        for i in [i for i in graph.initializer if i.name == shape]:
            graph.initializer.remove(i)
    k.type.tensor_type.shape.dim.add().dim_value = 1
    return True


# float16_decoder keeps these in float32: the log-softmax (the scores and the search read it) and
# what onnxruntime's converter keeps there by default (TopK among them)
FLOAT32_OPS = ("LogSoftmax",)


def float16_decoder(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder step with its weights and arithmetic in float16 (RuntimeConfig.fp16_decoder):
    onnxruntime's own converter (onnxruntime.transformers.float16, in the onnxruntime wheel), its
    inputs and outputs kept float32, the log-softmax and the top k too (FLOAT32_OPS and the
    converter's default block list): the search's scores are the float32 log-probs, in float64."""
    from onnxruntime.transformers.float16 import (  # imported on use: ~0.2 s
        DEFAULT_OP_BLOCK_LIST,
        convert_float_to_float16,
    )

    blocked = sorted({*DEFAULT_OP_BLOCK_LIST, *FLOAT32_OPS})
    converted: onnx.ModelProto = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=blocked
    )
    return converted


def decoder_graph(
    path: Path,
    full_log_probs: bool = False,
    fp16: bool = False,
    edit: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None,
    blocked_vocab: int | None = None,
    layer_inputs: bool = False,
    in_place: Sequence[StateSpec] = (),
) -> tuple[str | bytes | None, bool]:
    """The decoder-step graph as ONNX Runtime gets it: changed by `edit` where given (Align's
    choice of a cross-attention, service/decode/runtime/attention_choice.py), in float16 with `fp16`
    (`float16_decoder`), with TopK reading k on the host (`topk_reads_k_on_the_host`), for
    `full_log_probs` with FULL_LOG_PROBS exposed (None when it cannot be), and with
    `blocked_vocab` (the target vocabulary's size) its top k in two stages
    (service/decode/runtime/blocked_topk.py), with `layer_inputs` each layer's part of the encoder keys
    and values an input of its own (service/decode/runtime/encoder_layers.py), with `in_place` those
    caches attended in place (service/decode/runtime/cache_in_place.py: ValueError where the graph does
    not read them as it expects); and whether k is bound as a (1,) host tensor. A file onnx cannot
    parse is passed on by its path, for ONNX Runtime's own error naming it."""
    try:
        model = onnx.load(str(path))
    except Exception:  # a damaged file: make_session reports it
        return (None if full_log_probs else str(path)), False
    if edit is not None:
        model = edit(model)
    if in_place and not attend_in_place(model, in_place):
        raise ValueError(f"{path}: its self-attentions do not read their caches as expected")
    if fp16:
        model = float16_decoder(model)
    k_on_host = topk_reads_k_on_the_host(model)
    if full_log_probs and not expose_full_log_probs(model):
        return None, k_on_host
    if blocked_vocab is not None:
        block_topk(model, "log_probs", blocked_vocab)
    if layer_inputs:
        split_encoder_inputs(model)
    return model.SerializeToString(), k_on_host


@dataclass(frozen=True)
class GraphInput:
    """A graph input's name, ONNX Runtime type string and shape (service/model/graph_contract.py)."""

    name: str
    type: str
    shape: list[int | str | None]
