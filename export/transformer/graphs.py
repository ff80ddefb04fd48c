"""A Transformer's two graphs in the contract's names (service/model/graph_contract.py).

The decoder step reads each layer's self-attention cache as a growing state tensor (R, L, d),
reorders it by the back-pointers, and writes it one entry longer (N, L+1, d); `positions` (N,)
place each row's entries and its token. The cache is a tensor in and a tensor out, so the search
(host or device) holds it between steps as it holds an RNN's state, and cuts its unread past.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import cast

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
    caches = [torch.randn(B, L, spec.width) for spec in cfg.decoder_states]
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
        **{name: {0: "state_rows", 1: "past"} for name in names},
        **{f"new_{name}": {0: "hyps", 1: "past_and_one"} for name in names},
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
    for path in (encoder_path, decoder_path):
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return encoder_path, decoder_path
