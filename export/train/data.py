"""Turn tokenized pairs into padded, length-bucketed training batches."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from service.model.architecture import BOS_ID, EOS_ID, PAD_ID
from service.model.tokenizer import Tokenizer


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids, PAD after each sentence's end
    lengths: Tensor  # (B,)
    tgt_in: Tensor  # (B, T) BOS y_1 .. y_n, PAD
    tgt_out: Tensor  # (B, T) y_1 .. y_n EOS, PAD
    # (B, T, S) gold attention per target step for guided alignment (export/train/guided.py), or None
    guide: Tensor | None = None

    @property
    def n_target_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(
            src=self.src.to(device),
            lengths=self.lengths.to(device),
            tgt_in=self.tgt_in.to(device),
            tgt_out=self.tgt_out.to(device),
            guide=self.guide.to(device) if self.guide is not None else None,
        )


def encode_pairs(
    pairs: Sequence[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer
) -> list[tuple[list[int], list[int]]]:
    return [(src_tok.encode(s), tgt_tok.encode(t)) for s, t in pairs]


def pad(rows: Sequence[Sequence[int]]) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)  # (B, width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def make_batch(
    examples: Sequence[tuple[list[int], list[int]]],
    guides: Sequence[np.ndarray | None] | None = None,
) -> Batch:
    """Padded tensors of the examples; with `guides` (one (T_i, S_i) gold attention or None per
    example), also the zero-padded (B, T, S) guide (the EOS step and unguided sentences all 0)."""
    srcs = [s or [PAD_ID] for s, _ in examples]  # an empty source still needs one position
    batch = Batch(
        src=pad(srcs),
        lengths=torch.tensor([max(len(s), 1) for s, _ in examples], dtype=torch.long),
        tgt_in=pad([[BOS_ID, *t] for _, t in examples]),
        tgt_out=pad([[*t, EOS_ID] for _, t in examples]),
    )
    if guides is not None:
        B, T = batch.tgt_in.shape
        guide = np.zeros((B, T, batch.src.shape[1]), dtype=np.float32)  # (B, T, S)
        for i, g in enumerate(guides):
            if g is not None:
                guide[i, : g.shape[0], : g.shape[1]] = g
        batch.guide = torch.from_numpy(guide)
    return batch


def batches(
    examples: Sequence[tuple[list[int], list[int]]],
    max_tokens: int,
    rng: random.Random,
    pool: int = 50,
    guides: Sequence[np.ndarray | None] | None = None,
) -> Iterator[Batch]:
    """Shuffled batches of similar lengths, each about `max_tokens` target tokens (padding included);
    `guides` (one per example) go with their examples into `Batch.guide`."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    chunk = max_tokens * pool // 16
    groups: list[list[int]] = []
    for start in range(0, len(order), chunk):
        window = sorted(order[start : start + chunk], key=lambda i: len(examples[i][1]))
        group: list[int] = []
        for i in window:
            longest = max(len(examples[j][1]) + 1 for j in [*group, i])
            if group and longest * (len(group) + 1) > max_tokens:
                groups.append(group)
                group = []
            group.append(i)
        if group:
            groups.append(group)
    rng.shuffle(groups)
    for group in groups:
        yield make_batch(
            [examples[i] for i in group], [guides[i] for i in group] if guides else None
        )
