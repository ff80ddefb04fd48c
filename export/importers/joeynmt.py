"""Joey NMT 2.x recurrent models (config.yaml + .ckpt) → bundle, with Joey NMT's own equations.

    s2s-import joeynmt --config model_dir/config.yaml --checkpoint model_dir/best.ckpt --out DIR

What is rebuilt (joeynmt/encoders.py RecurrentEncoder, decoders.py RecurrentDecoder, attention.py
of 2.3.0):
- a bidirectional GRU/LSTM encoder over packed sequences; every source sentence ends with EOS;
- the decoder's first state from the last layer's final states [fwd; bwd]: init_hidden "bridge"
  (tanh(W e + b)), "last" (e, or its forward half when twice the decoder's width) or "zero", the
  same for every layer (and for the LSTM's cell);
- a step: the RNN on [y; h~_{t-1}] (input_feeding) or y, then attention with the new top state as
  query: bahdanau v·tanh(W_q s + W_k h), luong s·(W_k h); h~ = tanh(W [s; c] + b); logits = U h~
  (no bias). As Joey's search does, BOS and PAD are never produced and EOS not at the first step;
- `level: bpe` with `tokenizer_type: sentencepiece` or `subword-nmt`: the model or codes file goes
  into the bundle, restricted to the vocabulary as Joey's tokenizers are (service/model/subword.py).
  `pretokenizer: moses` goes with it (sacremoses at serving time, the `moses` extra);
Anything else (transformers, unidirectional encoders, ...) is refused.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from export.importers.common import (
    ImportRefused,
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
from export.importers.options import Option, Options, OptionTable, check
from export.importers.rnn_steps import (
    attend,
    encode_packed,
    pack_state,
    token_rnn_step,
    unpack_rows,
)
from export.train.model import Encoded, FoldedEmbedding
from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, ModelConfig

ATTENTIONS = {"bahdanau": "additive", "luong": "general"}
# data.{src,trg}.tokenizer_type of `level: bpe` → our segmenter, and the tokenizer_cfg key of its file
SUBWORD_TOKENIZERS = ("sentencepiece", "subword-nmt")
SEGMENTER_FILES = {
    "sentencepiece": ("sentencepiece", "model_file"),
    "subword-nmt": ("bpe", "codes"),
}
ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


class JoeyRnn(nn.Module):
    """Joey NMT's recurrent encoder-decoder with this project's export interface."""

    def __init__(
        self,
        cfg: ModelConfig,
        tgt_emb_dim: int,
        src_scale: bool,
        tgt_scale: bool,
        activation: str,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        H, D = cfg.dec_hidden, cfg.enc_out_dim
        rnn_cls = nn.GRU if cfg.rnn == "gru" else nn.LSTM
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.emb_dim)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, tgt_emb_dim)
        self.src_scale = math.sqrt(cfg.emb_dim) if src_scale else 1.0
        self.tgt_scale = math.sqrt(tgt_emb_dim) if tgt_scale else 1.0
        self.enc_rnn = rnn_cls(
            cfg.emb_dim, cfg.enc_hidden, cfg.enc_layers, batch_first=True, bidirectional=True
        )
        self.dec_rnn = rnn_cls(tgt_emb_dim + (H if cfg.input_feeding else 0), H, cfg.dec_layers)
        if cfg.bridge == "bridge":
            self.bridge_layer = nn.Linear(D, H)
        self.key_layer = nn.Linear(D, H, bias=False)
        if cfg.attention == "additive":
            self.query_layer = nn.Linear(H, H, bias=False)
            self.energy_layer = nn.Linear(H, 1, bias=False)
        self.att_vector_layer = nn.Linear(H + D, H)
        self.output_layer = nn.Linear(H, cfg.tgt_vocab_size, bias=False)
        self.activation = ACTIVATIONS[activation]
        self.project_context = D == H
        self.folded: FoldedEmbedding | None = None  # set on the exporter's copy only

    def fold_embeddings(self) -> FoldedEmbedding:
        """The target embedding through the decoder's bottom layer (export/onnx/to_onnx.py)."""
        return FoldedEmbedding(self.tgt_embed.weight, self.dec_rnn, self.tgt_scale)

    def encode(self, src: Tensor, lengths: Tensor) -> Encoded:
        cfg = self.cfg
        B, S = src.shape
        emb = self.src_embed(src) * self.src_scale
        values, final = encode_packed(self.enc_rnn, emb, lengths)  # (B, S, D)
        h_n = final[0] if isinstance(final, tuple) else final  # (L*2, B, He)
        last = torch.cat([h_n[-2], h_n[-1]], dim=-1)  # (B, D): last layer, fwd and bwd
        H, L = cfg.dec_hidden, cfg.dec_layers
        if cfg.bridge == "bridge":
            init = self.activation(self.bridge_layer(last))
        elif cfg.bridge == "last":
            init = last[:, :H] if last.shape[1] == 2 * H else last
        else:
            init = torch.zeros(B, H, dtype=values.dtype)
        h = init.unsqueeze(0).expand(L, B, H)  # (L, B, H): every layer the same
        c = h if cfg.rnn == "lstm" else None
        feed = torch.zeros(B, H, dtype=values.dtype) if cfg.input_feeding else None
        mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        # The context only enters att_vector_layer([s; c]) = W_s s + W_c (Σ a h) + b
        # = W_s s + Σ a (W_c h) + b: attend over W_c h, projected once per sentence, and skip an
        # H x D product per hypothesis and step.
        # (The contract gives values the encoder's width: project only where it is the decoder's.)
        keys = self.key_layer(values)  # (B, S, H)
        if self.project_context:
            values = values @ self.att_vector_layer.weight[:, H:].t()  # (B, S, H)
        return Encoded(values=values, keys=keys, mask=mask, state=pack_state(h, c, feed))

    def decode_step(
        self, tokens: Tensor, state: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (N,), state (N, state_dim), encoder tensors (B, S, ·) → logits (N, V), state, attention (N, S)."""
        cfg = self.cfg
        N = tokens.shape[0]
        B, S = mask.shape
        K = N // B
        h, c, feed = unpack_rows(cfg, state)
        s_t, h, c = token_rnn_step(
            self.dec_rnn, self.tgt_embed, self.folded, tokens, feed, h, c, self.tgt_scale
        )
        query = s_t.reshape(B, K, -1)  # (B, K, H)
        if cfg.attention == "additive":
            energy = torch.tanh(self.query_layer(query).unsqueeze(2) + keys.unsqueeze(1))
            scores = self.energy_layer(energy).squeeze(-1)  # (B, K, S)
        else:
            scores = query @ keys.transpose(1, 2)  # (B, K, S)
        context, weights = attend(
            scores, values, mask
        )  # (B, K, H) = W_c c or (B, K, D) c; (B, K, S)
        if self.project_context:
            H = cfg.dec_hidden
            own = self.att_vector_layer.weight[:, :H]
            pre = context + nn.functional.linear(query, own, self.att_vector_layer.bias)
        else:
            pre = self.att_vector_layer(torch.cat([query, context], dim=-1))
        att_vector = self.activation(pre)  # att_vector_layer([s; c]) (B, K, H)
        att_vector = att_vector.reshape(N, -1)  # (N, H)
        logits = self.output_layer(att_vector)
        new_state = pack_state(h, c, att_vector if cfg.input_feeding else None)
        return logits, new_state, weights.reshape(N, S)

    def step_log_probs(self, logits: Tensor, tokens: Tensor) -> Tensor:
        """Joey's search: log-softmax over the whole vocabulary, then BOS and PAD forbidden, and EOS
        at the first step (min_output_length 1; the first step is the one fed BOS)."""
        log_probs = torch.log_softmax(logits, dim=-1)  # (N, V)
        V = log_probs.shape[1]
        banned = torch.zeros(V, dtype=torch.bool)
        banned[BOS_ID] = True
        banned[PAD_ID] = True
        first = (tokens == BOS_ID).unsqueeze(1)  # (N, 1)
        eos = torch.arange(V) == EOS_ID  # (V,)
        forbid = banned.unsqueeze(0) | (first & eos.unsqueeze(0))  # (N, V)
        return log_probs.masked_fill(forbid, float("-inf"))


def read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ImportRefused(f"config not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ImportRefused(f"{path} is not a YAML file: {err}") from err
    refuse_unless(
        isinstance(cfg, dict)
        and isinstance(cfg.get("model"), dict)
        and isinstance(cfg.get("data"), dict),
        f"{path} is not a Joey NMT config (no 'model' and 'data' sections)",
    )
    return cfg


def read_checkpoint(path: Path) -> dict[str, Tensor]:
    ckpt = load_torch_file(path, "Joey NMT")
    refuse_unless(
        isinstance(ckpt, dict) and isinstance(ckpt.get("model_state"), dict),
        f"{path} is not a Joey NMT checkpoint (no 'model_state')",
    )
    return dict(ckpt["model_state"])


def _level(side: str) -> Any:
    return lambda options: options[f"data.{side}.level"] == "bpe"


def _pretokenizer(side: str) -> Any:
    """Moses pretokenization goes with a subword level only (sacremoses at serving time)."""
    bpe = _level(side)
    return lambda value, options: (
        value in ((None, "none", "moses") if bpe(options) else (None, "none"))
    )


def _data(side: str) -> tuple[Option, ...]:
    """One side's data options: its level, a subword level's tokenizer, no normalization."""
    where = f"data.{side}"
    return (
        Option(f"{where}.level", ("word", "bpe"), "word"),
        Option(f"{where}.tokenizer_type", SUBWORD_TOKENIZERS, "sentencepiece", when=_level(side)),
        Option(f"{where}.tokenizer_cfg.pretokenizer", _pretokenizer(side), None,
               "'moses' or 'none' with level 'bpe', 'none' with level 'word'"),
        Option(f"{where}.normalize", (False, None), None),
    )  # fmt: skip


def _last_fits(value: Any, options: Options) -> bool:
    """init_hidden 'last' takes the encoder's output, or its forward half, as the first state."""
    He, H = int(options["model.encoder.hidden_size"]), int(options["model.decoder.hidden_size"])
    return value != "last" or 2 * He in (H, 2 * H)


def _rnn_kind(value: Any) -> str:
    return str(value).lower()


OPTIONS = OptionTable("Joey NMT", "", (
    Option("model.encoder.type", ("recurrent",), "recurrent"),
    Option("model.decoder.type", ("recurrent",), "recurrent"),
    Option("model.encoder.bidirectional", lambda v, o: v is True, True,
           "Joey NMT 2.3.0's RecurrentEncoder cannot run unidirectionally (its forward indexes the "
           "backward direction and raises IndexError), so no such model can have been trained by it"),
    Option("model.encoder.rnn_type", lambda v, o: _rnn_kind(v) in ("gru", "lstm"), "gru",
           "only GRU and LSTM are imported", to="ModelConfig.rnn", convert=_rnn_kind),
    Option("model.decoder.rnn_type", lambda v, o: _rnn_kind(v) == _rnn_kind(o["model.encoder.rnn_type"]),
           "gru", lambda o: f"the encoder's rnn_type {o['model.encoder.rnn_type']!r}: both the same"),
    Option("model.decoder.attention", tuple(ATTENTIONS), "bahdanau", to="ModelConfig.attention",
           convert=ATTENTIONS),
    Option("model.decoder.init_hidden", ("zero", "last", "bridge"), "bridge", to="ModelConfig.bridge"),
    Option("model.decoder.init_hidden", _last_fits, "bridge",
           lambda o: f"'last' needs the encoder's output ({2 * int(o['model.encoder.hidden_size'])}) "
           f"to equal or double the decoder's hidden_size ({o['model.decoder.hidden_size']})"),
    Option("model.decoder.activation", tuple(ACTIVATIONS), "tanh"),
    Option("model.decoder.input_feeding", default=True, to="ModelConfig.input_feed", convert=bool),
    Option("model.encoder.embeddings.embedding_dim", default=0, to="ModelConfig.emb_dim",
           convert=int),
    Option("model.encoder.hidden_size", default=1, to="ModelConfig.enc_hidden", convert=int),
    Option("model.decoder.hidden_size", default=1, to="ModelConfig.dec_hidden", convert=int),
    Option("model.encoder.num_layers", default=1, to="ModelConfig.enc_layers", convert=int),
    Option("model.decoder.num_layers", default=1, to="ModelConfig.dec_layers", convert=int),
    *_data("src"),
    *_data("trg"),
    Option("data.trg.level", lambda v, o: v == o["data.src.level"], "word",
           lambda o: f"data.src.level is {o['data.src.level']!r}: both sides must be words, "
           "or both subwords"),
    Option("data.special_symbols.sep_token", (None,), None),
    Option("data.special_symbols.lang_tags", (None, []), None),
))  # fmt: skip


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Refuse, once, every option this importer does not rebuild, naming each and its value; else
    what OPTIONS maps."""
    return check(OPTIONS, cfg)


def vocab_file(cfg: dict[str, Any], side: str, config_path: Path, checkpoint: Path) -> Path:
    """data.{side}.voc_file, else {side}_vocab.txt next to the checkpoint or in model_dir."""
    name = f"{side}_vocab.txt"
    given = cfg["data"].get(side, {}).get("voc_file")
    candidates = [Path(given)] if given else []
    candidates += [checkpoint.parent / name, config_path.parent / name]
    if cfg.get("model_dir"):
        candidates.append(Path(cfg["model_dir"]) / name)
    for path in candidates:
        if path.is_file():
            return path
    raise ImportRefused(f"no {side} vocabulary: looked for {', '.join(str(p) for p in candidates)}")


def read_vocab(path: Path, symbols: dict[str, Any]) -> list[str]:
    """Joey's Vocabulary: its specials first, then the file's tokens, each kept once."""
    specials = [
        symbols.get("unk_token", "<unk>"),
        symbols.get("pad_token", "<pad>"),
        symbols.get("bos_token", "<s>"),
        symbols.get("eos_token", "</s>"),
    ]
    tokens: list[str] = []
    seen: set[str] = set()
    for token in specials + path.read_text(encoding="utf-8").splitlines():
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    return tokens


def build(
    cfg: dict[str, Any], state: dict[str, Tensor], src_tokens: list[str], tgt_tokens: list[str]
) -> tuple[JoeyRnn, list[int], list[int]]:
    mapped = check_config(cfg)
    model_cfg, data = cfg["model"], cfg["data"]
    enc, dec = model_cfg.get("encoder", {}), model_cfg.get("decoder", {})
    symbols = data.get("special_symbols", {}) or {}
    names = {
        r: symbols.get(f"{r}_token", d)
        for r, d in (("pad", "<pad>"), ("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>"))
    }
    src_order = special_order(
        src_tokens, names["pad"], names["bos"], names["eos"], names["unk"], "source"
    )
    tgt_order = special_order(
        tgt_tokens, names["pad"], names["bos"], names["eos"], names["unk"], "target"
    )
    for key in ("src_embed.lut.weight", "trg_embed.lut.weight", "decoder.output_layer.weight"):
        refuse_unless(key in state, f"the checkpoint has no {key}: not a Joey NMT recurrent model")
    check_rows("the source embedding", state["src_embed.lut.weight"], len(src_tokens), "source")
    check_rows("the target embedding", state["trg_embed.lut.weight"], len(tgt_tokens), "target")
    check_rows("the output layer", state["decoder.output_layer.weight"], len(tgt_tokens), "target")
    cfg_out = model_config("joeynmt", (len(src_tokens), len(tgt_tokens)), mapped,
                           attn_dim=mapped["ModelConfig.dec_hidden"], decoder_style="luong",
                           bidirectional=True)  # fmt: skip
    model = JoeyRnn(
        cfg_out,
        tgt_emb_dim=int(dec.get("embeddings", {}).get("embedding_dim", 0)),
        src_scale=bool(enc.get("embeddings", {}).get("scale", False)),
        tgt_scale=bool(dec.get("embeddings", {}).get("scale", False)),
        activation=dec.get("activation", "tanh"),
    )
    tensors: dict[str, Tensor] = {
        "src_embed.weight": permuted(state["src_embed.lut.weight"], src_order),
        "tgt_embed.weight": permuted(state["trg_embed.lut.weight"], tgt_order),
        "output_layer.weight": permuted(state["decoder.output_layer.weight"], tgt_order),
    }
    renames = {
        "encoder.rnn.": "enc_rnn.",
        "decoder.rnn.": "dec_rnn.",
        "decoder.bridge_layer.": "bridge_layer.",
        "decoder.att_vector_layer.": "att_vector_layer.",
        "decoder.attention.key_layer.": "key_layer.",
        "decoder.attention.query_layer.": "query_layer.",
        "decoder.attention.energy_layer.": "energy_layer.",
    }
    for name, value in state.items():
        for old, new in renames.items():
            if name.startswith(old):
                tensors[new + name[len(old) :]] = value
    load_weights(model, tensors)
    model.eval()
    return model, src_order, tgt_order


def tokenizer_type(section: dict[str, Any]) -> str:
    """Joey NMT's own default: tokenizer_type, else bpe_type, else sentencepiece."""
    return str(section.get("tokenizer_type", section.get("bpe_type", "sentencepiece")))


def segmenter_file(cfg: dict[str, Any], side: str, config_path: Path, checkpoint: Path) -> Path:
    """tokenizer_cfg's model_file / codes as given, else that name in model_dir (Joey NMT copies
    it there), next to the checkpoint or next to the config."""
    section = cfg["data"][side]
    key = SEGMENTER_FILES[tokenizer_type(section)][1]
    given = (section.get("tokenizer_cfg", {}) or {}).get(key)
    refuse_unless(bool(given), f"data.{side}.tokenizer_cfg.{key} is not set")
    name = Path(str(given)).name
    candidates = [Path(str(given))]
    if cfg.get("model_dir"):
        candidates.append(Path(cfg["model_dir"]) / name)
    candidates += [checkpoint.parent / name, config_path.parent / name]
    for path in candidates:
        if path.is_file():
            return path
    raise ImportRefused(
        f"no data.{side}.tokenizer_cfg.{key}: looked for {', '.join(str(p) for p in candidates)}"
    )


def tokenizer_section(
    cfg: dict[str, Any],
    config_path: Path,
    checkpoint: Path,
    vocabularies: dict[str, list[str]],
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's tokenizer section and the files it names (bundle name → content).
    vocabularies: Joey's tokens per side ("src", "trg"), which its segmenters are restricted to."""
    data = cfg["data"]
    src, trg = data.get("src", {}), data.get("trg", {})
    if src.get("level", "word") == "word":  # both sides alike (check_config)
        word = {
            "kind": "word",
            "toolkit": "joeynmt",
            "source": {
                "file": "source.vocab",
                "lowercase": bool(src.get("lowercase", False)),
                "append_eos": True,
            },
            "target": {"file": "target.vocab", "lowercase": bool(trg.get("lowercase", False))},
        }
        return word, {}
    sides: dict[str, Any] = {"kind": "subword", "toolkit": "joeynmt"}
    files: dict[str, bytes] = {}
    for side, ours in (("src", "source"), ("trg", "target")):
        section = data[side]
        segmenter = SEGMENTER_FILES[tokenizer_type(section)][0]
        options = section.get("tokenizer_cfg", {}) or {}
        sides[ours], content = subword_side(
            segmenter,
            segmenter_file(cfg, side, config_path, checkpoint),
            ours,
            lowercase=bool(section.get("lowercase", False)),
            append_eos=side == "src",
            restrict_to=vocabularies[side],  # SetVocabulary / bpe.vocab in Joey's set_vocab
            separator=str(options.get("separator", "@@")),
        )
        if options.get("pretokenizer", "none") == "moses":  # its lang is the side's (Joey's rule)
            sides[ours]["pretokenizer"] = {"kind": "moses", "lang": str(section.get("lang", "en"))}
        files.update(content)
    return sides, files


def import_checkpoint(
    config: Path, checkpoint: Path, out: Path, name: str, version: str, int8: bool = False
) -> Path:
    """A Joey NMT config + checkpoint → a bundle at `out` (nothing written when refused)."""
    cfg = read_config(config)
    state = read_checkpoint(checkpoint)
    check_config(cfg)
    symbols = cfg["data"].get("special_symbols", {}) or {}
    src_tokens = read_vocab(vocab_file(cfg, "src", config, checkpoint), symbols)
    tgt_tokens = read_vocab(vocab_file(cfg, "trg", config, checkpoint), symbols)
    tokenizer, files = tokenizer_section(
        cfg, config, checkpoint, {"src": src_tokens, "trg": tgt_tokens}
    )
    model, src_order, tgt_order = build(cfg, state, src_tokens, tgt_tokens)
    info = {"imported_from": "joeynmt", "checkpoint": checkpoint.name, "config": config.name}
    return write_bundle(
        model,
        model.cfg,
        {"source": (src_tokens, src_order), "target": (tgt_tokens, tgt_order)},
        tokenizer,
        out,
        name,
        version,
        int8,
        info,
        files,
    )
