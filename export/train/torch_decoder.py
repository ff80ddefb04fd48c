"""The PyTorch model's own decoder step behind the search's `Decoder` protocol.

The same numpy beam search drives it as drives ONNX Runtime, so tests compare the two decodes of one
checkpoint and the benchmark measures eager PyTorch against the exported graph on equal terms.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor

from export.train.model import Seq2Seq
from service.decode.shared.search_types import StepOutput


def top_k_log_probs(logits: Tensor, k: Tensor | int) -> tuple[Tensor, Tensor]:
    """The k best log-softmax values and their ids, (N, k) each. (TopK on the logits minus a
    logsumexp was tried: ONNX Runtime's ReduceLogSumExp is 6x slower than its LogSoftmax.)"""
    # k as a 0-d tensor stays a graph input (a Python int would be baked in); topk's stub says int
    return torch.topk(torch.log_softmax(logits, dim=-1), cast(int, k), dim=-1)


class TorchDecoder:
    """A static batch: encoder outputs for all sentences at construction, state rows 0..B-1."""

    def __init__(self, model: Seq2Seq, src: np.ndarray, lengths: np.ndarray) -> None:
        self.model = model.eval()
        with torch.no_grad():
            enc = model.encode(torch.from_numpy(src), torch.from_numpy(lengths))
        self.values, self.keys, self.mask = enc.values, enc.keys, enc.mask  # (B, S, ·)
        self.state = enc.state  # (R, D_state)

    @torch.no_grad()
    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        state = self.state.index_select(0, torch.from_numpy(reorder))  # (N, D_state)
        logits, self.state, attention = self.model.decode_step(
            torch.from_numpy(tokens), state, self.keys, self.values, self.mask
        )
        top_lp, top_ids = top_k_log_probs(logits, k)  # (N, k), as the exported graph computes them
        return StepOutput(
            log_probs=top_lp.numpy(), token_ids=top_ids.numpy(), attention=attention.numpy()
        )

    def keep_sentences(self, keep: np.ndarray) -> None:
        idx = torch.from_numpy(np.asarray(keep, dtype=np.int64))
        self.values, self.mask = self.values[idx], self.mask[idx]
        self.keys = self.keys[idx]
