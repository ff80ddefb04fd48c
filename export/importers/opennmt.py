"""OpenNMT-py 3.x RNN checkpoints → bundle, with OpenNMT-py's own equations.

    s2s-import opennmt-py --checkpoint model_step_N.pt --out DIR [--name N --version V --int8]

What is rebuilt (onmt/encoders/rnn_encoder.py, onmt/decoders/decoder.py, onmt/modules/
global_attention.py and stacked_rnn.py of 3.5.1):
- encoder `rnn` or `brnn` (hidden_size split over the two directions), GRU or LSTM, packed;
- the optional bridge: per state, Linear + ReLU over each direction's layers (its exact reshape);
- the decoder's first state: the encoder's final state, directions concatenated per layer;
- InputFeedRNNDecoder (input_feed 1: [y; h~_{t-1}] into the stacked cells) or StdRNNDecoder
  (input_feed 0: y alone); attention on the new top state s_t:
  dot s·h, general (W s)·h, mlp v·tanh(W_q s + b + U h); h~ = linear_out([c; s]), tanh for dot and
  general (not mlp); the generator is a Linear on h~, log-softmax at translation time;
- the `sentencepiece` or `bpe` transform: its model file goes into the bundle, which then cuts the
  client's text as the transform does (service/model/subword.py).
Transformer checkpoints (`-encoder_type transformer`) go to export/importers/opennmt_transformer.py.
Everything else (copy attention, coverage, context gates, features, ...) is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from export.importers import opennmt_transformer
from export.importers.common import (
    check_rows,
    load_torch_file,
    load_weights,
    permuted,
    refuse_unless,
    special_order,
    subword_side,
    write_bundle,
)
from export.importers.config_builder import model_config
from export.importers.options import Option, OptionTable, check
from export.importers.rnn_steps import (
    attend,
    encode_packed,
    gru_or_lstm,
    pack_state,
    token_rnn_step,
    unpack_rows,
)
from export.onnx.to_onnx import export_graphs
from export.train.model import Encoded, FoldedEmbedding
from export.transformer import graphs as transformer_graphs
from service.model.architecture import ModelConfig

PAD, BOS, EOS, UNK = "<blank>", "<s>", "</s>", "<unk>"  # onmt.constants.DefaultTokens
# -transforms: the subword ones the bundle reproduces at serving time, and those that act only on
# training data (filters), which serving can ignore.
SUBWORD_TRANSFORMS = {"sentencepiece": "sentencepiece", "bpe": "bpe"}
TRAINING_ONLY_TRANSFORMS = ("filtertoolong",)
ALLOWED_TRANSFORMS = [*SUBWORD_TRANSFORMS, *TRAINING_ONLY_TRANSFORMS]
ATTENTIONS = {"dot": "dot", "general": "general", "mlp": "additive"}


class OnmtRnn(nn.Module):
    """OpenNMT-py's RNN encoder-decoder with this project's export interface."""

    def __init__(self, cfg: ModelConfig, onmt_attention: str, tgt_emb_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.onmt_attention = onmt_attention
        H, L = cfg.dec_hidden, cfg.dec_layers
        rnn_cls = nn.GRU if cfg.rnn == "gru" else nn.LSTM
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.emb_dim)
        self.enc_rnn = rnn_cls(
            cfg.emb_dim,
            cfg.enc_hidden,
            cfg.enc_layers,
            batch_first=True,
            bidirectional=cfg.bidirectional,
        )
        self.bridge = nn.ModuleList()
        if cfg.bridge == "onmt":
            size = cfg.enc_hidden * cfg.enc_layers
            self.bridge.extend(nn.Linear(size, size) for _ in range(2 if cfg.rnn == "lstm" else 1))
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, tgt_emb_dim)
        self.dec_rnn = rnn_cls(tgt_emb_dim + (H if cfg.input_feeding else 0), H, L)
        if onmt_attention == "general":
            self.linear_in = nn.Linear(H, H, bias=False)
        elif onmt_attention == "mlp":
            self.linear_query = nn.Linear(H, H, bias=True)
            self.linear_context = nn.Linear(H, H, bias=False)
            self.v = nn.Linear(H, 1, bias=False)
        self.linear_out = nn.Linear(2 * H, H, bias=onmt_attention == "mlp")
        self.generator = nn.Linear(H, cfg.tgt_vocab_size)
        self.folded: FoldedEmbedding | None = None  # set on the exporter's copy only

    def fold_embeddings(self) -> FoldedEmbedding:
        """The target embedding through the decoder's bottom layer (export/onnx/to_onnx.py)."""
        return FoldedEmbedding(self.tgt_embed.weight, self.dec_rnn)

    def _bridge(self, state: Tensor, linear: nn.Linear) -> Tensor:
        """RNNEncoder._bridge: state (L*D, B, Hd) → (L*D, B, Hd), rows regrouped as OpenNMT does."""
        B = state.shape[1]
        flat = state.permute(1, 0, 2).reshape(-1, linear.in_features)  # (B*D, L*Hd)
        out = torch.relu(linear(flat)).reshape(B, state.shape[0], state.shape[2])
        return out.permute(1, 0, 2)

    def _fix(self, state: Tensor) -> Tensor:
        """RNNDecoderBase.init_state: (L*D, B, Hd) → (L, B, D*Hd), directions side by side."""
        if self.cfg.bidirectional:
            return torch.cat([state[0::2], state[1::2]], dim=2)
        return state

    def encode(self, src: Tensor, lengths: Tensor) -> Encoded:
        B, S = src.shape
        values, final = encode_packed(self.enc_rnn, self.src_embed(src), lengths)  # (B, S, H)
        finals = list(final) if isinstance(final, tuple) else [final]
        if len(self.bridge):
            linears = [cast(nn.Linear, lin) for lin in self.bridge]
            finals = [self._bridge(f, lin) for f, lin in zip(finals, linears, strict=True)]
        h = self._fix(finals[0])  # (L, B, H)
        c = self._fix(finals[1]) if len(finals) > 1 else None
        feed = (
            torch.zeros(B, self.cfg.dec_hidden, dtype=values.dtype)
            if self.cfg.input_feeding
            else None
        )
        mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        return Encoded(
            values=self.project_values(values),
            keys=self.project_keys(values),
            mask=mask,
            state=pack_state(h, c, feed),
        )

    def project_keys(self, values: Tensor) -> Tensor:
        """Once per sentence, the source side of the score: U h (mlp), W^T h (general: s·(W^T h)
        = (W s)·h, so the per-step W s is not needed), h (dot). values (B, S, H) → (B, S, H)."""
        if self.onmt_attention == "mlp":
            return self.linear_context(values)
        if self.onmt_attention == "general":
            return values @ self.linear_in.weight
        return values

    def project_values(self, values: Tensor) -> Tensor:
        """Once per sentence, the context's part of linear_out: W_c h (B, S, H). The context is
        only ever used through linear_out([c; s]) = W_c (Σ a h) + W_s s + b = Σ a (W_c h) + W_s s + b,
        so each step attends over W_c h and skips an H x H product per hypothesis."""
        H = self.cfg.dec_hidden
        return values @ self.linear_out.weight[:, :H].t()

    def decode_step(
        self, tokens: Tensor, state: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (N,), state (N, state_dim), encoder tensors (B, S, ·) → logits (N, V), state, attention (N, S)."""
        cfg = self.cfg
        N = tokens.shape[0]
        B, S = mask.shape
        K = N // B
        h, c, feed = unpack_rows(cfg, state)
        s_t, h, c = token_rnn_step(self.dec_rnn, self.tgt_embed, self.folded, tokens, feed, h, c)
        query = s_t.reshape(B, K, -1)  # (B, K, H)
        if self.onmt_attention == "mlp":
            energy = torch.tanh(
                self.linear_query(query).unsqueeze(2) + keys.unsqueeze(1)
            )  # (B, K, S, H)
            scores = self.v(energy).squeeze(-1)  # (B, K, S)
        else:
            scores = query @ keys.transpose(1, 2)  # (B, K, S)
        projected, weights = attend(scores, values, mask)  # (B, K, H) = W_c c, (B, K, S)
        H = cfg.dec_hidden
        out = projected + nn.functional.linear(
            query, self.linear_out.weight[:, H:], self.linear_out.bias
        )  # linear_out([c; s]) (B, K, H)
        out = out.reshape(N, -1)  # (N, H)
        if self.onmt_attention in ("general", "dot"):
            out = torch.tanh(out)
        logits = self.generator(out)
        new_state = pack_state(h, c, out if cfg.input_feeding else None)
        return logits, new_state, weights.reshape(N, S)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """An OpenNMT-py 3.x checkpoint: model and generator weights, vocabularies, options."""
    ckpt = load_torch_file(path, "OpenNMT-py")
    keys = ("model", "generator", "vocab", "opt")
    refuse_unless(
        isinstance(ckpt, dict) and all(k in ckpt for k in keys),
        f"{path} is not an OpenNMT-py 3.x checkpoint (expected the keys {list(keys)})",
    )
    return ckpt


def _opt(opt: Any, name: str, default: Any = None) -> Any:
    return getattr(opt, name, default)


def _subword(transforms: list[str] | None) -> list[str]:
    """The subword transforms among a checkpoint's -transforms."""
    return [t for t in transforms or [] if t in SUBWORD_TRANSFORMS]


# The options every OpenNMT-py checkpoint is checked for: the task and the transforms
SHARED: tuple[Option, ...] = (
    Option("model_task", ("seq2seq",), "seq2seq"),
    Option("transforms", lambda v, o: all(t in ALLOWED_TRANSFORMS for t in v or []), [],
           f"the importer supports {ALLOWED_TRANSFORMS}"),
    Option("transforms", lambda v, o: len(_subword(v)) <= 1, [],
           "two subword transforms: the importer imports one"),
    *(Option(f"{side}_vocab_threshold", lambda v, o: not _subword(o["transforms"]) or (v or 0) <= 0, 0,
             "subword vocabulary restriction is not imported (retrain without it, or set it to 0)")
      for side in ("src", "tgt")),
)  # fmt: skip
# An RNN's options (a Transformer's: opennmt_transformer.OPTIONS)
RNN: tuple[Option, ...] = (
    Option("model_type", ("text",), "text"),
    Option("encoder_type", ("rnn", "brnn"), "rnn",
           to="ModelConfig.bidirectional", convert=lambda kind: kind == "brnn"),
    Option("decoder_type", ("rnn",), "rnn"),
    Option("rnn_type", ("LSTM", "GRU", "lstm", "gru"), "LSTM", to="ModelConfig.rnn",
           convert=gru_or_lstm),
    Option("global_attention", tuple(ATTENTIONS), "general", to="ModelConfig.attention",
           convert=ATTENTIONS),
    Option("global_attention_function", ("softmax",), "softmax"),
    Option("generator_function", ("softmax",), "softmax"),
    Option("copy_attn", (False,), False),
    Option("coverage_attn", (False,), False),
    Option("context_gate", (None,), None),
    Option("position_encoding", (False,), False),
    Option("input_feed", (0, 1, True, False), 1, to="ModelConfig.input_feed", convert=bool),
    Option("enc_layers", to="ModelConfig.enc_layers", convert=int),
    Option("dec_layers", lambda v, o: v == o["enc_layers"], None,
           lambda o: f"equal to -enc_layers {o['enc_layers']}: the decoder starts from the "
           "encoder's state, layer by layer", to="ModelConfig.dec_layers", convert=int),
    Option("enc_hid_size"),
    Option("dec_hid_size", lambda v, o: v == o["enc_hid_size"], None,
           lambda o: f"equal to -enc_hid_size {o['enc_hid_size']}", to="ModelConfig.dec_hidden",
           convert=int),
    Option("dec_hid_size", lambda v, o: o["encoder_type"] != "brnn" or int(v) % 2 == 0, None,
           "even: a brnn encoder splits -hidden_size over its two directions"),
    Option("bridge", default=False, to="ModelConfig.bridge",
           convert=lambda bridge: "onmt" if bridge else "final_state"),
)  # fmt: skip


def check_options(opt: Any) -> dict[str, Any]:
    """Refuse, once, every option this importer does not rebuild, naming each and its value; else
    what the RNN's or the Transformer's table maps."""
    transformer = _opt(opt, "encoder_type") == "transformer"
    options = SHARED + (opennmt_transformer.OPTIONS if transformer else RNN)
    return check(OptionTable("OpenNMT-py", "-", options), opt)


def vocab_facts(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's tokens and the toolkit's row of each of our ids, both sides."""
    vocab = ckpt["vocab"]
    refuse_unless(
        isinstance(vocab, dict)
        and isinstance(vocab.get("src"), list)
        and isinstance(vocab.get("tgt"), list),
        "the checkpoint's vocab is not an OpenNMT-py 3.x vocabulary (lists under 'src' and 'tgt')",
    )
    start = vocab.get("decoder_start_token", BOS)
    src_tokens, tgt_tokens = list(vocab["src"]), list(vocab["tgt"])
    return {
        "src_tokens": src_tokens,
        "tgt_tokens": tgt_tokens,
        "src_order": special_order(src_tokens, PAD, BOS, EOS, UNK, "source"),
        "tgt_order": special_order(tgt_tokens, PAD, start, EOS, UNK, "target"),
    }


def checkpoint_weights(ckpt: dict[str, Any]) -> dict[str, Tensor]:
    """The model's and the generator's tensors by name (the generator's under `generator.`)."""
    return {**ckpt["model"], **{f"generator.{k}": v for k, v in ckpt["generator"].items()}}


def build(ckpt: dict[str, Any]) -> tuple[OnmtRnn, dict[str, Any]]:
    """The model with the checkpoint's weights (vocabulary rows permuted), and the import facts."""
    opt = ckpt["opt"]
    mapped = check_options(opt)
    facts = vocab_facts(ckpt)
    src_tokens, tgt_tokens = facts["src_tokens"], facts["tgt_tokens"]
    src_order, tgt_order = facts["src_order"], facts["tgt_order"]
    weights = checkpoint_weights(ckpt)
    src_emb = weights.get("encoder.embeddings.make_embedding.emb_luts.0.weight")
    tgt_emb = weights.get("decoder.embeddings.make_embedding.emb_luts.0.weight")
    refuse_unless(
        src_emb is not None and tgt_emb is not None, "the checkpoint has no word embeddings"
    )
    assert src_emb is not None and tgt_emb is not None
    check_rows("the source embedding", src_emb, len(src_tokens), "source")
    check_rows("the target embedding", tgt_emb, len(tgt_tokens), "target")
    gen_w = weights.get("generator.weight", tgt_emb)
    check_rows("the generator", gen_w, len(tgt_tokens), "target")
    H = mapped["ModelConfig.dec_hidden"]
    enc_hidden = H // 2 if mapped["ModelConfig.bidirectional"] else H
    cfg = model_config("opennmt-py", (len(src_tokens), len(tgt_tokens)), mapped,
                       emb_dim=int(src_emb.shape[1]), enc_hidden=enc_hidden, attn_dim=H,
                       decoder_style="luong")  # fmt: skip
    attn = str(_opt(opt, "global_attention", "general"))
    model = OnmtRnn(cfg, attn, tgt_emb_dim=int(tgt_emb.shape[1]))
    tensors: dict[str, Tensor] = {
        "src_embed.weight": permuted(src_emb, src_order),
        "tgt_embed.weight": permuted(tgt_emb, tgt_order),
        "generator.weight": permuted(gen_w, tgt_order),
        "generator.bias": permuted(
            weights.get("generator.bias", torch.zeros(len(tgt_tokens))), tgt_order
        ),
        **layer_weights(weights, cfg),
    }
    load_weights(model, tensors)
    model.eval()
    return model, facts


def layer_weights(weights: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """The attention's, the encoder's (and bridge's) and the decoder's weights under OnmtRnn's
    names; the embeddings and the generator, whose rows are permuted, are not among them."""
    tensors = {"linear_out.weight": weights.get("decoder.attn.linear_out.weight", torch.empty(0))}
    for name in (
        "linear_out.bias",
        "linear_in.weight",
        "linear_query.weight",
        "linear_query.bias",
        "linear_context.weight",
        "v.weight",
    ):
        if f"decoder.attn.{name}" in weights:
            tensors[name] = weights[f"decoder.attn.{name}"]
    for name, value in weights.items():
        if name.startswith("encoder.rnn."):
            tensors["enc_rnn." + name[len("encoder.rnn.") :]] = value
        elif name.startswith("encoder.bridge."):
            tensors["bridge." + name[len("encoder.bridge.") :]] = value
    for layer in range(cfg.dec_layers):
        for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            if cfg.input_feeding:  # StackedGRU/StackedLSTM: decoder.rnn.layers.{l}.{part}
                source = f"decoder.rnn.layers.{layer}.{part}"
            else:  # nn.GRU/nn.LSTM: decoder.rnn.{part}_l{l}
                source = f"decoder.rnn.{part}_l{layer}"
            if source in weights:
                tensors[f"dec_rnn.{part}_l{layer}"] = weights[source]
    return tensors


def subword_transform(opt: Any) -> str | None:
    """The checkpoint's subword transform ("sentencepiece", "bpe" or None; its other transforms
    are checked by SHARED)."""
    subword = _subword(_opt(opt, "transforms", []))
    return subword[0] if subword else None


def subword_models(
    opt: Any, kind: str, src_model: Path | None, tgt_model: Path | None
) -> tuple[Path, Path]:
    """The source and target subword model files: the given ones, else the checkpoint's
    -src_subword_model / -tgt_subword_model (the target's is the source's with -share_vocab, as
    OpenNMT-py's transforms load it)."""
    src_given = src_model or _opt(opt, "src_subword_model")
    refuse_unless(
        bool(src_given),
        f"the checkpoint was trained with the {kind} transform but names no -src_subword_model: "
        "give it with --src-subword-model",
    )
    src = Path(str(src_given))
    if tgt_model is not None:
        return src, tgt_model
    if _opt(opt, "share_vocab", False):
        return src, src
    tgt_given = _opt(opt, "tgt_subword_model")
    refuse_unless(
        bool(tgt_given),
        f"the checkpoint was trained with the {kind} transform but names no -tgt_subword_model: "
        "give it with --tgt-subword-model",
    )
    return src, Path(str(tgt_given))


def tokenizer_section(
    opt: Any, src_model: Path | None = None, tgt_model: Path | None = None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's tokenizer section and the files it names (bundle name → content)."""
    kind = subword_transform(opt)
    if kind is None:
        word = {
            "kind": "word",
            "toolkit": "opennmt-py",
            "source": {"file": "source.vocab", "lowercase": False, "append_eos": False},
            "target": {"file": "target.vocab", "lowercase": False},
        }
        return word, {}
    src_path, tgt_path = subword_models(opt, kind, src_model, tgt_model)
    source, src_files = subword_side(SUBWORD_TRANSFORMS[kind], src_path, "source")
    target, tgt_files = subword_side(SUBWORD_TRANSFORMS[kind], tgt_path, "target")
    section = {"kind": "subword", "toolkit": "opennmt-py", "source": source, "target": target}
    return section, {**src_files, **tgt_files}


def import_checkpoint(
    checkpoint: Path,
    out: Path,
    name: str,
    version: str,
    int8: bool = False,
    src_subword_model: Path | None = None,
    tgt_subword_model: Path | None = None,
) -> Path:
    """An OpenNMT-py checkpoint → a bundle at `out` (nothing written when refused).
    src/tgt_subword_model: where the subword models are, when not where the checkpoint says."""
    ckpt = read_checkpoint(checkpoint)
    mapped = check_options(ckpt["opt"])
    tokenizer, files = tokenizer_section(ckpt["opt"], src_subword_model, tgt_subword_model)
    info = {"imported_from": "opennmt-py", "checkpoint": checkpoint.name}
    if _opt(ckpt["opt"], "encoder_type") == "transformer":
        facts = vocab_facts(ckpt)
        orders = (facts["src_order"], facts["tgt_order"])
        weights = checkpoint_weights(ckpt)
        model: nn.Module = opennmt_transformer.build(ckpt["opt"], weights, orders, mapped)
        export: Any = transformer_graphs.export_graphs
    else:
        model, facts = build(ckpt)
        export = export_graphs
    return write_bundle(
        model,
        cast(ModelConfig, model.cfg),
        {
            "source": (facts["src_tokens"], facts["src_order"]),
            "target": (facts["tgt_tokens"], facts["tgt_order"]),
        },
        tokenizer,
        out,
        name,
        version,
        int8,
        info,
        files,
        export=export,
    )
