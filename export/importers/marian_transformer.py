"""Marian `transformer` models (model.npz, as OPUS-MT publishes them) → the Transformer graphs.

What is rebuilt (marian-dev src/models/transformer.h, layers/generic.h, graph/expression_operators
of 1.12): post-norm layers (`--transformer-postprocess dan`: dropout, the residual, a layer norm
of eps 1e-9 after each sub-layer), embeddings scaled by sqrt(dim-emb) plus Marian's sinusoids (sines
then cosines, timescales exp(-i · log(10^4) / (d/2 - 1)), in float32), the decoder's first input a
zero embedding at position 0 (our BOS row, zero), self-attention keys and values of every earlier
step (Marian recomputes them from the layer's inputs; the graphs cache them: the same sums),
ReLU or swish feed-forwards of depth 2, the output layer (the target or shared embedding where
tied, else `decoder_ff_logit_out_W`) plus its bias, and `<unk>` and the rows past the vocabulary
suppressed after the log-softmax, as marian-decoder does without `--allow-unk`.

The alignment is what `marian-decoder --alignment` reads (transformer.h, collectOneHead): the
cross-attention of decoder layer `--transformer-guided-alignment-layer` ("last", or 1-based),
head 0.

Refused by name and value: the SSRU and average-attention decoders
(`--transformer-decoder-autoreg`), pre-norm (`--transformer-preprocess n`: marian-decoder's steps
after the first attend over un-normalized earlier inputs, which no cache of normalized keys
reproduces), a layer norm on the embeddings or on the top of a stack, Marian's GELU (x ·
sigmoid(1.702 x), not the graphs' erf GELU), feed-forwards deeper than 2, tied layers, no
projection, pooling, learned or disabled positions, ALiBi and other attention masks, layers without
biases or affine norms, factors.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torch import Tensor

from export.importers.common import load_weights, refuse_unless
from export.importers.config_builder import model_config
from export.importers.options import Option, Options
from export.transformer.model import TransformerSeq2Seq
from service.model.architecture import Toolkit, TransformerShape

ACTIVATIONS = {"relu": "relu", "swish": "swish"}
EPS = 1e-9  # Marian's layerNorm (graph/expression_operators.h)
# Rows of the position tables: Marian computes a sinusoid for any position; a step past these rows
# reads the last one (far past the 256 target tokens a request may ask for).
MAX_POSITIONS = 1024
# (option, the values rebuilt, its value where model.yml does not record it)
REQUIRED: tuple[tuple[str, tuple[Any, ...], Any], ...] = (
    ("transformer-decoder-autoreg", ("self-attention",), "self-attention"),
    ("transformer-ffn-depth", (2,), 2),
    ("transformer-decoder-ffn-depth", (0, 2), 0),
    ("transformer-tied-layers", ([],), []),
    ("transformer-no-projection", (False,), False),
    ("transformer-pool", (False,), False),
    ("transformer-train-position-embeddings", (False,), False),
    ("transformer-train-positions", (False,), False),
    ("transformer-disable-position-embeddings", (False,), False),
    ("transformer-attention-mask", ("default",), "default"),
    ("transformer-no-bias", (False,), False),
    ("transformer-no-affine", (False,), False),
    ("right-left", (False,), False),
    ("factors-dim-emb", (0,), 0),
    ("lemma-dim-emb", (0,), 0),
    ("ulr", (False,), False),
    ("input-types", ([],), []),
)
# The pre/post-processing strings (d: dropout, a: the residual, n: a layer norm), dropout dropped:
# (option, its value with dropout dropped that is rebuilt, its value where model.yml has none)
PROCESSING = (
    ("transformer-preprocess", "", ""),
    ("transformer-postprocess", "an", "dan"),
    ("transformer-postprocess-emb", "", ""),
    ("transformer-postprocess-top", "", ""),
)


def _processing(rebuilt: str) -> Any:
    return lambda value, options: str(value or "").replace("d", "") == rebuilt


def _alignment_layer(value: Any, options: Options) -> bool:
    raw = str(value).strip()
    return raw == "last" or (raw.isdigit() and 1 <= int(raw) <= int(options["dec-depth"]))


# A Transformer's options (marian.py adds those of every Marian model)
OPTIONS: tuple[Option, ...] = (
    *(Option(name, allowed, default) for name, allowed, default in REQUIRED),
    *(Option(name, _processing(rebuilt), default, "the importer rebuilds post-norm Transformers: "
             "--transformer-preprocess d, --transformer-postprocess dan")
      for name, rebuilt, default in PROCESSING),
    Option("transformer-ffn-activation", tuple(ACTIVATIONS), "swish",
           to="TransformerShape.activation", convert=ACTIVATIONS),
    Option("transformer-dim-ffn", default=2048, to="TransformerShape.ffn_dim", convert=int),
    Option("transformer-decoder-dim-ffn", lambda v, o: v in (0, o["transformer-dim-ffn"]), 0,
           lambda o: f"the decoder's feed-forward must be --transformer-dim-ffn "
           f"{o['transformer-dim-ffn']} wide"),
    Option("transformer-heads", default=8, to="TransformerShape.heads", convert=int),
    Option("enc-depth", default=6, to="TransformerShape.enc_layers", convert=int),
    Option("dec-depth", default=6, to="TransformerShape.dec_layers", convert=int),
    Option("transformer-guided-alignment-layer", _alignment_layer, "last",
           lambda o: f"'last' or one of the decoder's {o['dec-depth']} layers, from 1"),
)  # fmt: skip


def alignment_layer(options: dict[str, Any], layers: int) -> int:
    """The 0-based decoder layer of --transformer-guided-alignment-layer ("last" or 1-based)."""
    raw = str(options.get("transformer-guided-alignment-layer", "last")).strip()
    return layers - 1 if raw == "last" else int(raw) - 1


Getter = Callable[[str], Tensor]


def affine(get: Getter, theirs: str, suffix: str, ours: str, out: dict[str, Tensor]) -> None:
    """Marian's x · W + b (W: (in, out), b: (1, out)) as a Linear's weight and bias."""
    out[f"{ours}.weight"] = get(f"{theirs}_W{suffix}").t()
    out[f"{ours}.bias"] = get(f"{theirs}_b{suffix}").reshape(-1)


def layer_norm(get: Getter, theirs: str, ours: str, out: dict[str, Tensor]) -> None:
    out[f"{ours}.weight"] = get(f"{theirs}_ln_scale").reshape(-1)
    out[f"{ours}.bias"] = get(f"{theirs}_ln_bias").reshape(-1)


def attention(get: Getter, theirs: str, ours: str, norm: str, out: dict[str, Tensor]) -> None:
    """An attention block (`<prefix>_W{q,k,v,o}`, its post-norm `<prefix>_Wo_ln_*`)."""
    for proj, short in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
        affine(get, theirs, proj, f"{ours}.{short}", out)
    layer_norm(get, f"{theirs}_Wo", norm, out)


def feed_forward(get: Getter, theirs: str, ours: str, out: dict[str, Tensor]) -> None:
    """A feed-forward of depth 2 (`<prefix>_W1`, `_W2`, its post-norm `<prefix>_ffn_ln_*`)."""
    affine(get, theirs, "1", f"{ours}.ffn.fc1", out)
    affine(get, theirs, "2", f"{ours}.ffn.fc2", out)
    layer_norm(get, f"{theirs}_ffn", f"{ours}.ffn_norm.norm", out)


def layer_tensors(get: Getter, shape: TransformerShape) -> dict[str, Tensor]:
    """Every layer's weights under our names (export/transformer/model.py); Marian counts from 1."""
    out: dict[str, Tensor] = {}
    for i in range(shape.enc_layers):
        theirs, ours = f"encoder_l{i + 1}", f"encoder.{i}"
        attention(get, f"{theirs}_self", f"{ours}.self_attn", f"{ours}.attn_norm.norm", out)
        feed_forward(get, f"{theirs}_ffn", ours, out)
    for i in range(shape.dec_layers):
        theirs, ours = f"decoder_l{i + 1}", f"decoder.{i}"
        attention(get, f"{theirs}_self", f"{ours}.self_attn", f"{ours}.self_norm.norm", out)
        attention(get, f"{theirs}_context", f"{ours}.cross_attn", f"{ours}.cross_norm.norm", out)
        feed_forward(get, f"{theirs}_ffn", ours, out)
    return out


def build(
    get: Getter,
    names: Collection[str],
    options: dict[str, Any],
    vocab_part: dict[str, Tensor],
    banned: tuple[int, ...],
    toolkit: Toolkit,
    mapped: dict[str, Any],
) -> TransformerSeq2Seq:
    """The network with the model's weights; `mapped`: what OPTIONS mapped. `vocab_part`: the embeddings and the output layer in
    our id order (export/importers/marian.py: `src_embed.weight`, `tgt_embed.weight`, `out.bias`,
    and `out.weight` unless tied to the target embedding); `banned`: our ids marian-decoder never
    emits (its `<unk>`, rows past its vocabulary)."""
    src, tgt = vocab_part["src_embed.weight"], vocab_part["tgt_embed.weight"]
    width = int(options.get("dim-emb", src.shape[1]))
    refuse_unless(
        src.shape[1] == width and tgt.shape[1] == width,
        f"--dim-emb {width} does not match the embeddings ({src.shape[1]}, {tgt.shape[1]})",
    )
    refuse_unless(
        width % mapped["TransformerShape.heads"] == 0,
        f"--dim-emb {width} is not a multiple of --transformer-heads",
    )
    layer = alignment_layer(options, mapped["TransformerShape.dec_layers"])
    fixed = {"d_model": width, "pre_norm": False, "positions": "sinusoidal_marian",
             "scale_embedding": True, "align_layer": layer, "align_heads": (0,), "norm_eps": EPS}  # fmt: skip
    cfg = model_config(toolkit, (src.shape[0], tgt.shape[0]), mapped, shape=fixed)
    shape = cfg.transformer
    assert shape is not None
    net = TransformerSeq2Seq(cfg, MAX_POSITIONS, banned=banned, final_norms=False)
    if "out.weight" not in vocab_part:
        net.tie_output()
    for side, depth in (("encoder", shape.enc_layers), ("decoder", shape.dec_layers)):
        extra = f"{side}_l{depth + 1}_self_Wq"
        refuse_unless(
            extra not in names,
            f"the model has {extra} but --{side[:3]}-depth {depth}: its options and weights differ",
        )
    load_weights(net, {**vocab_part, **layer_tensors(get, shape)})
    net.eval()
    return net
