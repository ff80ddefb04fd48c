"""Marian `s2s` models (model.npz + vocabularies) → bundle, with Marian's own equations.

    s2s-import marian --model model.npz --vocabs src.spm tgt.spm --out DIR

What is rebuilt (marian-dev src/models/s2s.h, rnn/cells.h, rnn/attention.h, layers/generic.h of
1.12), read from the model's own options (`special:model.yml` inside the npz):
- the encoder: source embeddings (`encoder_Wemb`, or `Wemb` when tied), a bidirectional GRU or
  LSTM (`encoder_bi`, `encoder_bi_r`) over the source and its `</s>`, states [forward; backward];
- the decoder's first state tanh(W · mean(encoder states) + b) (`decoder_ff_state`), for h (and c);
- a step of the conditional cell (`--dec-cell-base-depth 2`): cell1 reads y_{t-1} (a zero vector
  at the first step, Marian's start), attention v·tanh(W_c h_j + b + W_comb s') with s', cell2
  reads the context; Marian's GRU adds cell1's candidate bias outside the reset gate and cell2's
  inside it ("final"); its LSTM orders gates f, i, c, o;
- the deep output tanh(W0 y_{t-1} + b0 + W1 s_t + b1 + W2 c_t + b2) (`decoder_ff_logit_l1`), then
  the output layer (`decoder_ff_logit_l2`, or the target embedding when tied), log-softmax over
  Marian's vocabulary, then `<unk>` suppressed as marian-decoder does without `--allow-unk`.
Marian has no PAD and no BOS token: the bundle gives them ids 0 and 1 with zero embeddings (the BOS
row is Marian's zero start) and never emits them. Every other option that changes the computation
is refused with its name and value.

The encoder projects its states once per sentence through every product the context enters (the
attention's W_c h_j + b, cell2's input gates, the deep output's W2), so that a step attends over the
projected rows instead of multiplying each hypothesis's context by them: the same sums in another
order. The contract's `values` carry the attention's mapped states (as wide as the encoder's
states), `keys` the projections of the context side by side.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import yaml
from torch import Tensor, nn

from export.importers import marian_transformer
from export.importers.common import (
    ImportRefused,
    permuted,
    refuse_unless,
    subword_side,
    write_bundle,
)
from export.importers.config_builder import model_config
from export.importers.marian_vocab import Vocabulary, read_vocab, vocab_order, with_rows
from export.importers.options import Option, OptionTable, check
from export.importers.rnn_steps import attend, encode_packed, pack_state, unpack_state
from export.train.model import Encoded, FoldedEmbedding, gru_cell, lstm_cell
from export.transformer.graphs import export_graphs as export_transformer
from service.model.architecture import BOS_ID, PAD_ID, UNK_ID, ModelConfig, Toolkit

# What serving knows the model as (service/model/architecture.py): its beam keeps only the non-EOS
# candidates among the top beam_size, as an imported toolkit's (Marian's narrows by its finished
# hypotheses too), and service/model/subword.py joins its pieces with SentencePiece's DecodePieces,
# as Marian's spm vocabulary does.
TOOLKIT: Toolkit = "marian"
# marian-decoder's rules as the bundle's decoding defaults (service/decode/shared/options.py): its beam
# narrows for good (stopping "narrowing"), at most ceil(3 x the source's tokens with `</s>`) target
# tokens (--max-length-factor 3), no normalization or word penalty (--normalize 0, --word-penalty
# 0), no GNMT length penalty. Requests may override any of them.
DECODING: dict[str, Any] = {
    "stopping": "narrowing",
    "max_length_factor": 3.0,
    "normalize": 0.0,
    "word_penalty": 0.0,
    "length_penalty": 0.0,
}

# Options that change the computation, with the values this importer rebuilds exactly (Marian's
# defaults for s2s first). Each is read from special:model.yml; others are refused by name.
TYPES = ("s2s", "transformer")
SUPPORTED: dict[str, tuple[Any, ...]] = {
    "enc-type": ("bidirectional",),
    "enc-cell": ("gru", "lstm"),
    "dec-cell": ("gru", "lstm"),
    "enc-cell-depth": (1,),
    "enc-depth": (1,),
    "dec-cell-base-depth": (2,),
    "dec-cell-high-depth": (1,),
    "dec-depth": (1,),
    "skip": (False,),
    "layer-normalization": (False,),
    "right-left": (False,),
    "tied-embeddings": (False, True),
    "tied-embeddings-src": (False, True),
    "tied-embeddings-all": (False, True),
    "output-omit-bias": (False, True),
    "factors-dim-emb": (0,),
    "lemma-dim-emb": (0,),
    "ulr": (False,),
    "input-types": ([],),
    "input-reorder": ([],),
}
# Every model's options (the s2s's or the Transformer's follow: marian_transformer.OPTIONS)
SHARED = OptionTable("Marian", "--", (
    Option("type", TYPES),
    Option("original-type", lambda v, o: v in (None, o["type"]), flag="type",
           accepted=f"converted from another type; the importer supports {list(TYPES)}"),
    Option("dim-vocabs", lambda v, o: isinstance(v, list) and len(v) == 2,
           accepted="one source and one target vocabulary"),
))  # fmt: skip
S2S: tuple[Option, ...] = (
    *(Option(name, allowed, allowed[0]) for name, allowed in SUPPORTED.items()),
    Option("dec-cell", default="gru", to="ModelConfig.rnn"),  # the packed state's layout
    Option("dim-rnn", default=0, to="ModelConfig.dec_hidden", convert=int),
)


@dataclass(frozen=True)
class MarianModel:
    """An npz's tensors by name and its options (special:model.yml)."""

    tensors: dict[str, np.ndarray]
    options: dict[str, Any]

    def get(self, name: str) -> Tensor:
        refuse_unless(name in self.tensors, f"the model has no parameter {name}")
        return torch.from_numpy(np.asarray(self.tensors[name], dtype=np.float32).copy())


def read_model(path: Path) -> MarianModel:
    """model.npz → its float parameters and its options; a file that is not one is refused."""
    refuse_unless(path.is_file(), f"model not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ImportRefused(f"{path} is not a Marian model.npz: {err}") from err
    raw = arrays.pop("special:model.yml", None)
    refuse_unless(
        raw is not None,
        f"{path} has no special:model.yml: not a Marian model (or one saved without its options)",
    )
    assert raw is not None
    text = bytes(np.asarray(raw).astype(np.int8).tobytes()).decode("utf-8", "replace")
    try:
        options = yaml.safe_load(io.StringIO(text.rstrip("\x00 \n")))
    except yaml.YAMLError as err:
        raise ImportRefused(f"{path}'s special:model.yml is not YAML: {err}") from err
    refuse_unless(isinstance(options, dict), f"{path}'s special:model.yml is not a mapping")
    return MarianModel(tensors=arrays, options=options)


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Refuse, once, every computation-changing option this importer does not rebuild, naming each
    and its value; else what the s2s's or the Transformer's table maps."""
    kind = marian_transformer.OPTIONS if is_transformer(options) else S2S
    return check(SHARED + kind, options)


# --- the network ---------------------------------------------------------------------------------


class MarianS2S(nn.Module):
    """Marian's s2s (bi-RNN encoder, conditional decoder, MLP attention, deep output) with this
    project's export interface. Cells are nn.GRU/nn.LSTM containers for their parameters (torch's
    gate order), so that the encoder runs packed and the exporter can fold the target embedding."""

    def __init__(
        self, cfg: ModelConfig, enc_cell: str, unk_row: int, unused_rows: tuple[int, ...] = ()
    ) -> None:
        super().__init__()
        self.cfg = cfg
        E, H, D = cfg.emb_dim, cfg.dec_hidden, cfg.enc_out_dim
        enc_cls = nn.GRU if enc_cell == "gru" else nn.LSTM
        dec_cls = nn.GRU if cfg.rnn == "gru" else nn.LSTM
        self.gates = 3 if cfg.rnn == "gru" else 4
        G = self.gates
        self.src_embed = nn.Embedding(cfg.src_vocab_size, E)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, E)
        self.enc_rnn = enc_cls(E, cfg.enc_hidden, batch_first=True, bidirectional=True)
        self.ff_state = nn.Linear(D, H)
        self.cell1 = dec_cls(E, H)
        self.w_comb = nn.Linear(H, D, bias=False)  # the query's projection
        self.w_ctx = nn.Linear(D, D)  # the keys' projection, b_att as its bias
        self.v = nn.Linear(D, 1, bias=False)
        self.cell2 = dec_cls(D, H)  # its input product is projected in encode()
        self.readout = nn.Linear(H + E, E)  # [s_t; y_{t-1}]: W1, W0; bias b0 + b1 + b2
        self.w_readout_ctx = nn.Linear(D, E, bias=False)  # W2, projected in encode()
        self.out = nn.Linear(E, cfg.tgt_vocab_size)
        self.gate_width = G * H
        # (V,) added to the log-probabilities: -inf on <unk> and on the rows past Marian's
        # vocabulary (with_rows), never emitted. A broadcast Add: masked_fill's Where took 14% of
        # a 6,000-word step. (Our PAD and BOS rows, not Marian's, are out of its softmax by an
        # output bias of -inf: build().)
        never = torch.zeros(cfg.tgt_vocab_size)
        never[[unk_row, *unused_rows]] = float("-inf")
        self.register_buffer("never", never, persistent=False)
        self.folded: FoldedEmbedding | None = None  # set on the exporter's copy only

    def fold_embeddings(self) -> FoldedEmbedding:
        """The target embedding through cell1's input gates and the deep output's y_{t-1} part."""
        return FoldedEmbedding(self.tgt_embed.weight, self.cell1, readout=self.readout)

    def encode(self, src: Tensor, lengths: Tensor) -> Encoded:
        S = src.shape[1]
        emb = self.src_embed(src)  # (B, S, E)
        values, _ = encode_packed(self.enc_rnn, emb, lengths)  # (B, S, D) [forward; backward]
        mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        # Marian's weighted_average over the real positions (padding holds zeros after packing)
        mean = values.sum(dim=1) / lengths.unsqueeze(1).to(values.dtype)  # (B, D)
        start = torch.tanh(self.ff_state(mean))  # (B, H)
        h = start.unsqueeze(0)  # (1, B, H)
        c = h if self.cfg.rnn == "lstm" else None
        w_ih2 = cast(Tensor, self.cell2.weight_ih_l0)  # (G*H, D)
        mapped = self.w_ctx(values)  # (B, S, D): the attention's W_c h_j + b
        projected = torch.cat(
            [values @ w_ih2.t(), self.w_readout_ctx(values)], dim=-1
        )  # (B, S, G*H + E): cell2's input gates and the deep output's W2 of each h_j
        # values carry the attention's mapped states (as wide as the encoder's), keys the
        # projections: a step reads each whole, with no slice copied per step
        return Encoded(values=mapped, keys=projected, mask=mask, state=pack_state(h, c, None))

    def decode_step(
        self, tokens: Tensor, state: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (N,), state (N, state_dim), encoder tensors (B, S, ·) → logits (N, V), the new
        state and the attention (N, S)."""
        cfg = self.cfg
        N = tokens.shape[0]
        B = mask.shape[0]
        K = N // B
        D, GH = cfg.enc_out_dim, self.gate_width
        h, c, _ = unpack_state(state, 1, cfg.dec_hidden, cfg.rnn == "lstm", False)  # (1, N, H)
        # cell1 on y_{t-1}: its input gates looked up when folded
        if self.folded is not None:
            gi1 = self.folded.input_gates(tokens, None)  # (N, G*H)
            emb = None
        else:
            emb = self.tgt_embed(tokens)  # (N, E)
            w_ih1, b_ih1 = (
                cast(Tensor, self.cell1.weight_ih_l0),
                cast(Tensor, self.cell1.bias_ih_l0),
            )
            gi1 = nn.functional.linear(emb, w_ih1, b_ih1)  # (N, G*H)
        s_mid, c_mid = self.cell(self.cell1, gi1, h[0], None if c is None else c[0])  # (N, H)
        # attention with s': v·tanh(W_c h_j + b + W_comb s'), over each sentence's K queries
        query = self.w_comb(s_mid).reshape(B, K, D)  # (B, K, D)
        energy = torch.tanh(query.unsqueeze(2) + values.unsqueeze(1))  # (B, K, S, D)
        scores = self.v(energy).squeeze(-1)  # (B, K, S)
        projected, weights = attend(scores, keys, mask)  # (B, K, G*H + E), (B, K, S)
        projected = projected.reshape(N, -1)  # (N, G*H + E)
        # cell2 on the context c_t (its input product is Σ α (W h_j))
        gi2 = projected[:, :GH] + cast(Tensor, self.cell2.bias_ih_l0)  # (N, G*H)
        s_t, c_t = self.cell(self.cell2, gi2, s_mid, c_mid)  # (N, H)
        # deep output: tanh(W0 y + W1 s_t + W2 c_t + b0 + b1 + b2), then the output layer
        if emb is not None:
            pre = self.readout(torch.cat([s_t, emb], dim=-1))
        else:
            folded = self.folded
            assert folded is not None and folded.readout is not None
            assert folded.readout_rest is not None
            pre = s_t @ folded.readout_rest + folded.readout[tokens]
        hidden = torch.tanh(pre + projected[:, GH:])  # (N, E)
        logits = self.out(hidden)  # (N, V)
        new_state = pack_state(
            s_t.unsqueeze(0), None if c_t is None else c_t.unsqueeze(0), None
        )  # (N, state_dim)
        return logits, new_state, weights.reshape(N, -1)

    @staticmethod
    def cell(
        rnn: nn.RNNBase, gi: Tensor, h: Tensor, c: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """One GRU/LSTM transition given its input product gi (N, G*H), bias included."""
        w_hh, b_hh = cast(Tensor, rnn.weight_hh_l0), cast(Tensor, rnn.bias_hh_l0)
        gh = nn.functional.linear(h, w_hh, b_hh)  # (N, G*H)
        if c is None:
            return gru_cell(gi, gh, h), None
        return lstm_cell(gi + gh, c)

    def step_log_probs(self, logits: Tensor, tokens: Tensor) -> Tensor:
        """marian-decoder's scores: log-softmax over Marian's output rows (our PAD and BOS rows
        are not among them), then `<unk>` suppressed (its default, without --allow-unk) and the
        rows past its vocabulary, which hold no word."""
        log_probs = torch.log_softmax(logits, dim=-1)  # (N, V); PAD and BOS at -inf already
        return log_probs + cast(Tensor, self.never)


# --- Marian's parameters → the module's --------------------------------------------------------


def gru_weights(model: MarianModel, prefix: str, final: bool) -> dict[str, Tensor]:
    """Marian's GRU (W, Wx, U, Ux, b, bx; gates r, z then the candidate) in torch's layout. The
    candidate's bias is outside the reset gate (torch's b_in) or, for a "final" cell, inside it
    (torch's b_hn)."""
    W = torch.cat([model.get(f"{prefix}_W"), model.get(f"{prefix}_Wx")], dim=1)  # (I, 3H)
    U = torch.cat([model.get(f"{prefix}_U"), model.get(f"{prefix}_Ux")], dim=1)  # (H, 3H)
    b, bx = model.get(f"{prefix}_b").reshape(-1), model.get(f"{prefix}_bx").reshape(-1)
    zeros = torch.zeros_like(bx)
    b_ih = torch.cat([b, zeros if final else bx])
    b_hh = torch.cat([torch.zeros_like(b), bx if final else zeros])
    return {"weight_ih": W.t(), "weight_hh": U.t(), "bias_ih": b_ih, "bias_hh": b_hh}


def lstm_weights(model: MarianModel, prefix: str, final: bool) -> dict[str, Tensor]:
    """Marian's FastLSTM (W, U, b; gates f, i, c, o) in torch's order i, f, g, o."""
    del final  # the LSTM has no reset gate: "final" changes nothing

    def reorder(t: Tensor) -> Tensor:
        f, i, g, o = t.chunk(4, dim=-1)
        return torch.cat([i, f, g, o], dim=-1)

    W, U = reorder(model.get(f"{prefix}_W")), reorder(model.get(f"{prefix}_U"))
    b = reorder(model.get(f"{prefix}_b").reshape(-1))
    return {"weight_ih": W.t(), "weight_hh": U.t(), "bias_ih": b, "bias_hh": torch.zeros_like(b)}


def cell_weights(
    model: MarianModel, prefix: str, kind: str, final: bool, suffix: str = "_l0"
) -> dict[str, Tensor]:
    pick = gru_weights if kind == "gru" else lstm_weights
    return {name + suffix: value for name, value in pick(model, prefix, final).items()}


def embedding_names(options: dict[str, Any]) -> tuple[str, str, str | None]:
    """The source and target embeddings' names, and the tied output layer's (None: its own Wt)."""
    tied_src = bool(options.get("tied-embeddings-src")) or bool(options.get("tied-embeddings-all"))
    src = "Wemb" if tied_src else "encoder_Wemb"
    tgt = "Wemb" if tied_src else "decoder_Wemb"
    tied_out = bool(options.get("tied-embeddings")) or bool(options.get("tied-embeddings-all"))
    return src, tgt, (tgt if tied_out else None)


def is_transformer(options: dict[str, Any]) -> bool:
    return options.get("type") == "transformer"


def output_prefix(options: dict[str, Any]) -> str:
    """The output layer's parameters' prefix: the s2s deep output's second layer, or the
    Transformer's output."""
    return "decoder_ff_logit_out" if is_transformer(options) else "decoder_ff_logit_l2"


def output_weight(model: MarianModel, tied: str | None, prefix: str) -> Tensor:
    """(V, E): the tied embedding, `<prefix>_Wt`, or an untransposed `<prefix>_W`."""
    if tied is not None:
        return model.get(tied)
    if f"{prefix}_Wt" in model.tensors:
        return model.get(f"{prefix}_Wt")
    return model.get(f"{prefix}_W").t()


def with_extra_rows(weight: Tensor) -> Tensor:
    """(V, ·) → (V + 2, ·): zero rows for our PAD and BOS (Marian's start embedding is zero)."""
    return torch.cat([weight, weight.new_zeros(2, *weight.shape[1:])])


def without_ours(bias: Tensor) -> Tensor:
    """The output bias with -inf on our PAD and BOS rows: Marian has no such tokens, so they are
    out of its log-softmax (exp(-inf) = 0) and never emitted, with no mask in the step."""
    bias = bias.clone()
    bias[[PAD_ID, BOS_ID]] = float("-inf")
    return bias


@dataclass(frozen=True)
class Sides:
    """The embeddings and output layer in our id order, under the graphs' names
    (`src_embed.weight`, `tgt_embed.weight`, `out.bias`, and `out.weight` unless tied to the
    target embedding), each side's tokens and our ids' rows, and our ids of the target rows past
    Marian's vocabulary (with_rows)."""

    tensors: dict[str, Tensor]
    source: tuple[list[str], list[int]]
    target: tuple[list[str], list[int]]
    unused: tuple[int, ...]


def sides(model: MarianModel, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> Sides:
    """What every Marian model type shares: embeddings, output layer, vocabularies."""
    options = model.options
    src_name, tgt_name, tied_out = embedding_names(options)
    src_emb, tgt_emb = model.get(src_name), model.get(tgt_name)
    prefix = output_prefix(options)
    out_w = output_weight(model, tied_out, prefix)
    refuse_unless(
        tgt_emb.shape[0] == out_w.shape[0],
        f"{tgt_name} has {tgt_emb.shape[0]} rows but the output layer {out_w.shape[0]}",
    )
    words = len(tgt_vocab.tokens)
    src_vocab = with_rows(src_vocab, src_emb.shape[0], src_name, "source")
    tgt_vocab = with_rows(tgt_vocab, tgt_emb.shape[0], tgt_name, "target")
    src_tokens, src_order = vocab_order(src_vocab, "source")
    tgt_tokens, tgt_order = vocab_order(tgt_vocab, "target")
    unused = tuple(ours for ours, row in enumerate(tgt_order) if words <= row < tgt_emb.shape[0])
    b_out = (
        model.get(f"{prefix}_b").reshape(-1)
        if f"{prefix}_b" in model.tensors
        else torch.zeros(out_w.shape[0])
    )
    tensors: dict[str, Tensor] = {
        "src_embed.weight": permuted(with_extra_rows(src_emb), src_order),
        "tgt_embed.weight": permuted(with_extra_rows(tgt_emb), tgt_order),
        "out.bias": without_ours(permuted(with_extra_rows(b_out), tgt_order)),
    }
    if tied_out != tgt_name:
        tensors["out.weight"] = permuted(with_extra_rows(out_w), tgt_order)
    return Sides(tensors, (src_tokens, src_order), (tgt_tokens, tgt_order), unused)


def build(
    model: MarianModel, src_vocab: Vocabulary, tgt_vocab: Vocabulary
) -> tuple[nn.Module, Sides]:
    """The network of the model's type with its weights, and its vocabularies' sides."""
    options = model.options
    mapped = check_options(options)
    parts = sides(model, src_vocab, tgt_vocab)
    if is_transformer(options):
        banned = (UNK_ID, *parts.unused)
        net = marian_transformer.build(
            model.get, model.tensors.keys(), options, parts.tensors, banned, TOOLKIT, mapped
        )
        return net, parts
    return build_s2s(model, parts, mapped), parts


def build_s2s(model: MarianModel, parts: Sides, mapped: dict[str, Any]) -> MarianS2S:
    options = model.options
    src_emb = parts.tensors["src_embed.weight"]
    E, H = int(options.get("dim-emb", src_emb.shape[1])), mapped["ModelConfig.dec_hidden"]
    refuse_unless(
        src_emb.shape[1] == E and parts.tensors["tgt_embed.weight"].shape[1] == E,
        f"--dim-emb {E} does not match the embeddings' {src_emb.shape[1]} columns",
    )
    enc_cell, dec_cell = str(options.get("enc-cell", "gru")), str(mapped["ModelConfig.rnn"])
    sizes = (len(parts.source[0]), len(parts.target[0]))
    cfg = model_config(TOOLKIT, sizes, mapped, emb_dim=E, enc_hidden=H, attention="additive",
                       decoder_style="cgru",  # the conditional decoder (dec-cell-base-depth 2)
                       attn_dim=2 * H, bidirectional=True, bridge="marian_mean_tanh",
                       input_feed=False)  # fmt: skip
    net = MarianS2S(cfg, enc_cell, unk_row=UNK_ID, unused_rows=parts.unused)
    readout_bias = sum(model.get(f"decoder_ff_logit_l1_b{i}").reshape(-1) for i in range(3))
    tensors: dict[str, Tensor] = {
        "out.weight": parts.tensors["tgt_embed.weight"],  # where tied; else Sides gives its own
        **parts.tensors,
        "ff_state.weight": model.get("decoder_ff_state_W").t(),
        "ff_state.bias": model.get("decoder_ff_state_b").reshape(-1),
        "w_comb.weight": model.get("decoder_W_comb_att").t(),
        "w_ctx.weight": model.get("decoder_Wc_att").t(),
        "w_ctx.bias": model.get("decoder_b_att").reshape(-1),
        "v.weight": model.get("decoder_U_att").t(),
        "readout.weight": torch.cat(
            [model.get("decoder_ff_logit_l1_W1"), model.get("decoder_ff_logit_l1_W0")]
        ).t(),
        "readout.bias": torch.as_tensor(readout_bias),
        "w_readout_ctx.weight": model.get("decoder_ff_logit_l1_W2").t(),
    }
    for name, value in cell_weights(model, "encoder_bi", enc_cell, False).items():
        tensors[f"enc_rnn.{name}"] = value
    for name, value in cell_weights(model, "encoder_bi_r", enc_cell, False, "_l0_reverse").items():
        tensors[f"enc_rnn.{name}"] = value
    for name, value in cell_weights(model, "decoder_cell1", dec_cell, False).items():
        tensors[f"cell1.{name}"] = value
    for name, value in cell_weights(model, "decoder_cell2", dec_cell, True).items():
        tensors[f"cell2.{name}"] = value
    load_exact(net, tensors)
    net.eval()
    return net


def load_exact(module: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Every parameter from tensors, shapes equal: a mismatch names the parameter (and so the option
    whose size disagrees with the weights)."""
    own = dict(module.named_parameters())
    missing = sorted(set(own) - set(tensors))
    refuse_unless(not missing, f"no weights for {missing[:4]}")
    for name, param in own.items():
        value = tensors[name]
        refuse_unless(
            tuple(value.shape) == tuple(param.shape),
            f"the model's options do not match its weights: {name} is {tuple(value.shape)} in "
            f"the model but {tuple(param.shape)} by --dim-emb/--dim-rnn/--dim-vocabs",
        )
        with torch.no_grad():
            param.copy_(value.float())


def tokenizer_section(
    src: Vocabulary, tgt: Vocabulary, segmenters: tuple[Path, Path] | None = None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's tokenizer: Marian's SentencePiece models (encode to pieces, DecodePieces);
    its .yml vocabularies over the pieces of two SentencePiece `segmenters` (OPUS-MT's layout:
    the text is segmented before Marian reads it; a piece the vocabulary lacks is `<unk>`); or its
    word vocabularies (whitespace split). `</s>` appended to every source, as Marian does."""
    refuse_unless(
        src.is_spm == tgt.is_spm,
        f"the importer needs both vocabularies .spm or both .yml, got {src.path} and {tgt.path}",
    )
    refuse_unless(
        segmenters is None or not src.is_spm,
        "segmenters are for .yml vocabularies: a .spm vocabulary segments the text itself",
    )
    if segmenters is not None:
        section: dict[str, Any] = {"kind": "subword", "toolkit": TOOLKIT}
        files: dict[str, bytes] = {}
        for path, ours in zip(segmenters, ("source", "target"), strict=True):
            section[ours], content = subword_side(
                "sentencepiece", path, ours, append_eos=ours == "source"
            )
            files.update(content)
        return section, files
    if not src.is_spm:
        word = {
            "kind": "word",
            "toolkit": TOOLKIT,
            "source": {"file": "source.vocab", "lowercase": False, "append_eos": True},
            "target": {"file": "target.vocab", "lowercase": False},
        }
        return word, {}
    section = {"kind": "subword", "toolkit": TOOLKIT}
    files = {}
    for vocab, ours in ((src, "source"), (tgt, "target")):
        section[ours], content = subword_side(
            "sentencepiece", vocab.path, ours, append_eos=ours == "source"
        )
        files.update(content)
    return section, files


def import_model(
    model_path: Path,
    vocabs: tuple[Path, Path],
    out: Path,
    name: str,
    version: str,
    int8: bool = False,
    segmenters: tuple[Path, Path] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """A Marian model.npz and its two vocabularies → a bundle at `out` (nothing written if refused).
    `segmenters`: SentencePiece models that segment the text for .yml vocabularies of pieces;
    `decoding`: marian-decoder options (read_decoder_config) over its defaults (DECODING)."""
    model = read_model(model_path)
    check_options(model.options)
    src_vocab, tgt_vocab = read_vocab(vocabs[0], "source"), read_vocab(vocabs[1], "target")
    tokenizer, files = tokenizer_section(src_vocab, tgt_vocab, segmenters)
    net, parts = build(model, src_vocab, tgt_vocab)
    info: dict[str, Any] = {
        "imported_from": "marian",
        "model": model_path.name,
        "marian_type": str(model.options.get("type")),
        "marian_version": str(model.options.get("version", "")).strip(),
    }
    if segmenters is not None:
        info["segmenters"] = [p.name for p in segmenters]
    if is_transformer(model.options):
        info["alignment"] = "layer --transformer-guided-alignment-layer, head 0"
    else:
        info["decoder"] = "cgru (dec-cell-base-depth 2)"
        info["cells"] = {"encoder": model.options.get("enc-cell"),
                         "decoder": model.options.get("dec-cell")}  # fmt: skip
    return write_bundle(
        net,
        cast(ModelConfig, net.cfg),
        {"source": parts.source, "target": parts.target},
        tokenizer,
        out,
        name,
        version,
        int8,
        info,
        files,
        decoding={**DECODING, **(decoding or {})},
        **({"export": export_transformer} if is_transformer(model.options) else {}),
    )


# --- decoder.yml --------------------------------------------------------------------------------

# marian-decoder's options that set the bundle's decoding defaults (its name → ours)
DECODER_OPTIONS = {
    "beam-size": "beam_size",
    "normalize": "normalize",
    "word-penalty": "word_penalty",
    "max-length-factor": "max_length_factor",
}
# options that change what marian-decoder returns and that the bundle does not carry
DECODER_REFUSED = {"allow-unk": False, "shortlist": None, "output-approx-knn": None,
                   "right-left": False, "skip-cost": False}  # fmt: skip


@dataclass(frozen=True)
class DecoderConfig:
    """What a decoder.yml (`marian-decoder -c`) names: the model, its two vocabularies, the
    decoding options, and for .yml vocabularies the SentencePiece segmenters beside it (OPUS-MT's
    releases ship source.spm and target.spm: the text is segmented before Marian reads it)."""

    model: Path
    vocabs: tuple[Path, Path]
    decoding: dict[str, Any]
    segmenters: tuple[Path, Path] | None


def read_decoder_config(path: Path) -> DecoderConfig:
    """decoder.yml → its model, vocabularies, decoding options and segmenters; paths relative to
    its folder (OPUS-MT's `relative-paths: true`) where they are not found as given."""
    refuse_unless(path.is_file(), f"the decoder config is not found: {path}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ImportRefused(f"{path} is not YAML: {err}") from err
    refuse_unless(isinstance(config, dict), f"{path} is not a marian-decoder config (a mapping)")
    models, vocabs = config.get("models") or [], config.get("vocabs") or []
    refuse_unless(
        isinstance(models, list) and len(models) == 1,
        f"{path}: models {models!r}: the importer reads one model (an ensemble is not supported)",
    )
    refuse_unless(
        isinstance(vocabs, list) and len(vocabs) == 2,
        f"{path}: vocabs {vocabs!r}: one source and one target vocabulary",
    )
    for name, default in DECODER_REFUSED.items():
        value = config.get(name, default)
        refuse_unless(
            value in (default, [], ""),
            f"{path}: {name} {value!r} changes marian-decoder's output and is not supported",
        )

    def located(value: str) -> Path:
        given = Path(str(value))
        beside = path.parent / given
        return beside if not given.is_absolute() and beside.exists() else given

    decoding = {
        ours: config[theirs] for theirs, ours in DECODER_OPTIONS.items() if theirs in config
    }
    vocab_paths = (located(vocabs[0]), located(vocabs[1]))
    segmenters = None
    beside = (path.parent / "source.spm", path.parent / "target.spm")
    if vocab_paths[0].suffix != ".spm" and all(p.is_file() for p in beside):
        segmenters = beside
    return DecoderConfig(located(models[0]), vocab_paths, decoding, segmenters)
