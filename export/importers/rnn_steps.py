"""What the RNN importers share (OpenNMT-py's, Joey NMT's, Marian's s2s): the cell kind, the
decoder state packed one row per hypothesis, the token step, attention over padded sources and a
packed encoder."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from export.importers.common import refuse_unless
from export.train.model import FoldedEmbedding, stacked_rnn_step
from service.model.architecture import ModelConfig


def gru_or_lstm(kind: str) -> str:
    """Our rnn name for a toolkit's cell name (case-insensitive); refuse others."""
    low = str(kind).lower()
    refuse_unless(
        low in ("gru", "lstm"), f"unsupported rnn type {kind!r}: only GRU and LSTM are imported"
    )
    return low


def pack_state(h: Tensor, c: Tensor | None, feed: Tensor | None) -> Tensor:
    """h, c (L, N, H) and the input feed (N, H) → one state row per hypothesis (N, state_dim)."""
    N = h.shape[1]
    parts = [h.transpose(0, 1).reshape(N, -1)]
    if c is not None:
        parts.append(c.transpose(0, 1).reshape(N, -1))
    if feed is not None:
        parts.append(feed)
    return torch.cat(parts, dim=-1)


def unpack_state(
    state: Tensor, layers: int, hidden: int, lstm: bool, feed: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The inverse of pack_state: state (N, state_dim) → h, c (L, N, H), feed (N, H)."""
    N = state.shape[0]
    size = layers * hidden
    h = state[:, :size].reshape(N, layers, hidden).transpose(0, 1)
    offset = size
    c = None
    if lstm:
        c = state[:, offset : offset + size].reshape(N, layers, hidden).transpose(0, 1)
        offset += size
    f = state[:, offset : offset + hidden] if feed else None
    return h, c, f


def token_rnn_step(
    rnn: nn.RNNBase,
    embed: nn.Embedding,
    folded: FoldedEmbedding | None,
    tokens: Tensor,
    feed: Tensor | None,
    h: Tensor,
    c: Tensor | None,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The decoder RNN's step on [y_{t-1} · scale; feed] (y alone without input feeding): top
    output (N, H), new h and c. On the exporter's copy (folded set) the bottom layer's input gates
    are looked up in the folded tables instead (export.train.model.FoldedEmbedding)."""
    if folded is not None:
        gates = folded.input_gates(tokens, feed)  # (N, G*H)
        return stacked_rnn_step(rnn, None, h, c, bottom_gates=gates)
    emb = embed(tokens) * scale  # (N, E)
    x = torch.cat([emb, feed], dim=-1) if feed is not None else emb
    return stacked_rnn_step(rnn, x, h, c)


def attend(scores: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """scores (B, K, S), values (B, S, D), mask (B, S) → context (B, K, D), weights (B, K, S);
    padding gets exactly zero weight."""
    weights = torch.softmax(scores.masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)
    return weights @ values, weights


def encode_packed(
    rnn: nn.RNNBase, emb: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
    """A batch-first RNN over packed sequences: emb (B, S, E) → outputs (B, S, D), final state(s)."""
    S = emb.shape[1]
    packed = nn.utils.rnn.pack_padded_sequence(
        emb, lengths.cpu(), batch_first=True, enforce_sorted=False
    )
    out, final = rnn(packed)
    states, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=S)
    return states, final


def unpack_rows(cfg: ModelConfig, state: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """unpack_state of a decoder of cfg's layers, width, cell and input feeding."""
    return unpack_state(state, cfg.dec_layers, cfg.dec_hidden, cfg.rnn == "lstm", cfg.input_feeding)
