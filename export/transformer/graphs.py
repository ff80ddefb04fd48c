"""A Transformer's two graphs in the contract's names (service/model/graph_contract.py).

The decoder step reads each layer's self-attention cache as a growing state tensor (R, heads, L,
d / heads), or (R, L, d) without the fused kernel, reorders it by the back-pointers, and writes it
one entry longer; `positions` (N,)
place each row's entries and its token. The cache is a tensor in and a tensor out, so the search
(host or device) holds it between steps as it holds an RNN's state, and cuts its unread past.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from export.onnx.to_onnx import (
    DECODER_AXES,
    DECODER_INPUTS,
    DECODER_OUTPUTS,
    ENCODER_AXES,
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    export_graph,
)
from export.transformer.model import TransformerSeq2Seq


class EncoderGraph(nn.Module):
    def __init__(self, model: TransformerSeq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.model.encode(src, src_lengths)


class DecoderStepGraph(nn.Module):
    """The contract's inputs, then each layer's cache (`self_k<i>`, `self_v<i>`), then positions;
    outputs top-k log-probabilities and our ids, the (empty) state, the alignment, the caches."""

    def __init__(self, model: TransformerSeq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        tokens, state, reorder, values, keys, mask, k = inputs[:7]
        caches = [cache.index_select(0, reorder) for cache in inputs[7:-1]]
        positions = inputs[-1]
        log_probs, grown, alignment = self.model.decode_step(
            tokens, values, keys, mask, caches, positions
        )
        top_lp, top_ids = torch.topk(log_probs, cast(int, k), dim=-1)
        new_state = state.index_select(0, reorder)
        return (top_lp, top_ids, new_state, alignment, *grown)


def use_fused_kernel(path: Path) -> None:
    """The decoder step's `s2s::MultiHeadAttention` placeholders (export/transformer/model.py)
    made ONNX Runtime's com.microsoft MultiHeadAttention: their inputs in the kernel's slots
    (query, key, value, -, key_padding_mask, -, past_key, past_value), masked scores at float32's
    lowest, as the plain ops mask them."""
    model = onnx.load(str(path))
    placeholders = [node for node in model.graph.node if node.domain == "s2s"]
    if not placeholders:
        return
    for node in placeholders:
        q, k, v, mask, *past = node.input
        node.domain = "com.microsoft"
        node.input[:] = [q, k, v, "", mask, "", *past]
        node.attribute.append(
            onnx.helper.make_attribute("mask_filter_value", float(np.finfo(np.float32).min))
        )
    kept = [o for o in model.opset_import if o.domain != "s2s"]
    del model.opset_import[:]
    model.opset_import.extend([*kept, onnx.helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path))


def example_inputs(
    model: TransformerSeq2Seq, B: int = 2, S: int = 5, K: int = 3, L: int = 2
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    cfg = model.cfg
    src = torch.randint(4, cfg.src_vocab_size, (B, S))
    lengths = torch.tensor([S] + [max(1, S - 2)] * (B - 1))
    with torch.no_grad():
        values, keys, mask, state = model.encode(src, lengths)
    N = B * K
    reorder = torch.arange(B).repeat_interleave(K)
    tokens = torch.full((N,), cfg.bos_id, dtype=torch.long)
    caches = [torch.randn(spec.shape(B, L)) for spec in cfg.decoder_states]
    positions = torch.full((N,), L, dtype=torch.long)
    k = torch.tensor(K, dtype=torch.long)
    step = (tokens, state, reorder, values, keys, mask, k, *caches, positions)
    return (src, lengths), step


def export_graphs(model: TransformerSeq2Seq, out_dir: Path) -> tuple[Path, Path]:
    """Write encoder.onnx and decoder.onnx with dynamic batch, hypothesis, length and cache axes."""
    model.eval()
    cfg = model.cfg
    enc_inputs, dec_inputs = example_inputs(model)
    names = [spec.name for spec in cfg.decoder_states]
    dec_in = [*DECODER_INPUTS, *names, "positions"]
    dec_out = [*DECODER_OUTPUTS, *(f"new_{name}" for name in names)]
    axes = {
        **DECODER_AXES,
        "positions": {0: "hyps"},
        **{s.name: {0: "state_rows", s.length_axis: "past"} for s in cfg.decoder_states},
        **{f"new_{s.name}": {0: "hyps", s.length_axis: "past_and_one"} for s in cfg.decoder_states},
    }
    encoder_path, decoder_path = out_dir / "encoder.onnx", out_dir / "decoder.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript")
        export_graph(
            EncoderGraph(model), enc_inputs, encoder_path, (ENCODER_INPUTS, ENCODER_OUTPUTS),
            ENCODER_AXES,
        )  # fmt: skip
        export_graph(DecoderStepGraph(model), dec_inputs, decoder_path, (dec_in, dec_out), axes)
    use_fused_kernel(decoder_path)
    for path in (encoder_path, decoder_path):
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return encoder_path, decoder_path
