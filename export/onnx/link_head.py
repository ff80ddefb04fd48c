"""The link head to ONNX (`link_head.onnx`, the contract in service/decode/runtime/link_head.py), with a
parity check of the graph against the trained module on real pairs."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from export.onnx.to_onnx import OPSET
from export.train.link_head import Example, predict
from service.decode.runtime import link_head as contract

AXES = {
    "source_states": {1: "src_words"},
    "source_ids": {1: "src_pieces"},
    "source_pool": {1: "src_words", 2: "src_pieces"},
    "target_ids": {1: "tgt_pieces"},
    "target_pool": {1: "tgt_words", 2: "tgt_pieces"},
    "cell_features": {1: "tgt_words", 2: "src_words"},
    contract.OUTPUT: {1: "tgt_words", 2: "src_words"},
}


def example_inputs(example: Example) -> dict[str, np.ndarray]:
    """One example as the served graph receives it."""
    return contract.head_inputs(
        example.states,
        example.src_ids,
        example.src_word_of,
        example.tgt_ids,
        example.tgt_word_of,
        example.features,
    )


def export_link_head(net: nn.Module, sample: Example, path: Path) -> Path:
    """Write the graph for one pair per call, sentence lengths dynamic."""
    inputs = tuple(torch.from_numpy(a) for a in example_inputs(sample).values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # batch-size-1 GRU and tracer warnings: shapes are dynamic
        torch.onnx.export(
            net.eval(),
            inputs,
            str(path),
            input_names=list(contract.INPUTS),
            output_names=[contract.OUTPUT],
            dynamic_axes=AXES,
            opset_version=OPSET,
            dynamo=False,
        )
    return path


def parity_error(net: nn.Module, path: Path, examples: Sequence[Example]) -> float:
    """The largest |logit difference| between the graph (one pair per call) and the module
    (batched, padded) over `examples`."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = predict(net, examples)
    worst = 0.0
    for example, want in zip(examples, reference, strict=True):
        (got,) = session.run([contract.OUTPUT], example_inputs(example))
        worst = max(worst, float(np.abs(got[0] - want).max()))
    return worst
