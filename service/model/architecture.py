"""The model's architecture as one typed config, shared by training, export and serving.

It lives in `service/` (torch-free) because the bundle's manifest carries it to the server:
export writes it, serving reads it, and neither guesses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, TypeVar

RnnKind = Literal["gru", "lstm"]
AttentionKind = Literal["additive", "dot", "general", "concat", "scaled_dot", "none"]
DecoderStyle = Literal["bahdanau", "luong", "cgru"]
Toolkit = Literal["native", "opennmt-py", "joeynmt", "marian", "huggingface"]

RNN_KINDS: tuple[str, ...] = ("gru", "lstm")
ATTENTION_KINDS: tuple[str, ...] = ("additive", "dot", "general", "concat", "scaled_dot", "none")
DECODER_STYLES: tuple[str, ...] = ("bahdanau", "luong", "cgru")
TOOLKITS: tuple[str, ...] = ("native", "opennmt-py", "joeynmt", "marian", "huggingface")
# The toolkits whose beam narrows by its finished hypotheses (OpenNMT-py's, Joey NMT's and
# Marian's searches); ours and transformers' generate keep the beam full (service/decode/search/beam.py).
NARROWING_TOOLKITS: tuple[str, ...] = ("opennmt-py", "joeynmt", "marian")
# The toolkits whose decoders are conditional (cGRU): ours, and Marian's s2s.
CONDITIONAL_TOOLKITS: tuple[str, ...] = ("native", "marian")

# Special ids are fixed across every model: the tokenizer is trained to use them.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# names the decoder's graph contract gives its own inputs (service/model/graph_contract.py)
CONTRACT_NAMES = ("tokens", "state", "reorder", "values", "keys", "mask", "k", "positions")


Size = TypeVar("Size", int, None)  # an axis's length, or None where it is dynamic


@dataclass(frozen=True)
class StateSpec:
    """A decoder state tensor besides the encoder's `state`, declared by the bundle's manifest
    (`architecture.decoder_states`): its hypothesis axis is 0, its shape (R, width), or with
    `growing` (R, L, width) with one entry a decoded token along axis -2 (a Transformer layer's
    self-attention keys or values), or with `heads` too (R, heads, L, width / heads): each head's
    entries side by side, as ONNX Runtime's fused attention reads them. The decoder step reads it
    as input `name` and writes it as output `new_<name>`, reordered by the back-pointers as `state`
    is; a joining sentence's starts at zeros (a growing one's holds no entry of its own: its step
    reads `positions`)."""

    name: str
    width: int
    growing: bool = False
    heads: int = 0

    def shape(self, rows: Size, entries: Size) -> tuple[Size | int, ...]:
        """The tensor's shape for `rows` rows of `entries` entries each (None: a dynamic axis)."""
        if self.heads:
            return (rows, self.heads, entries, self.width // self.heads)
        return (rows, entries, self.width) if self.growing else (rows, self.width)

    @property
    def length_axis(self) -> int:
        """Where a growing tensor's entries lie, counted from the front (-2 from the back)."""
        return len(self.shape(0, 0)) - 2

    def problems(self) -> list[str]:
        out = []
        if not self.name.isidentifier() or self.name in CONTRACT_NAMES:
            out.append(f"decoder state name {self.name!r} is not a free identifier")
        if self.width < 1:
            out.append(f"decoder state {self.name!r} needs a width >= 1")
        if self.heads and (not self.growing or self.heads < 0 or self.width % self.heads):
            out.append(
                f"decoder state {self.name!r}: heads {self.heads} need a growing state whose "
                f"width {self.width} they divide"
            )
        return out


ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "swish")
POSITIONS: tuple[str, ...] = (
    "sinusoidal_halves",
    "sinusoidal_marian",
    "sinusoidal_interleaved",
    "learned",
)


@dataclass(frozen=True)
class TransformerShape:
    """A Transformer encoder-decoder's shape, as its graphs were built (export/transformer/).

    Serving reads only what the graph contract needs of it (the width of the cross-attention keys
    and values the encoder hands the decoder: `dec_layers * d_model`); the rest records the
    equations the importer rebuilt, so that a bundle says what it is. `positions`:
    "sinusoidal_halves" (sines then cosines, Hugging Face's Marian), "sinusoidal_marian" (Marian's
    own timescales, OpenNMT-py's SinusoidalConcat), "sinusoidal_interleaved" (sines and cosines
    alternating, OpenNMT-py's default), "learned" (a table). `norm_eps`: the layer norms' epsilon. `align_layer`/`align_heads`: which decoder
    layer's cross-attention the graphs return as the alignment, and which of its heads are averaged
    (empty: all). `fused_attention`: the decoder step attends with ONNX Runtime's MultiHeadAttention
    kernel over caches kept head by head (R, heads, L, d_model / heads); a bundle built before it
    (its manifest without the key) attends with plain ops over caches (R, L, d_model)."""

    d_model: int
    heads: int
    ffn_dim: int
    enc_layers: int
    dec_layers: int
    activation: str = "relu"
    pre_norm: bool = False
    positions: str = "sinusoidal_halves"
    scale_embedding: bool = True
    align_layer: int = -1
    align_heads: tuple[int, ...] = ()
    norm_eps: float = 1e-5
    fused_attention: bool = True

    def problems(self) -> list[str]:
        out: list[str] = []
        for name in ("d_model", "heads", "ffn_dim", "enc_layers", "dec_layers"):
            if getattr(self, name) < 1:
                out.append(f"transformer {name} must be >= 1")
        if self.heads >= 1 and self.d_model % self.heads:
            out.append(
                f"transformer d_model {self.d_model} is not a multiple of heads {self.heads}"
            )
        if self.activation not in ACTIVATIONS:
            out.append(
                f"transformer activation must be one of {ACTIVATIONS}, got {self.activation!r}"
            )
        if self.positions not in POSITIONS:
            out.append(f"transformer positions must be one of {POSITIONS}, got {self.positions!r}")
        if not -self.dec_layers <= self.align_layer < self.dec_layers:
            out.append(
                f"align_layer {self.align_layer} is not one of {self.dec_layers} decoder layers"
            )
        if any(not 0 <= h < self.heads for h in self.align_heads):
            out.append(f"align_heads {list(self.align_heads)} are not among {self.heads} heads")
        return out


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of an RNN encoder-decoder with attention.

    attention="none" is the fixed-context encoder-decoder (Cho et al. 2014): the encoder's summary
    enters every decoder step and there is no alignment; decoder_style is then ignored.

    decoder_style says when attention is queried: "bahdanau" with the previous state s_{t-1}
    (before y_{t-1} is read), "luong" with the new state s_t (input feeding h~), "cgru" (Nematus /
    Marian conditional GRU) with s'_t = RNN1(y_{t-1}, s_{t-1}), after which RNN2 reads the context:
    s_t = RNN2(c_t, s'_t). "cgru" works with GRU and LSTM cells; with dec_layers > 1 RNN2 is a
    stack whose bottom layer starts from s'_t and whose upper layers from their own s_{t-1}.

    toolkit names whose equations the graphs hold: "native" (our trainer, export/train/model.py) or a
    toolkit a checkpoint was imported from (export/importers/: "opennmt-py", "joeynmt", "marian",
    whose s2s decoder is "cgru"); `bridge` and `input_feed` then record that toolkit's options.
    Serving never branches on them but for an imported model's beam rule (the toolkits' beams
    narrow by their finished hypotheses): the graphs carry the equations.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    emb_dim: int = 128
    enc_hidden: int = 128  # per direction; encoder states are enc_out_dim wide
    dec_hidden: int = 256
    enc_layers: int = 1
    dec_layers: int = 1
    rnn: RnnKind = "gru"
    attention: AttentionKind = "additive"
    decoder_style: DecoderStyle = "bahdanau"
    attn_dim: int = 128  # width of the additive/concat scoring layer
    dropout: float = 0.1
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    bidirectional: bool = True  # encoder; False: one direction, states enc_hidden wide
    toolkit: Toolkit = "native"
    bridge: str = "linear_tanh"  # how the decoder's first state comes from the encoder
    input_feed: bool | None = None  # None: Luong style feeds h~ (the native rule)
    # the decoder's state tensors besides `state` (none for the RNNs: StateSpec)
    decoder_states: tuple[StateSpec, ...] = ()
    # a Transformer's shape; None for the RNNs, whose fields above then describe it
    transformer: TransformerShape | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.transformer is not None:
            return out + self.transformer.problems() + self.state_problems()
        if self.rnn not in RNN_KINDS:
            out.append(f"rnn must be one of {RNN_KINDS}, got {self.rnn!r}")
        if self.attention not in ATTENTION_KINDS:
            out.append(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.decoder_style not in DECODER_STYLES:
            out.append(f"decoder_style must be one of {DECODER_STYLES}, got {self.decoder_style!r}")
        for name in ("src_vocab_size", "tgt_vocab_size", "emb_dim", "enc_hidden", "dec_hidden"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1")
        for name in ("enc_layers", "dec_layers", "attn_dim"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1")
        if self.decoder_style == "cgru" and self.input_feed:
            out.append("decoder_style 'cgru' has no input feeding; leave input_feed unset")
        if self.decoder_style == "cgru" and self.toolkit not in CONDITIONAL_TOOLKITS:
            out.append(f"decoder_style 'cgru' is native or marian only, not {self.toolkit!r}")
        if self.toolkit not in TOOLKITS:
            out.append(f"toolkit must be one of {TOOLKITS}, got {self.toolkit!r}")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout must be in [0, 1), got {self.dropout}")
        out += self.state_problems()
        if self.attention in ("dot", "scaled_dot") and self.dec_hidden != self.enc_out_dim:
            out.append(
                f"{self.attention} attention scores s·h directly, so dec_hidden ({self.dec_hidden}) "
                f"must equal {'2 * ' if self.bidirectional else ''}enc_hidden ({self.enc_out_dim}); "
                "use 'general' otherwise"
            )
        return out

    def state_problems(self) -> list[str]:
        out = [problem for spec in self.decoder_states for problem in spec.problems()]
        names = [spec.name for spec in self.decoder_states]
        if len(set(names)) != len(names):
            out.append(f"decoder state names must differ, got {names}")
        return out

    @property
    def enc_out_dim(self) -> int:
        """The width of the encoder's `values`: its states (an RNN), or every decoder layer's
        cross-attention values side by side (a Transformer)."""
        if self.transformer is not None:
            return self.transformer.dec_layers * self.transformer.d_model
        return (2 if self.bidirectional else 1) * self.enc_hidden

    @property
    def input_feeding(self) -> bool:
        """Luong's input feeding: the previous attentional state h~ enters the RNN input."""
        if self.input_feed is not None:
            return self.input_feed
        return self.attention != "none" and self.decoder_style == "luong"

    @property
    def conditional(self) -> bool:
        """The cGRU decoder: read y_{t-1}, attend with that state, then read the context."""
        return self.attention != "none" and self.decoder_style == "cgru"

    @property
    def state_dim(self) -> int:
        """Width of the packed decoder state row: every layer's h (and c for LSTM), then h~; 0 for
        a Transformer, whose state is its declared tensors."""
        if self.transformer is not None:
            return 0
        per_layer = self.dec_hidden * (2 if self.rnn == "lstm" else 1)
        return self.dec_layers * per_layer + (self.dec_hidden if self.input_feeding else 0)

    def to_dict(self) -> dict[str, Any]:
        """Every field, `decoder_states` only where there are some: a checkpoint's config, the
        ModelInfo's architecture_json and a format-1 manifest's `architecture` (format 2 writes
        the family's fields of it: service/model/manifest.py)."""
        data = asdict(self)
        states = [
            {k: v for k, v in s.items() if k != "heads" or v} for s in data.pop("decoder_states")
        ]
        if data["transformer"] is None:
            del data["transformer"]
        else:
            data["transformer"]["align_heads"] = list(data["transformer"]["align_heads"])
        return {**data, "decoder_states": list(states)} if states else data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model config keys: {unknown}")
        states = data.get("decoder_states", ())
        if not isinstance(states, list | tuple) or not all(isinstance(s, dict) for s in states):
            raise ValueError(
                "decoder_states must be a list of {name, width, growing, heads} objects"
            )
        shape = data.get("transformer")
        if shape is not None:
            if not isinstance(shape, dict):
                raise ValueError("transformer must be an object of the Transformer's shape")
            unknown = sorted(set(shape) - {f.name for f in fields(TransformerShape)})
            if unknown:
                raise ValueError(f"unknown transformer keys: {unknown}")
            shape = TransformerShape(
                **{
                    "fused_attention": False,  # a manifest written before the fused kernel
                    **shape,
                    "align_heads": tuple(shape.get("align_heads", ())),
                }
            )
        return cls(
            **{
                **data,
                "decoder_states": tuple(StateSpec(**s) for s in states),
                "transformer": shape,
            }
        )

    @property
    def growing_state(self) -> bool:
        """Whether a state tensor grows a step at a time: the step then reads `positions`."""
        return any(spec.growing for spec in self.decoder_states)
