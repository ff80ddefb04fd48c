"""OpenNMT-py 3.x Transformer checkpoints → the Transformer graphs (export/transformer/).

What is rebuilt (onmt/encoders/transformer.py, onmt/decoders/transformer.py,
onmt/modules/multi_headed_attn.py, position_ffn.py and embeddings.py of 3.5.1): pre-norm encoder
and decoder layers (a layer norm before self-attention, before the context attention and inside
the feed-forward, whose residual it adds), a final layer norm after each stack, embeddings scaled
by sqrt(d_model) plus the checkpoint's own sinusoid table (SinusoidalInterleaved or
SinusoidalConcat), ReLU and GELU feed-forwards, q/k/v and feed-forward biases where
add_qkvbias/add_ffnbias put them, the generator (tied to the target embedding where
share_decoder_embeddings), layer norms of norm_eps.

The alignment of a model trained with guided alignment (`lambda_align` > 0) is what
`onmt_translate -report_align` reports: decoder layer `alignment_layer`, its first
`alignment_heads` heads averaged (all of them for 0); of a model trained without, CTranslate2's
default: the last layer, every head averaged. With `full_context_alignment`
OpenNMT-py reads that layer again without the causal mask once the translation is known, which a
step cannot: refused, as is every option the graphs do not carry (relative or rotary positions,
average attention, multi-query heads, parallel residuals, RMS norms, the gated feed-forwards of
silu and gated-gelu, copy attention, ...), each by name and value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from export.importers.common import check_rows, load_weights, permuted, refuse_unless
from export.importers.config_builder import model_config
from export.importers.options import Option, Options
from export.transformer.model import TransformerSeq2Seq
from service.model.architecture import TransformerShape

# silu and gated-gelu are gated feed-forwards in OpenNMT-py (a third matrix, w_3): not carried
ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}
POSITIONS = {
    "SinusoidalInterleaved": "sinusoidal_interleaved",
    "SinusoidalConcat": "sinusoidal_marian",
}
# (option, the values rebuilt, its value when a checkpoint does not record it)
REQUIRED: tuple[tuple[str, tuple[Any, ...], Any], ...] = (
    ("position_encoding", (True,), False),
    ("self_attn_type", ("scaled-dot", "scaled-dot-flash"), "scaled-dot"),
    ("max_relative_positions", (0,), 0),
    ("relative_positions_buckets", (0,), 0),
    ("layer_norm", ("standard",), "standard"),
    ("num_kv", (0,), 0),
    ("parallel_residual", (False,), False),
    ("shared_layer_norm", (False,), False),
    ("full_context_alignment", (False,), False),
    ("copy_attn", (False,), False),
    ("num_experts", (0,), 0),
    ("sliding_window", (0,), 0),
)


def _guided(options: Options) -> bool:
    """Trained with guided alignment: -report_align reads -alignment_layer/-alignment_heads."""
    return float(options["lambda_align"]) > 0


def _layer_of(value: Any, options: Options) -> bool:
    layers = int(options["dec_layers"])
    return -layers <= int(value) < layers


# The Transformer's options (opennmt.py adds those every OpenNMT-py checkpoint shares); the
# alignment of a model trained without guided alignment: CTranslate2's default (last layer, all
# heads), given to the builder by build().
OPTIONS: tuple[Option, ...] = (
    Option("decoder_type", ("transformer",), "rnn",
           "with -encoder_type 'transformer' the importer supports a Transformer decoder"),
    *(Option(name, allowed, default) for name, allowed, default in REQUIRED),
    Option("pos_ffn_activation_fn", tuple(ACTIVATIONS), "relu",
           to="TransformerShape.activation", convert=ACTIVATIONS),
    Option("position_encoding_type", tuple(POSITIONS), "SinusoidalInterleaved",
           to="TransformerShape.positions", convert=POSITIONS),
    Option("hidden_size", to="TransformerShape.d_model", convert=int),
    *(Option(f"{side}_hid_size", lambda v, o: v == o["hidden_size"], default_from="hidden_size",
             accepted="encoder and decoder must be -hidden_size wide") for side in ("enc", "dec")),
    Option("heads", default=8, to="TransformerShape.heads", convert=int),
    Option("transformer_ff", default=2048, to="TransformerShape.ffn_dim", convert=int),
    Option("layers", default=6),
    Option("enc_layers", default_from="layers", to="TransformerShape.enc_layers", convert=int),
    Option("dec_layers", default_from="layers", to="TransformerShape.dec_layers", convert=int),
    Option("norm_eps", default=1e-6, to="TransformerShape.norm_eps", convert=float),
    Option("lambda_align", default=0.0),
    Option("alignment_layer", _layer_of, -3, lambda o: f"one of the {o['dec_layers']} decoder layers",
           to="TransformerShape.align_layer", convert=int, when=_guided),
    Option("alignment_heads", lambda v, o: 0 <= int(v) <= int(o["heads"]), 0,
           lambda o: f"at most -heads {o['heads']}", to="TransformerShape.align_heads",
           convert=lambda heads: tuple(range(int(heads))), when=_guided),
)  # fmt: skip


def linear(weights: dict[str, Tensor], theirs: str, ours: str, out: dict[str, Tensor]) -> None:
    """A Linear's weight, and its bias or zeros where the checkpoint has none (add_*bias off)."""
    weight = weights[f"{theirs}.weight"]
    out[f"{ours}.weight"] = weight
    out[f"{ours}.bias"] = weights.get(f"{theirs}.bias", torch.zeros(weight.shape[0]))


def norm(weights: dict[str, Tensor], theirs: str, ours: str, out: dict[str, Tensor]) -> None:
    out[f"{ours}.weight"] = weights[f"{theirs}.weight"]
    out[f"{ours}.bias"] = weights[f"{theirs}.bias"]


ATTENTION = {"linear_query": "q", "linear_keys": "k", "linear_values": "v", "final_linear": "out"}


def feed_forward(
    weights: dict[str, Tensor], theirs: str, ours: str, out: dict[str, Tensor]
) -> None:
    """A layer's feed-forward (w_1, w_2, its pre-norm) under our names, encoder or decoder alike."""
    linear(weights, f"{theirs}.feed_forward.w_1", f"{ours}.ffn.fc1", out)
    linear(weights, f"{theirs}.feed_forward.w_2", f"{ours}.ffn.fc2", out)
    norm(weights, f"{theirs}.feed_forward.layer_norm", f"{ours}.ffn_norm.norm", out)


def layer_tensors(weights: dict[str, Tensor], shape: TransformerShape) -> dict[str, Tensor]:
    """Every layer's weights under our names (export/transformer/model.py)."""
    out: dict[str, Tensor] = {}
    for i in range(shape.enc_layers):
        theirs, ours = f"encoder.transformer.{i}", f"encoder.{i}"
        for proj, short in ATTENTION.items():
            linear(weights, f"{theirs}.self_attn.{proj}", f"{ours}.self_attn.{short}", out)
        norm(weights, f"{theirs}.layer_norm", f"{ours}.attn_norm.norm", out)
        feed_forward(weights, theirs, ours, out)
    for i in range(shape.dec_layers):
        theirs, ours = f"decoder.transformer_layers.{i}", f"decoder.{i}"
        for attn, mine in (("self_attn", "self_attn"), ("context_attn", "cross_attn")):
            for proj, short in ATTENTION.items():
                linear(weights, f"{theirs}.{attn}.{proj}", f"{ours}.{mine}.{short}", out)
        norm(weights, f"{theirs}.layer_norm_1", f"{ours}.self_norm.norm", out)
        norm(weights, f"{theirs}.layer_norm_2", f"{ours}.cross_norm.norm", out)
        feed_forward(weights, theirs, ours, out)
    norm(weights, "encoder.layer_norm", "enc_norm", out)
    norm(weights, "decoder.layer_norm", "dec_norm", out)
    return out


def build(
    opt: Any,
    weights: dict[str, Tensor],
    orders: tuple[list[int], list[int]],
    mapped: dict[str, Any],
) -> TransformerSeq2Seq:
    """The network with the checkpoint's weights; `orders`: the toolkit's row of each of our
    source and target ids (opennmt.py's special_order); `mapped`: what OPTIONS mapped
    (opennmt.check_options)."""
    fixed = {"pre_norm": True, "scale_embedding": True, "align_layer": -1, "align_heads": ()}
    cfg = model_config("opennmt-py", (len(orders[0]), len(orders[1])), mapped, shape=fixed)
    shape = cfg.transformer
    assert shape is not None
    src_order, tgt_order = orders
    src_emb = weights["encoder.embeddings.make_embedding.emb_luts.0.weight"]
    tgt_emb = weights["decoder.embeddings.make_embedding.emb_luts.0.weight"]
    check_rows("the source embedding", src_emb, len(src_order), "source")
    check_rows("the target embedding", tgt_emb, len(tgt_order), "target")
    refuse_unless(
        src_emb.shape[1] == shape.d_model and tgt_emb.shape[1] == shape.d_model,
        f"-word_vec_size {src_emb.shape[1]} differs from -hidden_size {shape.d_model}",
    )
    gen_w = weights.get("generator.weight", tgt_emb)
    check_rows("the generator", gen_w, len(tgt_order), "target")
    table = weights.get("encoder.embeddings.make_embedding.pe.pe")
    rows = int(table.shape[0]) if table is not None else 5000
    net = TransformerSeq2Seq(cfg, rows, final_norms=True)
    tied = bool(getattr(opt, "share_decoder_embeddings", False))
    if tied:  # one weight, one initializer, as the checkpoint's one parameter
        net.tie_output()
    tensors = {
        "src_embed.weight": permuted(src_emb, src_order),
        "tgt_embed.weight": permuted(tgt_emb, tgt_order),
        **({} if tied else {"out.weight": permuted(gen_w, tgt_order)}),
        "out.bias": permuted(weights.get("generator.bias", torch.zeros(len(tgt_order))), tgt_order),
        **layer_tensors(weights, shape),
    }
    if table is not None:  # the checkpoint's own sinusoids, exactly as it adds them
        with torch.no_grad():
            net.src_positions.copy_(table[:, 0, :])
            net.tgt_positions.copy_(weights["decoder.embeddings.make_embedding.pe.pe"][:, 0, :])
    load_weights(net, tensors)
    net.eval()
    return net
