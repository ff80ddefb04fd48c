"""The exported graphs against the PyTorch model they came from, on real sentences.

The ONNX encoder reads a padded batch of a split's sources and the ONNX decoder step is teacher-forced
through their references; at every step the top-k log-probabilities, their ids, the new state and
the attention must match PyTorch's within `tolerance`. The exporter's unit tests check every
architecture on random ids (tests/test_export.py); this runs after a real training, on the model
and data that will be served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from export.train.data import make_batch
from export.train.model import Seq2Seq

# fp32 through different kernels (ONNX Runtime's GRU/LSTM vs PyTorch's): ~1e-6 seen on tiny models.
TOLERANCE = 1e-3


class ParityError(RuntimeError):
    """The exported graphs disagree with the PyTorch model."""


@dataclass(frozen=True)
class ParityReport:
    sentences: int
    steps: int
    max_log_prob_diff: float
    max_attention_diff: float
    max_state_diff: float
    id_mismatches: int  # top-k id lists that differ (only where log-probs tie closely)

    def to_dict(self) -> dict[str, float | int]:
        return {
            "sentences": self.sentences,
            "steps": self.steps,
            "max_log_prob_diff": self.max_log_prob_diff,
            "max_attention_diff": self.max_attention_diff,
            "max_state_diff": self.max_state_diff,
            "id_mismatches": self.id_mismatches,
        }


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


@torch.no_grad()
def check_parity(
    model: Seq2Seq,
    bundle: Path,
    examples: Sequence[tuple[list[int], list[int]]],
    tolerance: float = TOLERANCE,
    k: int = 4,
) -> ParityReport:
    """Teacher-force `examples` (source ids, target ids) through bundle/encoder.onnx and
    bundle/decoder.onnx and through `model`; ParityError when they differ by more than `tolerance`."""
    model = model.eval().cpu()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = [
        ort.InferenceSession(str(bundle / name), options, providers=["CPUExecutionProvider"])
        for name in ("encoder.onnx", "decoder.onnx")
    ]
    encoder, decoder = sessions
    batch = make_batch(list(examples))
    src, lengths = batch.src.numpy(), batch.lengths.numpy()  # (B, S), (B,)
    values, keys, mask, state = encoder.run(None, {"src": src, "src_lengths": lengths})
    ref = model.encode(batch.src, batch.lengths)
    lp_diff = att_diff = 0.0
    state_diff = _diff(state, ref.state.numpy())
    mismatches = 0
    B, T = batch.tgt_in.shape
    k = min(k, model.cfg.tgt_vocab_size)
    reorder = np.arange(B, dtype=np.int64)  # (B,) every row continues itself
    ref_state = ref.state
    for t in range(T):
        tokens = batch.tgt_in[:, t]  # (B,) the reference's previous token
        feeds = {
            "tokens": tokens.numpy(),
            "state": state,
            "reorder": reorder,
            "values": values,
            "keys": keys,
            "mask": mask,
            "k": np.array(k, dtype=np.int64),
        }
        lp, ids, state, attention = decoder.run(None, feeds)
        logits, ref_state, ref_attention = model.decode_step(
            tokens, ref_state, ref.keys, ref.values, ref.mask
        )
        ref_lp, ref_ids = torch.topk(torch.log_softmax(logits, -1), k, dim=-1)  # (B, k)
        live = (batch.tgt_out[:, t] != model.cfg.pad_id).numpy()  # (B,) rows still in a sentence
        lp_diff = max(lp_diff, _diff(lp[live], ref_lp.numpy()[live]))
        att_diff = max(att_diff, _diff(attention[live], ref_attention.numpy()[live]))
        state_diff = max(state_diff, _diff(state[live], ref_state.numpy()[live]))
        mismatches += int((ids[live] != ref_ids.numpy()[live]).any(axis=1).sum())
    report = ParityReport(len(examples), T, lp_diff, att_diff, state_diff, mismatches)
    worst = max(lp_diff, att_diff, state_diff)
    if worst > tolerance:
        raise ParityError(
            f"the ONNX graphs in {bundle} differ from the PyTorch model by {worst:.2e} "
            f"(over the tolerance {tolerance:g}): {report.to_dict()}"
        )
    return report
