"""A model that costs nothing: an encoder and a decoder step that meet the bundle contract
(service/model/graph_contract.py) and do almost no arithmetic, so that what a decode step costs
through the real engine, runtime and search is the host's part of it.

    from benchmarks.decoding.instant import build_instant_bundle
    bundle = build_instant_bundle(Path("/tmp/instant"))       # → the bundle's directory
    engine = Engine.load(bundle)

- **Tokenizers**: word vocabularies (`"tokenizer": {"kind": "word"}`), the four specials then
  `w4 … w{V-1}`: any text of those words reads; `instant_text(n, seed)` writes one of n words.
- **Encoder**: values (B, S, 2) zeros; keys (B, S, 1) the mask over the sentence's length (the
  fixed attention: 1/len on each real position); the initial state (B, 2) is (L, 0), where L, the
  tokens the sentence translates to, is written by its first two words (`instant_text(L, seed)`
  makes such a source; `target_length` reads it back).
- **Decoder step**: the state follows the back-pointers and counts the steps; the log-probs are a
  fixed random table's row for the previous token, the end of sentence last until the step passes
  L and first from then on, so each sentence ends after its own L tokens (varied lengths: sentences
  leave at different steps); the top k is read from the table's rows stored sorted (no TopK:
  `decoder_graph` says why); the attention is the fixed one.

A step at 1,280 hypotheses costs a few microseconds of ONNX Runtime's time: the rest of a step is
the search, the bindings and the Python around them (benchmarks/decoding/search_host.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from service.model.architecture import EOS_ID, ModelConfig
from service.model.bundle import write_manifest

OPSET = 17
VOCAB = 64  # source and target words, the 4 specials included
FIRST_WORD = 4  # the first id after the specials
WORDS = VOCAB - FIRST_WORD  # the source's first two words write L in base WORDS
EOS_LOGIT = 20.0  # the end of sentence's logit: -this before step L, +this from L on
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def instant_config() -> ModelConfig:
    """The manifest's architecture: sizes the graphs' shapes agree with (enc_out_dim 2, state 2)."""
    return ModelConfig(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        emb_dim=1,
        enc_hidden=1,
        dec_hidden=2,
        attn_dim=1,
        dropout=0.0,
    )


def _const(name: str, values: np.ndarray) -> onnx.TensorProto:
    return helper.make_tensor(
        name, helper.np_dtype_to_tensor_dtype(values.dtype), values.shape, values.ravel().tolist()
    )


def _model(nodes: list, inputs: list, outputs: list, inits: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def encoder_graph() -> onnx.ModelProto:
    """src (B, S) int64, src_lengths (B,) → values (B, S, 2), keys (B, S, 1), mask (B, S),
    state (B, 2) = (L, 0)."""
    n = helper.make_node
    nodes = [
        n("Shape", ["src"], ["src_shape"]),  # (2,) B, S
        n("Gather", ["src_shape", "one"], ["S"], axis=0),  # () S
        n("Range", ["zero", "S", "one"], ["positions"]),  # (S,)
        n("Unsqueeze", ["src_lengths", "axis1"], ["lengths_col"]),  # (B, 1)
        n("Less", ["positions", "lengths_col"], ["mask"]),  # (B, S) bool
        n("Cast", ["mask"], ["mask_f"], to=FLOAT),  # (B, S)
        n("Cast", ["lengths_col"], ["lengths_f"], to=FLOAT),  # (B, 1)
        n("Div", ["mask_f", "lengths_f"], ["fixed"]),  # (B, S) 1/len on real positions
        n("Unsqueeze", ["fixed", "axis2"], ["keys"]),  # (B, S, 1)
        n("Concat", ["src_shape", "two"], ["values_shape"], axis=0),  # (3,) B, S, 2
        n("ConstantOfShape", ["values_shape"], ["values"]),  # (B, S, 2) zeros
        # L = (src[:, 0] - 4) · WORDS + (src[:, 1] - 4) + 1: the first two words say it
        n("Slice", ["src", "zero_1", "two", "axis1"], ["code"]),  # (B, 2)
        n("Sub", ["code", "first_word"], ["digits"]),  # (B, 2)
        n("MatMul", ["digits", "place"], ["target_len_0"]),  # (B, 1)
        n("Add", ["target_len_0", "one_1"], ["target_len"]),  # (B, 1)
        n("Cast", ["target_len"], ["target_len_f"], to=FLOAT),  # (B, 1)
        n("Mul", ["target_len_f", "zero_f"], ["zeros_col"]),  # (B, 1)
        n("Concat", ["target_len_f", "zeros_col"], ["state"], axis=1),  # (B, 2) (L, 0)
    ]
    inits = [
        _const("zero", np.array(0, np.int64)),
        _const("one", np.array(1, np.int64)),
        _const("two", np.array([2], np.int64)),
        _const("axis1", np.array([1], np.int64)),
        _const("axis2", np.array([2], np.int64)),
        _const("zero_1", np.array([0], np.int64)),
        _const("one_1", np.array([[1]], np.int64)),
        _const("first_word", np.array([[FIRST_WORD, FIRST_WORD]], np.int64)),
        _const("place", np.array([[WORDS], [1]], np.int64)),
        _const("zero_f", np.array(0.0, np.float32)),
    ]
    vi = helper.make_tensor_value_info
    return _model(
        nodes,
        [vi("src", INT64, ["B", "S"]), vi("src_lengths", INT64, ["B"])],
        [
            vi("values", FLOAT, ["B", "S", 2]),
            vi("keys", FLOAT, ["B", "S", 1]),
            vi("mask", BOOL, ["B", "S"]),
            vi("state", FLOAT, ["B", 2]),
        ],
        inits,
        "instant_encoder",
    )


def _sorted_tables(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's whole model: log-probs (2V, V) float32 and their token ids (2V, V) int64, one row
    per previous token, sorted best first. Rows 0..V-1: before the sentence's step L (the end of
    sentence at -EOS_LOGIT: last of the words); rows V..2V-1: past it (at +EOS_LOGIT: first)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 1.0, (VOCAB, VOCAB))  # (V, V) next-token logits by previous token
    logits[:, :EOS_ID] = -30.0  # never pad or BOS
    tables, ids = [], []
    for eos_logit in (-EOS_LOGIT, EOS_LOGIT):
        row = logits.copy()
        row[:, EOS_ID] = eos_logit
        order = np.argsort(-row, axis=1, kind="stable")  # (V, V)
        values = np.take_along_axis(row, order, axis=1)
        lse = np.log(np.exp(values).sum(axis=1, keepdims=True))  # (V, 1)
        tables.append(values - lse)  # log-softmax
        ids.append(order)
    table = np.concatenate(tables).astype(np.float32)  # (2V, V)
    table_ids = np.concatenate(ids).astype(np.int64)  # (2V, V)
    return table, table_ids


def _top_k_nodes() -> list[onnx.NodeProto]:
    """state (R, 2) (L, step) followed by `reorder`, one step on; the table's row by the previous
    token and whether step L is past; its first k entries: log_probs, token_ids (N, k)."""
    n = helper.make_node
    return [
        n("Gather", ["state", "reorder"], ["followed"], axis=0),  # (N, 2)
        n("Split", ["followed"], ["target_len", "last_step"], axis=1),  # (N, 1) each
        # (N, 1) + (1, 1): ONNX Runtime's CPU kernel broadcasts a 0-d scalar over a (N, 1) column
        # a row at a time (34 µs at 5,120 rows), a (1, 1) one in one call (0.6)
        n("Add", ["last_step", "one_f"], ["step"]),
        n("Concat", ["target_len", "step"], ["new_state"], axis=1),  # (N, 2) (L, step)
        n("Greater", ["step", "target_len"], ["ends"]),  # (N, 1) the end of sentence first
        n("Cast", ["ends"], ["ends_i"], to=INT64),  # (N, 1)
        n("Reshape", ["ends_i", "flat"], ["ends_flat"]),  # (N,)
        n("Mul", ["ends_flat", "vocab"], ["offset"]),  # (N,)
        n("Add", ["tokens", "offset"], ["row"]),  # (N,) the table's row
        n("Reshape", ["k", "one"], ["k1"]),  # (1,)
        n("Slice", ["table", "zero", "k1", "one"], ["top"]),  # (2V, k)
        n("Slice", ["ids", "zero", "k1", "one"], ["top_ids"]),  # (2V, k)
        n("Gather", ["top", "row"], ["log_probs"], axis=0),  # (N, k)
        n("Gather", ["top_ids", "row"], ["token_ids"], axis=0),  # (N, k)
    ]


def _attention_nodes() -> list[onnx.NodeProto]:
    """The fixed attention (N, S): each hypothesis reads its sentence's row of keys."""
    n = helper.make_node
    return [
        n("Shape", ["tokens"], ["N"]),  # (1,)
        n("Shape", ["mask"], ["mask_shape"]),  # (2,) B, S
        n("Split", ["mask_shape"], ["B", "S"], axis=0),  # (1,) each
        n("Div", ["N", "B"], ["K"]),  # (1,)
        n("Concat", ["B", "K", "S"], ["expanded_shape"], axis=0),  # (3,)
        n("Concat", ["N", "S"], ["attention_shape"], axis=0),  # (2,)
        n("Transpose", ["keys"], ["keys_t"], perm=[0, 2, 1]),  # (B, 1, S)
        n("Expand", ["keys_t", "expanded_shape"], ["expanded"]),  # (B, K, S)
        n("Reshape", ["expanded", "attention_shape"], ["attention"]),  # (N, S)
    ]


def decoder_graph(seed: int = 0) -> onnx.ModelProto:
    """tokens (N,), state (R, 2), reorder (N,), values, keys (B, S, 1), mask (B, S), k () →
    log_probs (N, k), token_ids (N, k), new_state (N, 2), attention (N, S).

    The top k needs no sort: each previous token's row of the table is stored sorted (the end of
    sentence left out), and the end of sentence is either last (before the sentence's step L: its
    logit -EOS_LOGIT) or first (past step L: +EOS_LOGIT). A TopK over the vocabulary would
    cost ~0.2 µs a row in ONNX Runtime's CPU kernel (a heap per row), 250 µs a step at 1,280
    hypotheses: more than the search this model is for measuring."""
    table, table_ids = _sorted_tables(seed)
    nodes = [*_top_k_nodes(), *_attention_nodes()]
    inits = [
        _const("table", table),
        _const("ids", table_ids),
        _const("vocab", np.array(VOCAB, np.int64)),
        _const("one_f", np.array([[1.0]], np.float32)),
        _const("flat", np.array([-1], np.int64)),
        _const("zero", np.array([0], np.int64)),
        _const("one", np.array([1], np.int64)),
    ]
    vi = helper.make_tensor_value_info
    return _model(
        nodes,
        [
            vi("tokens", INT64, ["N"]),
            vi("state", FLOAT, ["R", 2]),
            vi("reorder", INT64, ["N"]),
            vi("values", FLOAT, ["B", "S", 2]),
            vi("keys", FLOAT, ["B", "S", 1]),
            vi("mask", BOOL, ["B", "S"]),
            vi("k", INT64, []),
        ],
        [
            vi("log_probs", FLOAT, ["N", "k"]),
            vi("token_ids", INT64, ["N", "k"]),
            vi("new_state", FLOAT, ["N", 2]),
            vi("attention", FLOAT, ["N", "S"]),
        ],
        inits,
        "instant_decoder_step",
    )


def _vocabulary() -> str:
    return "\n".join(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]) + "\n"


def build_instant_bundle(path: Path, seed: int = 0) -> Path:
    """Write the instant bundle into `path` (made if missing); returns `path`. `seed` draws its
    table of log-probs. Loads with
    `service.model.bundle.load_bundle` and `Engine.load` like any bundle."""
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(encoder_graph(), str(path / "encoder.onnx"))
    onnx.save(decoder_graph(seed), str(path / "decoder.onnx"))
    (path / "source.vocab").write_text(_vocabulary(), encoding="utf-8")
    (path / "target.vocab").write_text(_vocabulary(), encoding="utf-8")
    tokenizer = {
        "kind": "word",
        "toolkit": "native",
        "source": {"file": "source.vocab", "lowercase": False, "append_eos": False},
        "target": {"file": "target.vocab", "lowercase": False},
    }
    info = {"instant": "benchmarks/decoding/instant.py: costs nothing, translates nothing"}
    write_manifest(path, "instant", "0", instant_config().to_dict(), info=info, tokenizer=tokenizer)
    return path


def target_length(ids: list[int]) -> int:
    """The tokens a sentence of source ids translates to (its end of sentence then comes first)."""
    return (ids[0] - FIRST_WORD) * WORDS + (ids[1] - FIRST_WORD) + 1


def instant_ids(length: int, seed: int, words: int = 6) -> list[int]:
    """A source of `words` word ids (at least 2; no specials) that translates to `length` tokens
    (1 to WORDS², the first two words saying it), the others random."""
    if not 1 <= length <= WORDS * WORDS or words < 2:
        raise ValueError(f"length must be in [1, {WORDS * WORDS}] and words >= 2")
    high, low = divmod(length - 1, WORDS)
    rng = np.random.default_rng(seed)
    rest = rng.integers(FIRST_WORD, VOCAB, size=words - 2).tolist()
    return [FIRST_WORD + high, FIRST_WORD + low, *rest]


def instant_text(length: int, seed: int, words: int = 6) -> str:
    """`instant_ids` as the text the word tokenizer reads back to those ids."""
    return " ".join(f"w{i}" for i in instant_ids(length, seed, words))
