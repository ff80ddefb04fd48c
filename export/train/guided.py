"""Guided alignment: an extra training loss that pulls the attention toward gold word links.

Attention trained only through the translation loss is free to look anywhere that helps predict the
next token; with a bidirectional encoder a neighbour's state also carries a word's identity, so the
argmax can settle one word off (measured on the reversal task: docs/alignment.md). Guided alignment
(Chen et al. 2016, "Guided Alignment Training for Topic-Aware NMT"; Marian's --guided-alignment
with its "ce" cost) adds, for every target piece whose word has gold links, the cross-entropy of the
attention row against the gold distribution: uniform over the pieces of the word's gold source
words. Target pieces without gold add nothing. Enabled by `[optim] guided_alignment = weight` when
the training split has a gold sidecar (export/data/gold.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from export.data.gold import GoldLinks
from service.decode.shared.alignment import word_index

EPS = 1e-6  # keeps log(attention) finite where the attention is exactly 0 (padding is never guided)


def piece_guide(gold: GoldLinks, src_pieces: list[str], tgt_pieces: list[str]) -> np.ndarray | None:
    """Gold word links → a piece-level target attention (T, S): row t uniform over the pieces of
    the gold source words of target piece t's word, zero where that word has no link. None when the
    pieces hold fewer words than the gold indexes (a tokenizer that rewrites spaces)."""
    if not src_pieces or not tgt_pieces:
        return None
    src_word, tgt_word = word_index(src_pieces), word_index(tgt_pieces)  # (S,), (T,)
    n_src, n_tgt = int(src_word[-1]) + 1, int(tgt_word[-1]) + 1
    if any(s >= n_src or t >= n_tgt for s, t in gold.words):
        return None
    word_links = np.zeros((n_tgt, n_src), dtype=np.float32)  # (T', S')
    for s, t in gold.words:
        word_links[t, s] = 1.0
    guide = word_links[tgt_word][:, src_word]  # (T, S): 1 where the pieces' words are linked
    total = guide.sum(axis=1, keepdims=True)  # (T, 1)
    return np.divide(guide, total, out=np.zeros_like(guide), where=total > 0)


def guided_loss(attention: Tensor, guide: Tensor) -> Tensor:
    """attention, guide (B, T, S) → the mean over guided rows of -Σ_s guide log attention."""
    rows = guide.sum(-1) > 0  # (B, T)
    if not bool(rows.any()):
        return attention.new_zeros(())
    cross_entropy = -(guide * torch.log(attention + EPS)).sum(-1)  # (B, T)
    return cross_entropy[rows].mean()
