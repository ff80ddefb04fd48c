"""Greedy decoding for training and evaluation, on `Seq2Seq.greedy_decode` (the one greedy loop):
texts in length-sorted batches, and one sentence with its attention for heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from export.train.data import make_batch
from export.train.model import Seq2Seq
from service.model.tokenizer import Tokenizer


def translate_greedy(
    model: Seq2Seq,
    sources: list[list[int]],
    tgt_tok: Tokenizer,
    device: torch.device,
    batch_size: int = 200,
) -> list[str]:
    """Greedy-decode id lists in batches, sorted by length for speed; outputs in input order."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = make_batch([(sources[i], []) for i in idx]).to(device)
        max_len = int(batch.lengths.max()) * 2 + 10
        for i, ids in zip(idx, model.greedy(batch.src, batch.lengths, max_len), strict=True):
            out[i] = tgt_tok.decode(ids)
    return out


@torch.no_grad()
def greedy_with_attention(
    model: Seq2Seq, src_ids: Sequence[int], max_len: int | None = None
) -> tuple[list[int], np.ndarray]:
    """Greedy-decode one sentence; returns target ids (ending with EOS if produced) and weights (T_y, T_x).

    Row t holds the attention used to emit target token t (all zeros for attention "none").
    """
    model.eval()
    eos = model.cfg.eos_id
    device = next(model.parameters()).device
    batch = make_batch([(list(src_ids), [])]).to(device)  # src (1, T_x)
    max_len = max_len if max_len is not None else 2 * len(src_ids) + 10
    tokens, weights = model.greedy_decode(batch.src, batch.lengths, max_len)  # (1, T), (1, T, T_x)
    ids = tokens[0].tolist()
    ids = ids[: ids.index(eos) + 1] if eos in ids else ids
    return ids, weights[0, : len(ids)].cpu().numpy()  # (T_y, T_x)
