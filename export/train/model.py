"""The RNN encoder-decoder with attention, in PyTorch.

One decoder step is written once (`Seq2Seq.decode_step`) and used by training (teacher forcing, a
loop over steps), by the reference decoder, and by the ONNX decoder-step graph, so the exported graph
is the trained computation itself.

Hypotheses are laid out sentence-major: with B sentences and K hypotheses each, row n = b*K + k.
Encoder tensors stay once per sentence, (B, S, ·); queries are reshaped to (B, K, ·) to attend, so
encoder states are never copied per hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from service.model.architecture import ModelConfig

# y_{t-1} as the decoder step reads it: the token ids and their embeddings (None when the
# exporter's copy looks their products up in FoldedEmbedding's tables instead)
TokenInput = tuple[Tensor, Tensor | None]


@dataclass
class Encoded:
    """What the encoder hands the decoder, once per sentence."""

    values: Tensor  # (B, S, 2*He) encoder states
    # (B, S, Dk) precomputed source-side attention projections ((B, 1, 2*He) for "none")
    keys: Tensor
    mask: Tensor  # (B, S) bool, True on real source tokens
    state: Tensor  # (B, state_dim) initial packed decoder state


def make_rnn(
    kind: str, input_size: int, hidden: int, layers: int, dropout: float, bidirectional: bool
) -> nn.RNNBase:
    cls = nn.GRU if kind == "gru" else nn.LSTM
    return cls(
        input_size,
        hidden,
        num_layers=layers,
        batch_first=True,
        dropout=dropout if layers > 1 else 0.0,
        bidirectional=bidirectional,
    )


class Encoder(nn.Module):
    """Embeddings and a bidirectional RNN over packed sequences (padding never enters the states)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.src_vocab_size, cfg.emb_dim, padding_idx=cfg.pad_id)
        self.rnn = make_rnn(
            cfg.rnn, cfg.emb_dim, cfg.enc_hidden, cfg.enc_layers, cfg.dropout, cfg.bidirectional
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.bidirectional = cfg.bidirectional

    def forward(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids, lengths (B,) → states (B, S, 2*He), summary (B, 2*He) of the top layer."""
        S = src.shape[1]
        emb = self.dropout(self.embed(src))  # (B, S, E)
        packed = pack_padded_sequence(emb, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # (B, S, 2*He)
        h_n = final[0] if isinstance(final, tuple) else final  # (layers*2, B, He)
        if not self.bidirectional:
            return states, h_n[-1]  # (B, He)
        summary = torch.cat(
            [h_n[-2], h_n[-1]], dim=-1
        )  # (B, 2*He): last forward and backward states
        return states, summary


class Attention(nn.Module):
    """Score functions of Bahdanau (additive) and Luong (dot, general, concat), plus scaled dot.

    `project_keys` runs once per sentence (W_h h, W h); `forward` runs at every decoder step.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.attention
        H, D, A = cfg.dec_hidden, cfg.enc_out_dim, cfg.attn_dim
        if self.kind == "additive":  # v^T tanh(W_s s + W_h h)
            self.w_query = nn.Linear(H, A, bias=False)
            self.w_key = nn.Linear(D, A, bias=True)
            self.v = nn.Linear(A, 1, bias=False)
        elif self.kind == "concat":  # v^T tanh(W [s; h]), W split by columns into s and h parts
            self.w = nn.Linear(H + D, A, bias=True)
            self.v = nn.Linear(A, 1, bias=False)
        elif self.kind == "general":  # s^T W h
            self.w_key = nn.Linear(D, H, bias=False)
        self.scale = 1.0 / math.sqrt(H) if self.kind == "scaled_dot" else 1.0
        self.hidden = H

    def project_keys(self, values: Tensor) -> Tensor:
        """values (B, S, D) → keys (B, S, A) for additive/concat, (B, S, H) for general/dot."""
        if self.kind == "additive":
            return self.w_key(values)
        if self.kind == "concat":
            w_h = self.w.weight[:, self.hidden :]  # (A, D)
            return values @ w_h.t() + self.w.bias
        if self.kind == "general":
            return self.w_key(values)
        return values  # dot, scaled_dot: s^T h

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """query (B, K, H), keys (B, S, Dk) → scores (B, K, S)."""
        if self.kind in ("additive", "concat"):
            q = (
                self.w_query(query)
                if self.kind == "additive"
                else query @ self.w.weight[:, : self.hidden].t()
            )
            energy = torch.tanh(q.unsqueeze(2) + keys.unsqueeze(1))  # (B, K, S, A)
            return self.v(energy).squeeze(-1)
        return (query @ keys.transpose(1, 2)) * self.scale  # (B, K, S)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """query (B, K, H) → context (B, K, D), weights (B, K, S); padding gets exactly zero weight."""
        weights = masked_softmax(self.scores(query, keys), mask.unsqueeze(1))  # (B, K, S)
        return weights @ values, weights


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis with masked positions (mask False) at exactly zero; mask
    broadcasts against scores."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


class FoldedEmbedding(nn.Module):
    """Every target token's embedding carried through the linear maps it enters at each decoder step
    (eval mode): the bottom RNN layer's input gates, bias included, and, where the readout reads
    y_{t-1}, its part of the readout, bias included. An exported decoder step then looks these rows
    up (a Gather) instead of multiplying N embeddings per step: the same sums in another order.
    Only the export uses it (export/onnx/to_onnx.py, on a copy of the model); training never does."""

    def __init__(
        self,
        embedding: Tensor,
        rnn: nn.RNNBase,
        scale: float = 1.0,
        readout: nn.Linear | None = None,
    ) -> None:
        """embedding (V, E), times scale, is the first E inputs of rnn's bottom layer and, where
        there is a readout, its last E inputs."""
        super().__init__()
        E = embedding.shape[1]
        with torch.no_grad():
            emb = embedding * scale  # (V, E)
            w_ih = cast(Tensor, rnn.weight_ih_l0)  # (G*H, I)
            gates = emb @ w_ih[:, :E].t() + cast(Tensor, rnn.bias_ih_l0)  # (V, G*H)
            rest = w_ih[:, E:].t().contiguous() if w_ih.shape[1] > E else None  # (I - E, G*H)
            # the readout's product of each token, bias included (V, H), and its weights for the
            # inputs before y_{t-1}, transposed (I - E, H); like `rest`, an initializer of the
            # graph, so that the int8 export quantizes its product
            table = None if readout is None else emb @ readout.weight[:, -E:].t() + readout.bias
            before = None if readout is None else readout.weight[:, :-E].t().contiguous()
        # parameters, not buffers: the exporter writes them as initializers (buffers become Constant
        # nodes, whose products quantize_dynamic leaves in fp32)
        for name, tensor in (("gates", gates), ("rest", rest), ("readout", table),
                             ("readout_rest", before)):  # fmt: skip
            value = None if tensor is None else nn.Parameter(tensor, requires_grad=False)
            self.register_parameter(name, value)
        self.gates: Tensor
        self.rest: Tensor | None
        self.readout: Tensor | None
        self.readout_rest: Tensor | None

    def input_gates(self, tokens: Tensor, rest: Tensor | None) -> Tensor:
        """The bottom layer's input product of [y_{t-1}; rest], bias included: (N, G*H)."""
        gates = self.gates[tokens]  # (N, G*H)
        if rest is None:
            return gates
        assert self.rest is not None, "this layer reads the embedding alone"
        return gates + rest @ self.rest

    @property
    def nbytes(self) -> int:
        tables = [
            t for t in (self.gates, self.rest, self.readout, self.readout_rest) if t is not None
        ]
        return sum(t.numel() * t.element_size() for t in tables)


class Seq2Seq(nn.Module):
    """Encoder, bridge, attention and a Bahdanau-, Luong- or conditional (cGRU) decoder."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H, D, E, L = cfg.dec_hidden, cfg.enc_out_dim, cfg.emb_dim, cfg.dec_layers
        self.encoder = Encoder(cfg)
        self.bridge = nn.Linear(D, L * H * (2 if cfg.rnn == "lstm" else 1))
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, E, padding_idx=cfg.pad_id)
        self.dropout = nn.Dropout(cfg.dropout)
        self.attention = Attention(cfg) if cfg.attention != "none" else None
        if cfg.input_feeding:  # Luong: input = [y_{t-1}; h~_{t-1}], h~_t = tanh(W_c [c_t; s_t])
            rnn_in = E + H
            self.combine = nn.Linear(D + H, H, bias=False)
            readout_in = H
        elif cfg.conditional:  # cGRU: RNN1 reads y_{t-1}, RNN2 reads c_t; readout as Bahdanau's
            rnn_in = D
            self.rnn1 = make_rnn(cfg.rnn, E, H, 1, 0.0, False)
            self.readout = nn.Linear(H + D + E, H)
            readout_in = H
        else:  # Bahdanau and "none": input = [y_{t-1}; c], readout from [s_t; c; y_{t-1}]
            rnn_in = E + D
            self.readout = nn.Linear(H + D + E, H)
            readout_in = H
        self.rnn = make_rnn(cfg.rnn, rnn_in, H, L, cfg.dropout, False)  # cGRU: RNN2
        self.out = nn.Linear(readout_in, cfg.tgt_vocab_size)
        self.folded: FoldedEmbedding | None = None  # set on the exporter's copy only

    def fold_embeddings(self) -> FoldedEmbedding:
        """The target embedding through the bottom layer that reads it (RNN1 for cGRU) and the
        readout's y_{t-1} columns (Bahdanau, cGRU, no attention: the readout ends with y_{t-1})."""
        rnn = self.rnn1 if self.cfg.conditional and not self.cfg.input_feeding else self.rnn
        readout = self.readout if hasattr(self, "readout") else None
        return FoldedEmbedding(self.tgt_embed.weight, rnn, readout=readout)

    # --- packed decoder state: [h_1 .. h_L, (c_1 .. c_L), (h~)] per row --------------------------

    def unpack_state(self, state: Tensor) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor | None]:
        """state (N, state_dim) → RNN state (L, N, H) [or (h, c)], input feed (N, H) or None."""
        cfg = self.cfg
        N = state.shape[0]
        L, H = cfg.dec_layers, cfg.dec_hidden
        h = state[:, : L * H].reshape(N, L, H).transpose(0, 1).contiguous()  # (L, N, H)
        offset = L * H
        rnn_state: Tensor | tuple[Tensor, Tensor] = h
        if cfg.rnn == "lstm":
            c = state[:, offset : offset + L * H].reshape(N, L, H).transpose(0, 1).contiguous()
            rnn_state = (h, c)
            offset += L * H
        feed = state[:, offset : offset + H] if cfg.input_feeding else None
        return rnn_state, feed

    def pack_state(self, rnn_state: Tensor | tuple[Tensor, Tensor], feed: Tensor | None) -> Tensor:
        parts = list(rnn_state) if isinstance(rnn_state, tuple) else [rnn_state]
        N = parts[0].shape[1]
        flat = [p.transpose(0, 1).reshape(N, -1) for p in parts]  # each (N, L*H)
        if feed is not None:
            flat.append(feed)
        return torch.cat(flat, dim=-1)  # (N, state_dim)

    # --- encoder side, once per sentence -----------------------------------------------------

    def encode(self, src: Tensor, lengths: Tensor) -> Encoded:
        cfg = self.cfg
        B, S = src.shape
        values, summary = self.encoder(src, lengths)  # (B, S, D), (B, D)
        mask = torch.arange(S, device=src.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        init = torch.tanh(self.bridge(summary))  # (B, L*H [*2])
        L, H = cfg.dec_layers, cfg.dec_hidden
        parts = [init[:, : L * H]]
        if cfg.rnn == "lstm":
            parts.append(init[:, L * H :])
        if cfg.input_feeding:
            parts.append(torch.zeros(B, H, dtype=init.dtype, device=init.device))
        state = torch.cat(parts, dim=-1)  # (B, state_dim)
        if self.attention is None:
            keys = summary.unsqueeze(1)  # (B, 1, D): the fixed context
        else:
            keys = self.attention.project_keys(values)
        return Encoded(values=values, keys=keys, mask=mask, state=state)

    # --- one decoder step for N = B*K hypotheses ---------------------------------------------

    def decode_step(
        self, tokens: Tensor, state: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (N,), state (N, state_dim), encoder tensors per sentence (B, S, ·), N = B*K.

        Returns logits (N, V), the new state (N, state_dim) and attention weights (N, S).
        """
        N = tokens.shape[0]
        B, S = mask.shape
        K = N // B
        # y_{t-1}: embedded once (one dropout mask per step), or looked up in the folded tables
        emb = self.dropout(self.tgt_embed(tokens)) if self.folded is None else None  # (N, E)
        rnn_state, feed = self.unpack_state(state)
        if self.attention is None:  # fixed context: the encoder summary at every step
            context = keys.unsqueeze(1).expand(B, K, 1, keys.shape[-1]).reshape(N, -1)  # (N, D)
            s_t, rnn_state = self.rnn_step((tokens, emb), context, rnn_state)
            hidden = self.read_out((tokens, emb), s_t, context)
            weights = (
                torch.zeros_like(values[:, :, 0]).unsqueeze(1).expand(B, K, S).reshape(N, S)
            )  # no alignment
        elif self.cfg.input_feeding:  # Luong: query is the current state s_t
            assert feed is not None  # input feeding keeps h~_{t-1} in the packed state
            s_t, rnn_state = self.rnn_step((tokens, emb), feed, rnn_state)
            context, weights = self.attend(s_t, keys, values, mask)
            hidden = torch.tanh(self.combine(torch.cat([context, s_t], -1)))  # h~_t (N, H)
            feed = hidden
        elif self.cfg.conditional:  # cGRU: query is s'_t, the state after reading y_{t-1}
            s_mid, rnn_state = self.conditional_first_step((tokens, emb), rnn_state)
            context, weights = self.attend(s_mid, keys, values, mask)
            s_t, rnn_state = self.rnn_step(None, context, rnn_state)
            hidden = self.read_out((tokens, emb), s_t, context)
        else:  # Bahdanau: query is the previous state s_{t-1}
            h_prev = rnn_state[0] if isinstance(rnn_state, tuple) else rnn_state
            context, weights = self.attend(h_prev[-1], keys, values, mask)
            s_t, rnn_state = self.rnn_step((tokens, emb), context, rnn_state)
            hidden = self.read_out((tokens, emb), s_t, context)
        logits = self.out(self.dropout(hidden))  # (N, V)
        return logits, self.pack_state(rnn_state, feed), weights

    def read_out(self, y: TokenInput, s_t: Tensor, context: Tensor) -> Tensor:
        """tanh(readout([s_t; c_t; y_{t-1}])) (N, H), y_{t-1}'s part looked up when folded."""
        tokens, emb = y
        if emb is not None:
            return torch.tanh(self.readout(torch.cat([s_t, context, emb], -1)))
        folded = self.folded
        assert folded is not None and folded.readout is not None and folded.readout_rest is not None
        rest = torch.cat([s_t, context], -1) @ folded.readout_rest  # (N, H)
        return torch.tanh(rest + folded.readout[tokens])

    def rnn_step(
        self, y: TokenInput | None, rest: Tensor, rnn_state: Tensor | tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
        """One time step of the stacked decoder RNN on [y_{t-1}; rest] (rest alone when y is
        None), written as cell equations over nn.GRU/nn.LSTM's own parameters: the exported graph
        then holds plain MatMul/Gemm ops, which ONNX Runtime runs about twice as fast as its
        GRU/LSTM op for a single step (measured: 13 ms of a 25 ms step)."""
        h_all, c_all = rnn_state if isinstance(rnn_state, tuple) else (rnn_state, None)  # (L, N, H)
        if y is None:
            x, h_new, c_new = stacked_rnn_step(self.rnn, rest, h_all, c_all, self.training)
        elif y[1] is not None:
            x_in = torch.cat([y[1], rest], -1)
            x, h_new, c_new = stacked_rnn_step(self.rnn, x_in, h_all, c_all, self.training)
        else:
            assert self.folded is not None
            gates = self.folded.input_gates(y[0], rest)
            x, h_new, c_new = stacked_rnn_step(self.rnn, None, h_all, c_all, bottom_gates=gates)
        return x, (h_new, c_new) if c_new is not None else h_new

    def conditional_first_step(
        self, y: TokenInput, rnn_state: Tensor | tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
        """cGRU's first transition s'_t = RNN1(y_{t-1}, s_{t-1}) on the bottom layer: returns s'_t
        (N, H) and the stacked state with the bottom layer replaced by s'_t (and c'_t), so that
        RNN2's bottom layer continues from it and its upper layers from their own s_{t-1}."""
        h_all, c_all = rnn_state if isinstance(rnn_state, tuple) else (rnn_state, None)  # (L, N, H)
        c_first = c_all[:1] if c_all is not None else None
        tokens, emb = y
        if emb is not None:
            s_mid, h1, c1 = stacked_rnn_step(self.rnn1, emb, h_all[:1], c_first, self.training)
        else:
            assert self.folded is not None
            gates = self.folded.input_gates(tokens, None)
            s_mid, h1, c1 = stacked_rnn_step(
                self.rnn1, None, h_all[:1], c_first, bottom_gates=gates
            )
        h_all = torch.cat([h1, h_all[1:]], dim=0)  # (L, N, H)
        if c_all is None or c1 is None:
            return s_mid, h_all
        return s_mid, (h_all, torch.cat([c1, c_all[1:]], dim=0))

    def attend(
        self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """query (N, H) → context (N, D), weights (N, S); hypotheses grouped by sentence."""
        assert self.attention is not None
        N, H = query.shape
        B, S = mask.shape
        context, weights = self.attention(query.reshape(B, N // B, H), keys, values, mask)
        return context.reshape(N, -1), weights.reshape(N, S)

    # --- training: teacher forcing ------------------------------------------------------------

    def forward(self, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), lengths (B,), tgt_in (B, T) starting with BOS → logits (B, T, V)."""
        return self.teacher_forced(src, lengths, tgt_in)[0]

    def teacher_forced(self, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing (training; forced decoding for alignment evaluation): src (B, S),
        lengths (B,), tgt_in (B, T) → logits (B, T, V) and the attention (B, T, S) behind each
        step's prediction: row t is the attention used to predict the target token after tgt_in[t]."""
        enc = self.encode(src, lengths)
        state = enc.state
        logits, rows = [], []
        for t in range(tgt_in.shape[1]):
            step_logits, state, weights = self.decode_step(
                tgt_in[:, t], state, enc.keys, enc.values, enc.mask
            )
            logits.append(step_logits)
            rows.append(weights)
        return torch.stack(logits, dim=1), torch.stack(rows, dim=1)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, lengths: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
        """The one greedy decoding loop (dev-set BLEU, evaluation, heatmaps, reference outputs).

        Returns the tokens emitted (B, T), EOS and whatever follows it included, and the attention
        behind each (B, T, S), zeros for attention "none"; stops once every sentence emitted EOS.
        """
        cfg = self.cfg
        enc = self.encode(src, lengths)
        B = src.shape[0]
        tokens = torch.full((B,), cfg.bos_id, dtype=torch.long, device=src.device)  # (B,)
        state = enc.state  # (B, state_dim)
        out: list[Tensor] = []  # T tensors (B,)
        rows: list[Tensor] = []  # T tensors (B, S)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len):
            logits, state, weights = self.decode_step(tokens, state, enc.keys, enc.values, enc.mask)
            tokens = logits.argmax(-1)  # (B,)
            out.append(tokens)
            rows.append(weights)
            done |= tokens == cfg.eos_id
            if bool(done.all()):
                break
        if not out:
            return src.new_zeros(B, 0), enc.values.new_zeros(B, 0, src.shape[1])
        return torch.stack(out, dim=1), torch.stack(rows, dim=1)  # (B, T), (B, T, S)

    def greedy(self, src: Tensor, lengths: Tensor, max_len: int) -> list[list[int]]:
        """Batched greedy decode; ids without BOS/EOS."""
        tokens, _ = self.greedy_decode(src, lengths, max_len)  # (B, T)
        return [strip_eos(row, self.cfg.eos_id) for row in tokens.tolist()]


def stacked_rnn_step(
    rnn: nn.RNNBase,
    x: Tensor | None,
    h: Tensor,
    c: Tensor | None,
    training: bool = False,
    bottom_gates: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One time step of a stacked GRU/LSTM over nn.GRU/nn.LSTM's own parameters (the equations of
    GRUCell/LSTMCell) as plain matrix products: x (N, I), h and c (L, N, H) → the top layer's output
    (N, H), the new h and c. Dropout between layers only while training, as nn.GRU/nn.LSTM do.

    bottom_gates (N, G*H): the bottom layer's input product, bias included, computed by the caller
    (FoldedEmbedding.input_gates); x is then None."""
    hs, cs = [], []
    out = x
    for layer in range(rnn.num_layers):
        w_ih, w_hh, b_ih, b_hh = (
            getattr(rnn, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        )
        if layer == 0 and bottom_gates is not None:
            gi = bottom_gates
        else:
            assert out is not None  # only the bottom layer may have its whole input folded
            if layer > 0:
                out = nn.functional.dropout(out, rnn.dropout, training)
            gi = nn.functional.linear(out, w_ih, b_ih)  # (N, G*H)
        gh = nn.functional.linear(h[layer], w_hh, b_hh)  # (N, G*H)
        if c is None:
            h_layer = gru_cell(gi, gh, h[layer])
        else:
            h_layer, c_layer = lstm_cell(gi + gh, c[layer])
            cs.append(c_layer)
        hs.append(h_layer)
        out = h_layer
    return hs[-1], torch.stack(hs), (torch.stack(cs) if c is not None else None)  # (L, N, H) each


def gru_cell(gi: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """PyTorch's GRU equations; gi, gh (N, 3H) are the input and hidden projections (r, z, n)."""
    i_r, i_z, i_n = gi.chunk(3, dim=-1)
    h_r, h_z, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """PyTorch's LSTM equations; gates (N, 4H) in the order i, f, g, o."""
    i, f, g, o = gates.chunk(4, dim=-1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_new), c_new


def strip_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
