"""Hugging Face `MarianMTModel` directories (what a user downloads from the Hub) → bundle.

    s2s-import huggingface --model opus-mt-de-en/ --out models/de-en

The directory holds `config.json` (model_type "marian"), the weights (`model.safetensors` or
`pytorch_model.bin`), `source.spm` and `target.spm` (SentencePiece, pieces only) and `vocab.json`
(piece → id, shared by both sides), and where present `generation_config.json`. What is rebuilt
(transformers' modeling_marian.py): post-norm encoder and decoder layers, embeddings scaled by
sqrt(d_model), sinusoidal positions with the sines in the first half, the output layer tied to the
shared embedding plus `final_logits_bias`, a log-softmax over the model's vocabulary, then
`bad_words_ids` (the pad) at -inf, as `generate` does. The decoder starts from the pad token: our
BOS row is a copy of the pad's embedding, never emitted. The tokenizer is MarianTokenizer's: the
source SentencePiece's pieces looked up in vocab.json (`<unk>` where absent) and `</s>` appended;
the target's pieces joined by target.spm's DecodePieces.

Refused, naming the option and the file: another model_type, separate source and target
vocabularies, encoder and decoder of different widths, heads or feed-forwards, an activation the
graphs do not carry, normalize_before, a layernorm_embedding, a vocabulary size that is not the
weights'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from export.importers.common import (
    ImportRefused,
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
from export.transformer.graphs import export_graphs
from export.transformer.model import TransformerSeq2Seq
from service.model.architecture import BOS_ID, PAD_ID

BOS_TOKEN = "<hf:decoder_start>"  # our BOS: the row the decoder starts from (Marian's pad)
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu",
               "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}  # fmt: skip
MAX_STEPS = 256  # the server's default cap on target tokens (SearchOptions.max_length)


def read_json(path: Path, what: str) -> dict[str, Any]:
    refuse_unless(path.is_file(), f"{what} is not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ImportRefused(f"{path} is not JSON: {err}") from err
    refuse_unless(isinstance(data, dict), f"{path} is not a JSON object")
    return data


def read_weights(directory: Path) -> dict[str, Tensor]:
    """model.safetensors, else pytorch_model.bin: name → tensor."""
    safe = directory / "model.safetensors"
    if safe.is_file():
        try:
            from safetensors.torch import load_file
        except ModuleNotFoundError as err:  # pragma: no cover - the import extra brings it
            raise ImportRefused("reading model.safetensors needs the safetensors package") from err
        try:
            return dict(load_file(str(safe)))
        except Exception as err:  # safetensors raises its own error types
            raise ImportRefused(f"{safe} is not a safetensors file: {err}") from err
    binary = directory / "pytorch_model.bin"
    refuse_unless(
        binary.is_file(), f"{directory} has neither model.safetensors nor pytorch_model.bin"
    )
    state = load_torch_file(binary, "a Hugging Face model")
    refuse_unless(isinstance(state, dict), f"{binary} is not a state dict")
    return dict(state)


def _equal(other: str) -> Option:
    """The decoder's option of a pair, which must equal the encoder's."""
    name = other.replace("encoder", "decoder")
    return Option(name, lambda v, o: v == o[other], accepted=lambda o: f"{other} is {o[other]}")


def _unset(name: str) -> Option:
    return Option(name, lambda v, o: not v, False, "not supported")


OPTIONS = OptionTable("Hugging Face", "", (
    Option("model_type", ("marian",), accepted="the importer reads 'marian' (MarianMTModel)"),
    *(_unset(name) for name in ("normalize_before", "add_final_layer_norm", "normalize_embedding")),
    Option("share_encoder_decoder_embeddings", lambda v, o: bool(v), True,
           "separate vocabularies are not supported"),
    _equal("encoder_attention_heads"),
    _equal("encoder_ffn_dim"),
    Option("activation_function", lambda v, o: str(v) in ACTIVATIONS, "swish",
           f"the importer supports {list(ACTIVATIONS)}", to="TransformerShape.activation",
           convert=lambda act: ACTIVATIONS[str(act)]),
    Option("decoder_start_token_id", lambda v, o: int(v) == int(o["pad_token_id"]),
           default_from="pad_token_id", accepted="the decoder starts from the pad (pad_token_id)"),
    Option("d_model", to="TransformerShape.d_model", convert=int),
    Option("encoder_attention_heads", to="TransformerShape.heads", convert=int),
    Option("encoder_ffn_dim", to="TransformerShape.ffn_dim", convert=int),
    Option("encoder_layers", to="TransformerShape.enc_layers", convert=int),
    Option("decoder_layers", to="TransformerShape.dec_layers", convert=int),
    Option("scale_embedding", default=True, to="TransformerShape.scale_embedding", convert=bool),
))  # fmt: skip
# What modeling_marian.py fixes: post-norm layers, sines then cosines; no guided alignment, so
# CTranslate2's default (the last layer, every head)
SHAPE = {"pre_norm": False, "positions": "sinusoidal_halves", "align_layer": -1, "align_heads": ()}


def vocabulary(path: Path, pad: int, eos: int) -> tuple[list[str], list[int]]:
    """vocab.json's pieces in id order plus our BOS, and the row of each of our ids."""
    mapping = read_json(path, "the vocabulary")
    refuse_unless("<unk>" in mapping, f"{path} has no '<unk>' piece")
    unk = mapping["<unk>"]
    by_id: dict[int, str] = {}
    for piece, raw in mapping.items():
        refuse_unless(isinstance(raw, int), f"{path}: {piece!r} has id {raw!r}, not an integer")
        refuse_unless(raw not in by_id, f"{path}: id {raw} is given to two pieces")
        by_id[raw] = piece
    refuse_unless(
        sorted(by_id) == list(range(len(by_id))), f"{path}: ids are not 0..{len(by_id) - 1}"
    )
    tokens = [by_id[i] for i in range(len(by_id))]
    for role, tok_id in (("pad", pad), ("eos", eos), ("unk", unk)):
        refuse_unless(0 <= tok_id < len(tokens), f"{path}: the {role} id {tok_id} is not a piece")
    refuse_unless(BOS_TOKEN not in tokens, f"{path} has a piece {BOS_TOKEN!r}")
    tokens.append(BOS_TOKEN)
    order = special_order(tokens, tokens[pad], BOS_TOKEN, tokens[eos], tokens[unk], "shared")
    return tokens, order


def first(weights: dict[str, Tensor], names: tuple[str, ...], directory: Path) -> Tensor:
    for name in names:
        if name in weights:
            return weights[name]
    raise ImportRefused(f"{directory}: the weights have none of {list(names)}")


def layer_tensors(weights: dict[str, Tensor], side: str, i: int) -> dict[str, Tensor]:
    """One layer's weights under our names (export/transformer/model.py)."""
    hf = f"model.{side}.layers.{i}."
    renames = {"self_attn": "self_attn", "self_attn_layer_norm": "attn_norm.norm",
               "fc1": "ffn.fc1", "fc2": "ffn.fc2", "final_layer_norm": "ffn_norm.norm"}  # fmt: skip
    if side == "decoder":
        renames |= {"self_attn_layer_norm": "self_norm.norm", "encoder_attn": "cross_attn",
                    "encoder_attn_layer_norm": "cross_norm.norm"}  # fmt: skip
    projections = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "out"}
    ours = "encoder" if side == "encoder" else "decoder"
    out: dict[str, Tensor] = {}
    for theirs, mine in renames.items():
        for param in ("weight", "bias"):
            if mine.endswith("attn"):
                for proj, short in projections.items():
                    out[f"{ours}.{i}.{mine}.{short}.{param}"] = weights[
                        f"{hf}{theirs}.{proj}.{param}"
                    ]
            else:
                out[f"{ours}.{i}.{mine}.{param}"] = weights[f"{hf}{theirs}.{param}"]
    return out


def build(directory: Path) -> tuple[TransformerSeq2Seq, list[str], list[int], dict[str, Any]]:
    """The network with the directory's weights, its tokens, our ids' rows, the generation config."""
    config_path = directory / "config.json"
    config = read_json(config_path, "config.json")
    mapped = check(OPTIONS, config, str(config_path))
    max_positions = int(config.get("max_position_embeddings", 512))
    generation = config | (
        read_json(directory / "generation_config.json", "generation_config.json")
        if (directory / "generation_config.json").is_file()
        else {}
    )
    pad, eos = int(config["pad_token_id"]), int(config["eos_token_id"])
    vocab_path = directory / "vocab.json"
    tokens, order = vocabulary(vocab_path, pad, eos)
    weights = read_weights(directory)
    shared = first(weights, ("model.shared.weight", "model.encoder.embed_tokens.weight",
                             "model.decoder.embed_tokens.weight", "lm_head.weight"), directory)  # fmt: skip
    V = len(tokens) - 1
    refuse_unless(
        shared.shape[0] == V and int(config.get("vocab_size", V)) == V,
        f"{config_path}: vocab_size {config.get('vocab_size')} and the embedding's "
        f"{shared.shape[0]} rows must both be vocab.json's {V} pieces",
    )
    d_model = mapped["TransformerShape.d_model"]
    refuse_unless(
        shared.shape[1] == d_model,
        f"{config_path}: d_model {d_model} is not the embedding's width {shared.shape[1]}",
    )
    rows = [row if row < V else pad for row in order]  # our BOS reads the pad's row
    embed = permuted(shared, rows)
    bias = first(weights, ("final_logits_bias",), directory).reshape(-1)
    bias = permuted(bias, rows)
    bias[BOS_ID] = float("-inf")  # a row Marian lacks: out of the log-softmax
    cfg = model_config("huggingface", (len(tokens), len(tokens)), mapped, shape=SHAPE)
    shape = cfg.transformer
    assert shape is not None
    banned = {PAD_ID} | {_our_id(order, ids[0]) for ids in generation.get("bad_words_ids") or []
                         if len(ids) == 1}  # fmt: skip
    net = TransformerSeq2Seq(cfg, max_positions, banned=tuple(sorted(banned)))
    tensors = {"src_embed.weight": embed, "tgt_embed.weight": embed, "out.bias": bias}
    for i in range(shape.enc_layers):
        tensors |= layer_tensors(weights, "encoder", i)
    for i in range(shape.dec_layers):
        tensors |= layer_tensors(weights, "decoder", i)
    lm_head = weights.get("lm_head.weight")
    if lm_head is not None and not torch.equal(lm_head, shared):
        refuse_unless(False, f"{directory}: lm_head.weight is not the shared embedding (untied)")
    net.tie_output()
    load_weights(net, tensors)
    net.eval()
    return net, tokens, order, generation


def _our_id(order: list[int], row: int) -> int:
    return order.index(row)


def decoding_defaults(generation: dict[str, Any]) -> dict[str, Any]:
    """`generate`'s rules as the bundle's decoding defaults: scores over length^length_penalty
    (the end of sentence counted), at most max_length - 1 tokens whatever the source's length
    (its decoder start is counted in max_length), capped at MAX_STEPS, the end of sentence forced
    at that length where `forced_eos_token_id` is the end of sentence, and its stopping rule
    (early_stopping False: "heuristic"; True: "patience" 1, done once beam_size have ended;
    "never": "exact")."""
    steps = min(int(generation.get("max_length", 512)) - 1, MAX_STEPS)
    early = generation.get("early_stopping", False)
    stopping = {False: "heuristic", True: "patience", "never": "exact"}.get(early)
    refuse_unless(stopping is not None, f"early_stopping {early!r} is not one generate knows")
    eos = generation.get("eos_token_id")
    return {
        "stopping": stopping,
        "force_eos": eos is not None and generation.get("forced_eos_token_id") == eos,
        "patience": 1.0,
        "normalize": float(generation.get("length_penalty", 1.0)),
        "max_length_a": 0.0,
        "max_length_b": steps,
        "max_length": steps,
    }


def import_model(directory: Path, out: Path, name: str, version: str, int8: bool = False) -> Path:
    """A MarianMTModel directory → a bundle at `out` (nothing written if refused)."""
    refuse_unless(directory.is_dir(), f"the model directory is not found: {directory}")
    net, tokens, order, generation = build(directory)
    tokenizer: dict[str, Any] = {"kind": "subword", "toolkit": "huggingface"}
    files: dict[str, bytes] = {}
    for side, spm_name in (("source", "source.spm"), ("target", "target.spm")):
        tokenizer[side], content = subword_side(
            "sentencepiece", directory / spm_name, side, append_eos=side == "source"
        )
        files.update(content)
    info = {
        "imported_from": "huggingface",
        "model": directory.name,
        "architectures": generation.get("architectures"),
        "transformers_version": generation.get("transformers_version"),
    }
    return write_bundle(
        net, net.cfg, {"source": (tokens, order), "target": (tokens, order)}, tokenizer, out,
        name, version, int8, info, files, decoding=decoding_defaults(generation),
        export=export_graphs,
    )  # fmt: skip
