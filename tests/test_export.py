"""ONNX export: the graphs pass the checker and ONNX Runtime matches PyTorch for every variant."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.onnx.to_onnx import export_graphs, max_abs_diff, with_folded_embeddings
from export.train.model import Seq2Seq
from service.model.architecture import ModelConfig
from service.model.graph_contract import check_graph

# fp32 through different kernels (ONNX Runtime's GRU/LSTM vs PyTorch's): observed ~1e-6.
TOLERANCE = 1e-4

VARIANTS = [
    (rnn, attention, style)
    for rnn, attention, style in itertools.product(
        ("gru", "lstm"),
        ("additive", "dot", "general", "concat", "scaled_dot", "none"),
        ("bahdanau", "luong", "cgru"),
    )
    if not (attention == "none" and style != "bahdanau")  # style is ignored without attention
]


def tiny_model(rnn: str, attention: str, style: str, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        src_vocab_size=23,
        tgt_vocab_size=29,
        emb_dim=8,
        enc_hidden=6,
        dec_hidden=12,
        attn_dim=7,
        enc_layers=2 if rnn == "lstm" else 1,
        dec_layers=2 if style == "luong" or (style, rnn) == ("cgru", "lstm") else 1,
        rnn=rnn,  # type: ignore[arg-type]
        attention=attention,  # type: ignore[arg-type]
        decoder_style=style,  # type: ignore[arg-type]
    )
    return Seq2Seq(cfg).eval()


def random_batch(
    rng: np.random.Generator, lengths: list[int], vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    S = max(lengths)
    src = np.zeros((len(lengths), S), dtype=np.int64)  # (B, S) PAD = 0
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(4, vocab, size=n)
    return src, np.array(lengths, dtype=np.int64)


@pytest.mark.parametrize(("rnn", "attention", "style"), VARIANTS)
def test_onnx_runtime_matches_pytorch(tmp_path: Path, rnn: str, attention: str, style: str) -> None:
    model = tiny_model(rnn, attention, style)
    encoder_path, decoder_path = export_graphs(model, tmp_path)
    encoder = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(decoder_path), providers=["CPUExecutionProvider"])
    for path, role, session in (
        (encoder_path, "encoder", encoder),
        (decoder_path, "decoder", decoder),
    ):
        # every variant keeps the runtime's graph contract (no false alarm at bundle load)
        check_graph(path, role, session.get_inputs(), session.get_outputs(), model.cfg)
    rng = np.random.default_rng(1)
    # batch sizes 1..4, lengths 1 and the longest (17) included, several beam widths
    for lengths, K in (([1], 1), ([17, 1, 9], 3), ([5, 5, 2, 17], 2), ([3], 5)):
        src, src_len = random_batch(rng, lengths, model.cfg.src_vocab_size)
        with torch.no_grad():
            ref = model.encode(torch.from_numpy(src), torch.from_numpy(src_len))
        values, keys, mask, state = encoder.run(None, {"src": src, "src_lengths": src_len})
        assert max_abs_diff(values, ref.values.numpy()) < TOLERANCE
        assert max_abs_diff(keys, ref.keys.numpy()) < TOLERANCE
        assert max_abs_diff(state, ref.state.numpy()) < TOLERANCE
        assert np.array_equal(mask, ref.mask.numpy())

        B = len(lengths)
        N = B * K
        reorder = rng.integers(0, B, size=N).astype(np.int64)  # (N,) any row may continue any row
        tokens = rng.integers(0, model.cfg.tgt_vocab_size, size=N).astype(np.int64)
        k = np.array(min(K + 1, model.cfg.tgt_vocab_size), dtype=np.int64)
        lp, ids, new_state, attn = decoder.run(
            None,
            {
                "tokens": tokens,
                "state": state,
                "reorder": reorder,
                "values": values,
                "keys": keys,
                "mask": mask,
                "k": k,
            },
        )
        with torch.no_grad():
            logits, ref_state, ref_attn = model.decode_step(
                torch.from_numpy(tokens),
                ref.state[torch.from_numpy(reorder)],
                ref.keys,
                ref.values,
                ref.mask,
            )
            ref_lp, ref_ids = torch.topk(torch.log_softmax(logits, -1), int(k), dim=-1)
        assert lp.shape == (N, int(k)) and attn.shape == (N, src.shape[1])
        assert max_abs_diff(lp, ref_lp.numpy()) < TOLERANCE
        assert np.array_equal(ids, ref_ids.numpy())
        assert max_abs_diff(new_state, ref_state.numpy()) < TOLERANCE
        assert max_abs_diff(attn, ref_attn.numpy()) < TOLERANCE
        if attention != "none":  # rows sum to 1, padding gets exactly 0
            assert np.allclose(attn.sum(-1), 1.0, atol=1e-5)
            pad = ~np.repeat(mask, K, axis=0)
            assert np.all(attn[pad] == 0.0)


def test_encoder_is_batch_invariant(tmp_path: Path) -> None:
    """A sentence encoded alone equals the same sentence inside a padded batch (packed sequences)."""
    model = tiny_model("gru", "additive", "bahdanau")
    encoder_path, _ = export_graphs(model, tmp_path)
    encoder = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    src, src_len = random_batch(rng, [4, 11, 2], model.cfg.src_vocab_size)
    batch = encoder.run(None, {"src": src, "src_lengths": src_len})
    alone = encoder.run(None, {"src": src[:1, :4], "src_lengths": src_len[:1]})
    assert max_abs_diff(batch[0][0, :4], alone[0][0]) < 1e-6
    assert max_abs_diff(batch[3][0], alone[3][0]) < 1e-6


def random_step_inputs(model: Seq2Seq, B: int, K: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A decoder step's inputs for B sentences of K hypotheses: random tokens and states."""
    rng = np.random.default_rng(seed)
    src, src_len = random_batch(
        rng, [int(n) for n in rng.integers(1, 12, B)], model.cfg.src_vocab_size
    )
    with torch.no_grad():
        enc = model.encode(torch.from_numpy(src), torch.from_numpy(src_len))
    tokens = torch.from_numpy(rng.integers(0, model.cfg.tgt_vocab_size, B * K))
    state = torch.from_numpy(rng.standard_normal((B * K, enc.state.shape[1])).astype(np.float32))
    return tokens, state, enc.keys, enc.values, enc.mask


@pytest.mark.parametrize(("rnn", "attention", "style"), VARIANTS)
def test_folded_embeddings_give_the_same_step(rnn: str, attention: str, style: str) -> None:
    """The exporter's copy with the target embedding folded into the products it enters computes
    the same step as the model, and the model itself is left unfolded."""
    model = tiny_model(rnn, attention, style, seed=4)
    folded = cast(Seq2Seq, with_folded_embeddings(model))
    assert folded is not model and getattr(folded, "folded", None) is not None
    assert model.folded is None
    inputs = random_step_inputs(model, B=3, K=2, seed=5)
    with torch.no_grad():
        expected = model.decode_step(*inputs)
        got = folded.decode_step(*inputs)
    for a, b in zip(got, expected, strict=True):
        assert max_abs_diff(a.numpy(), b.numpy()) < 1e-5


def constant_shapes(path: Path) -> list[tuple[int, ...]]:
    """The shapes of a graph's initializers and Constant nodes' tensors."""
    graph = onnx.load(str(path)).graph
    shapes = [tuple(t.dims) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            shapes += [tuple(a.t.dims) for a in node.attribute if a.name == "value"]
    return shapes


@pytest.mark.parametrize(("rnn", "gates"), [("gru", 3), ("lstm", 4)])
def test_exported_step_looks_up_folded_tables(tmp_path: Path, rnn: str, gates: int) -> None:
    """The decoder graph holds a (V, G*H) table in place of the (V, E) embedding, unless the tables
    would pass the size limit."""
    model = tiny_model(rnn, "additive", "bahdanau")
    cfg = model.cfg
    (tmp_path / "folded").mkdir()
    (tmp_path / "unfolded").mkdir()
    _, decoder = export_graphs(model, tmp_path / "folded")
    shapes = constant_shapes(decoder)
    assert (cfg.tgt_vocab_size, gates * cfg.dec_hidden) in shapes
    assert (cfg.tgt_vocab_size, cfg.emb_dim) not in shapes
    _, decoder = export_graphs(model, tmp_path / "unfolded", fold_limit_bytes=0)
    assert (cfg.tgt_vocab_size, cfg.emb_dim) in constant_shapes(decoder)


def products_of_computed_weights(path: Path) -> list[str]:
    """MatMul/Gemm nodes one of whose inputs is computed from constants alone at run time (a
    sliced or transposed weight): the int8 export cannot quantize those, only initializers."""
    graph = onnx.load(str(path)).graph
    constant = {t.name for t in graph.initializer}
    initializers = set(constant)
    for node in graph.node:
        if node.op_type == "Constant" or (node.input and all(i in constant for i in node.input)):
            constant.update(node.output)
    return [
        node.name
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm")
        and any(i in constant and i not in initializers for i in node.input)
    ]


@pytest.mark.parametrize(("rnn", "attention", "style"), [v for v in VARIANTS if v[1] != "concat"])
def test_every_weight_of_the_step_is_an_initializer(
    tmp_path: Path, rnn: str, attention: str, style: str
) -> None:
    """The folded step multiplies by stored weights only, so --int8 quantizes all of them
    (concat attention's query half is still sliced at run time)."""
    _, decoder = export_graphs(tiny_model(rnn, attention, style), tmp_path)
    assert products_of_computed_weights(decoder) == []
