"""A Transformer encoder-decoder in the graph contract's terms (service/model/graph_contract.py).

One module holds the equations of the Transformers the importers read (Hugging Face's Marian, and
the shapes Marian and OpenNMT-py train): post-norm or pre-norm layers, ReLU/GELU/swish
feed-forwards, sinusoidal or learned positions, scaled embeddings, tied or untied output layers.
An importer builds it from a checkpoint and export/transformer/graphs.py writes its two graphs.

What the graphs hand each other, and why:
- The encoder computes every decoder layer's cross-attention keys and values once per sentence:
  `keys` and `values` (B, S, dec_layers * d_model), each layer's side by side. The decoder step
  reads them per sentence (B), never copied per hypothesis: its queries are grouped (B, K, ·).
- The decoder's state is a self-attention key and value cache per layer, `self_k<i>` and
  `self_v<i>`, (R, heads, L, d_model / heads) where the step attends with ONNX Runtime's fused
  kernel (`fused_attention`, FusedSelfAttention), (R, L, d_model) in bundles made before it,
  growing a step at a time; the step reorders them by the beam's back-pointers and writes them
  one entry longer. A row's entries are its last `positions` + 1
  along L (left-padded where it joined later), so its mask is computed from `positions`.
- Token ids are ours (PAD, BOS, EOS, UNK = 0-3): the importer permutes the embedding and output
  rows into our order (export/importers/common.py), a row the toolkit lacks (our BOS, where its
  decoder starts from its pad) gets a -inf output bias, out of the log-softmax, so that the
  log-softmax runs over exactly the toolkit's vocabulary, and `banned` rows (Hugging Face's
  `bad_words_ids`: the pad) get -inf after it, as its beam does. The TopK reads that log-softmax
  in our vocabulary's order (the contract's; Align and the controls read the same row).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from service.model.architecture import ModelConfig, StateSpec, TransformerShape


def activation(name: str) -> nn.Module:
    """The feed-forward's nonlinearity by the shape's name."""
    return {
        "relu": nn.ReLU(),
        "gelu": nn.GELU(),
        "gelu_tanh": nn.GELU(approximate="tanh"),
        "swish": nn.SiLU(),
    }[name]


def sinusoid_halves(rows: int, dim: int) -> Tensor:
    """Sines in the first half, cosines in the second, frequencies 10000^(-2i/dim), computed in
    float64 then cast: Hugging Face's MarianSinusoidalPositionalEmbedding, row for row."""
    pos = np.arange(rows, dtype=np.float64)[:, None]
    j = np.arange(dim)
    angle = pos / np.power(10000, 2 * (j // 2) / dim)
    half = (dim + 1) // 2
    out = np.empty((rows, dim), dtype=np.float64)
    out[:, :half] = np.sin(angle[:, 0::2])
    out[:, half:] = np.cos(angle[:, 1::2])
    return torch.from_numpy(out.astype(np.float32))


def sinusoid_marian(rows: int, dim: int) -> Tensor:
    """Marian's (layers.h, addPositionalEmbeddings): timescales exp(-i · log(10000) / (dim/2 - 1)),
    sines then cosines, in float32."""
    half = dim // 2
    increment = math.log(10000.0) / max(half - 1, 1)
    scales = torch.exp(torch.arange(half, dtype=torch.float32) * -increment)
    angle = torch.arange(rows, dtype=torch.float32)[:, None] * scales[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def sinusoid_interleaved(rows: int, dim: int) -> Tensor:
    """Sines at even features, cosines at odd, frequencies exp(-2i · log(10000) / dim), in
    float32: OpenNMT-py's SinusoidalInterleaved (onmt/modules/embeddings.py)."""
    pe = torch.zeros(rows, dim)
    position = torch.arange(0, rows).unsqueeze(1).float()
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe


def position_table(kind: str, rows: int, dim: int) -> Tensor:
    if kind == "sinusoidal_interleaved":
        return sinusoid_interleaved(rows, dim)
    if kind == "sinusoidal_halves":
        return sinusoid_halves(rows, dim)
    if kind == "sinusoidal_marian":
        return sinusoid_marian(rows, dim)
    return torch.zeros(rows, dim)  # learned: the importer loads the table


class Attention(nn.Module):
    """Multi-head scaled dot-product attention's projections (q, k, v, out)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.scaling = self.head_dim**-0.5
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        heads_of = torch.arange(d_model) // self.head_dim
        self.head_mask: Tensor
        self.register_buffer(
            "head_mask", (heads_of[:, None] == torch.arange(heads)).float(), persistent=False
        )  # (d, h): 1 where a feature belongs to a head

    def split(self, x: Tensor) -> Tensor:
        """(..., T, d) → (..., heads, T, head_dim)."""
        shape = (*x.shape[:-1], self.heads, self.head_dim)
        return x.reshape(shape).transpose(-3, -2)

    def merge(self, x: Tensor) -> Tensor:
        """(..., heads, T, head_dim) → (..., T, d)."""
        x = x.transpose(-3, -2)
        return x.reshape((*x.shape[:-2], self.heads * self.head_dim))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """q (..., h, Tq, dh), k and v (..., h, Tk, dh), valid broadcasting to (..., h, Tq, Tk):
        the context (..., h, Tq, dh) and the weights."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        return torch.matmul(weights, v), weights

    def attend_rows(
        self, q: Tensor, keys: Tensor, values: Tensor, valid: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Attention over keys and values kept as they are stored, (G, T, d), heads side by side:
        q (G, M, d), valid broadcasting to (G, M, h, T) → the context (G, M, d) and the weights
        (G, M, h, T). Each head's query is spread over a block-diagonal (d, M·h) matrix, so one
        batched product reads the keys once and gives every head's scores; the values are read
        once the same way. No head is split off a stored tensor: a decoder step's cache, (N, L, d)
        and a step longer each time, is never transposed (the split-heads way copied it twice a
        step, a quarter of the step's time at OPUS-MT's shape)."""
        G, M, d = q.shape
        T = keys.shape[1]
        h = self.heads
        spread = (q.unsqueeze(-1) * self.head_mask).transpose(1, 2).reshape(G, d, M * h)
        scores = torch.matmul(keys, spread).reshape(G, T, M, h).permute(0, 2, 3, 1)
        scores = scores * self.scaling
        scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (G, M, h, T)
        every = torch.matmul(weights.reshape(G, M * h, T), values).reshape(G, M, h, d)
        return (every * self.head_mask.t()).sum(dim=2), weights


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, d) → (B, heads, T, d / heads)."""
    B, T, d = x.shape
    return x.reshape(B, T, heads, d // heads).transpose(1, 2)


def fused_reference(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, heads: int) -> Tensor:
    """What ONNX Runtime's MultiHeadAttention computes: q (B, M, d), keys and values
    (B, heads, T, d / heads), mask (B, T) int32 (1: read) → the context (B, M, d)."""
    B, M, d = q.shape
    scores = torch.matmul(split_heads(q, heads), keys.transpose(-1, -2)) * (d // heads) ** -0.5
    scores = scores.masked_fill(mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
    context = torch.matmul(torch.softmax(scores, dim=-1), values)  # (B, heads, M, dh)
    return context.transpose(1, 2).reshape(B, M, d)


class FusedSelfAttention(torch.autograd.Function):
    """A decoder step's self-attention through ONNX Runtime's MultiHeadAttention kernel
    (com.microsoft): q, k, v (N, 1, d) of the new token, mask (N, P + 1) int32, past keys and
    values (N, heads, P, d / heads) → the context (N, 1, d) and the caches one entry longer. The
    kernel appends the new entry and attends per head over contiguous memory, in one op (the plain
    ops it replaces: a concatenation, a spread of each head's query, two products, a mask and a
    sum, 40% of an OPUS-MT step's time beside its matrix products). Exported as the placeholder
    `s2s::MultiHeadAttention` that export/transformer/graphs.py rewrites into the kernel (the
    TorchScript exporter cannot leave its optional inputs empty)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: object, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, past_k: Tensor,
        past_v: Tensor, heads: int,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        keys = torch.cat([past_k, split_heads(k, heads)], dim=2)
        values = torch.cat([past_v, split_heads(v, heads)], dim=2)
        return fused_reference(q, keys, values, mask, heads), keys, values

    @staticmethod
    def symbolic(  # type: ignore[no-untyped-def]
        g, q, k, v, mask, past_k, past_v, heads: int
    ):
        out = g.op(
            "s2s::MultiHeadAttention", q, k, v, mask, past_k, past_v, num_heads_i=heads, outputs=3
        )
        for value, like, rank in zip(out, (q, past_k, past_v), (3, 4, 4), strict=True):
            value.setType(like.type().with_sizes([None] * rank))
        return out


class FusedCrossAttention(torch.autograd.Function):
    """Cross-attention through the same kernel: q (B, K, d) (a sentence's hypotheses as its
    queries), keys and values (B, S, d) as the encoder wrote them, mask (B, S) int32 → (B, K, d).
    The kernel gives no weights: the alignment layer keeps the plain ops (Attention.attend_rows)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: object, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, heads: int
    ) -> Tensor:
        return fused_reference(q, split_heads(k, heads), split_heads(v, heads), mask, heads)

    @staticmethod
    def symbolic(g, q, k, v, mask, heads: int):  # type: ignore[no-untyped-def]
        out = g.op("s2s::MultiHeadAttention", q, k, v, mask, num_heads_i=heads)
        out.setType(q.type().with_sizes([None] * 3))
        return out


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, kind: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.act = activation(kind)
        self.fc2 = nn.Linear(ffn_dim, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Sublayer(nn.Module):
    """A residual block's norm: after the addition (post-norm) or before the block (pre-norm)."""

    def __init__(self, d_model: int, pre_norm: bool, eps: float) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.norm = nn.LayerNorm(d_model, eps=eps)

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def after(self, residual: Tensor, y: Tensor) -> Tensor:
        return residual + y if self.pre_norm else self.norm(residual + y)


class EncoderLayer(nn.Module):
    def __init__(self, shape: TransformerShape, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(shape.d_model, shape.heads)
        self.attn_norm = Sublayer(shape.d_model, shape.pre_norm, eps)
        self.ffn = FeedForward(shape.d_model, shape.ffn_dim, shape.activation)
        self.ffn_norm = Sublayer(shape.d_model, shape.pre_norm, eps)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x (B, S, d), valid (B, 1, 1, S)."""
        a = self.self_attn
        h = self.attn_norm.before(x)
        context, _ = a.attend(a.split(a.q(h)), a.split(a.k(h)), a.split(a.v(h)), valid)
        x = self.attn_norm.after(x, a.out(a.merge(context)))
        return self.ffn_norm.after(x, self.ffn(self.ffn_norm.before(x)))


class DecoderLayer(nn.Module):
    def __init__(self, shape: TransformerShape, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(shape.d_model, shape.heads)
        self.self_norm = Sublayer(shape.d_model, shape.pre_norm, eps)
        self.cross_attn = Attention(shape.d_model, shape.heads)
        self.cross_norm = Sublayer(shape.d_model, shape.pre_norm, eps)
        self.ffn = FeedForward(shape.d_model, shape.ffn_dim, shape.activation)
        self.ffn_norm = Sublayer(shape.d_model, shape.pre_norm, eps)

    def step(
        self,
        x: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        self_valid: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_valid: Tensor,
        fused: bool = False,
        weighs: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """One token per hypothesis. x (N, d); past_k/v (N, L, d), already reordered, or with
        `fused` (N, heads, L, d / heads); self_valid (N, 1, 1, L+1) bool; cross_k/v (B, S, d) per
        sentence, cross_valid (B, 1, 1, S) bool, N = B*K. Returns x, the caches one entry longer,
        and where it `weighs`, the cross-attention weights (B, K, h, S)."""
        B = cross_k.shape[0]
        N, d = x.shape
        K = N // B
        a = self.self_attn
        h = self.self_norm.before(x)
        k_new, v_new, q = a.k(h).unsqueeze(1), a.v(h).unsqueeze(1), a.q(h).unsqueeze(1)
        if fused:
            mask = self_valid.reshape(N, -1).to(torch.int32)
            context, new_k, new_v = FusedSelfAttention.apply(
                q, k_new, v_new, mask, past_k, past_v, a.heads
            )
        else:
            new_k = torch.cat([past_k, k_new], dim=1)  # (N, L+1, d)
            new_v = torch.cat([past_v, v_new], dim=1)
            context, _ = a.attend_rows(q, new_k, new_v, self_valid)
        x = self.self_norm.after(x, a.out(context.reshape(N, d)))
        c = self.cross_attn
        h = self.cross_norm.before(x)
        q = c.q(h).reshape(B, K, d)
        weights = None
        if fused and not weighs:
            mask = cross_valid.reshape(B, -1).to(torch.int32)
            context = FusedCrossAttention.apply(q, cross_k, cross_v, mask, c.heads)
        else:
            context, weights = c.attend_rows(q, cross_k, cross_v, cross_valid)
        x = self.cross_norm.after(x, c.out(context.reshape(N, d)))
        x = self.ffn_norm.after(x, self.ffn(self.ffn_norm.before(x)))
        return x, new_k, new_v, weights


class TransformerSeq2Seq(nn.Module):
    """Encoder and decoder step with the graph contract's interface (export/transformer/graphs.py).

    `banned`: target ids never emitted (-inf after the log-softmax); `max_positions`: rows of the position tables (a position past them reads the last row);
    `final_norms`: a layer norm after the encoder's and the decoder's stacks (pre-norm models)."""

    def __init__(
        self,
        cfg: ModelConfig,
        max_positions: int,
        banned: tuple[int, ...] = (),
        final_norms: bool | None = None,
        eps: float | None = None,
    ) -> None:
        super().__init__()
        shape = cfg.transformer
        assert shape is not None, "a Transformer's config carries its shape"
        self.cfg = cfg
        self.shape = shape
        d = shape.d_model
        eps = shape.norm_eps if eps is None else eps
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, d)
        self.embed_scale = math.sqrt(d) if shape.scale_embedding else 1.0
        # buffers, not parameters: an importer loads the weights, a learned or a toolkit's own
        # table is copied in apart (export/importers/opennmt_transformer.py)
        self.src_positions: Tensor
        self.tgt_positions: Tensor
        self.register_buffer("src_positions", position_table(shape.positions, max_positions, d))
        self.register_buffer("tgt_positions", position_table(shape.positions, max_positions, d))
        self.encoder = nn.ModuleList(EncoderLayer(shape, eps) for _ in range(shape.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(shape, eps) for _ in range(shape.dec_layers))
        norms = shape.pre_norm if final_norms is None else final_norms
        self.enc_norm = nn.LayerNorm(d, eps=eps) if norms else None
        self.dec_norm = nn.LayerNorm(d, eps=eps) if norms else None
        self.out = nn.Linear(d, cfg.tgt_vocab_size)
        self.banned: Tensor  # (n,) the ids written -inf in each row (a ScatterND: ONNX Runtime
        # copies the row first, as long as the added (V,) row of 0 and -inf it replaced; a Where
        # took twice that)
        self.register_buffer("banned", torch.tensor(sorted(banned), dtype=torch.long), False)

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.decoder]

    def tie_output(self) -> None:
        """The output layer reads the decoder's embedding (one weight, one initializer)."""
        self.out.weight = self.tgt_embed.weight

    @staticmethod
    def state_specs(shape: TransformerShape) -> tuple[StateSpec, ...]:
        """Each decoder layer's self-attention key and value cache, growing a step at a time
        (head by head where the step attends with the fused kernel)."""
        heads = shape.heads if shape.fused_attention else 0
        return tuple(
            StateSpec(f"self_{kv}{i}", shape.d_model, growing=True, heads=heads)
            for i in range(shape.dec_layers)
            for kv in ("k", "v")
        )

    def position_rows(self, table: Tensor, positions: Tensor) -> Tensor:
        return table[positions.clamp(max=table.shape[0] - 1)]

    def encode(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """src (B, S) our ids, lengths (B,) → values, keys (B, S, dec_layers·d), mask (B, S),
        state (B, 0)."""
        B, S = src.shape
        mask = torch.arange(S, device=src.device).unsqueeze(0) < lengths.unsqueeze(1)
        x = self.src_embed(src) * self.embed_scale
        x = x + self.position_rows(self.src_positions, torch.arange(S, device=src.device))
        valid = mask[:, None, None, :]
        for layer in self.encoder:
            x = layer(x, valid)
        if self.enc_norm is not None:
            x = self.enc_norm(x)
        keys = torch.cat([layer.cross_attn.k(x) for layer in self.decoder_layers()], dim=-1)
        values = torch.cat([layer.cross_attn.v(x) for layer in self.decoder_layers()], dim=-1)
        return values, keys, mask, x.new_zeros(B, 0)

    def decode_step(
        self,
        tokens: Tensor,
        values: Tensor,
        keys: Tensor,
        mask: Tensor,
        caches: list[Tensor],
        positions: Tensor,
    ) -> tuple[Tensor, list[Tensor], Tensor]:
        """tokens (N,) our ids at `positions` (N,); caches: each layer's keys then values
        (N, L, d), or (N, heads, L, d / heads) with `fused_attention`, reordered. Returns the output layer's log-probabilities (N, V_out) (banned
        ids -inf), the caches one entry longer, and the alignment (N, S)."""
        N = tokens.shape[0]
        S = mask.shape[1]
        d = self.shape.d_model
        x = self.tgt_embed(tokens) * self.embed_scale
        x = x + self.position_rows(self.tgt_positions, positions)
        fused = self.shape.fused_attention
        L = caches[0].shape[-2] if caches else 0
        entry = torch.arange(L + 1, device=tokens.device).unsqueeze(0)  # (1, L+1)
        self_valid = (entry >= (L - positions).unsqueeze(1))[:, None, None, :]  # (N,1,1,L+1)
        cross_valid = mask[:, None, None, :]
        grown: list[Tensor] = []
        chosen: Tensor | None = None
        align = self.shape.align_layer % self.shape.dec_layers
        for i, layer in enumerate(self.decoder_layers()):
            part = slice(i * d, (i + 1) * d)
            x, new_k, new_v, weights = layer.step(
                x, caches[2 * i], caches[2 * i + 1], self_valid,
                keys[:, :, part], values[:, :, part], cross_valid, fused, i == align,
            )  # fmt: skip
            grown += [new_k, new_v]
            if i == align:
                chosen = weights
        if self.dec_norm is not None:
            x = self.dec_norm(x)
        log_probs = torch.log_softmax(self.out(x), dim=-1)
        if len(self.banned):
            log_probs[:, self.banned] = float("-inf")
        assert chosen is not None
        heads = list(self.shape.align_heads)
        picked = chosen[:, :, heads] if heads else chosen  # (B, K, h', S)
        alignment = picked.mean(dim=2).reshape(N, S)
        return log_probs, grown, alignment
