"""Each decoder layer's part of the encoder keys and values as an input of its own
(service/decode/runtime/encoder_layers.py): the rewrite, the cut, the running batch's rows, and engines
that answer as the stacked inputs do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from benchmarks.sample_texts import bundle_texts
from export.onnx.quantize import quantize_decoder
from service.decode.align.aligner import align
from service.decode.engine.engine import Engine
from service.decode.runtime import runtime, step_graph
from service.decode.runtime.device import Device
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.encoder_layers import (
    LayerSlice,
    layer_slices,
    parse_slice,
    split_encoder_inputs,
    split_graph,
)
from service.decode.runtime.encoder_rows import EncoderRows
from service.decode.runtime.row_ops import make_row_ops
from service.decode.runtime.transfers import TransferLedger
from service.decode.shared.config import RuntimeConfig
from tests.conftest import REPO
from tests.test_blocked_topk import hypotheses, translations
from tests.test_runtime import rows_on_host

TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"
CPU = ["CPUExecutionProvider"]


def session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    graph = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(graph, options, providers=CPU)


def test_names_read_back() -> None:
    for part in (LayerSlice("keys", 0, 256, 4), LayerSlice("values", 512, 768)):
        assert parse_slice(part.name) == part
    assert parse_slice("keys") is None and parse_slice("self_k0") is None
    assert layer_slices(["tokens", "values.0:8", "keys.0:8.heads2"]) == (
        LayerSlice("keys", 0, 8, 2),
        LayerSlice("values", 0, 8),
    )


def test_the_transformers_step_reads_its_layers_parts_per_head_where_attention_alone_does() -> None:
    """grc-en-nt-transformer: 3 decoder layers of 256 (4 heads); the first two read their keys
    and values by MultiHeadAttention only (per head), the third (its alignment layer, plain ops
    exposing the weights) as (B, S, 256). No Slice of the stacked inputs is left; they stay
    declared, so the graph's contract holds."""
    model = onnx.load(str(TRANSFORMER / "decoder.onnx"))
    parts = split_encoder_inputs(model)
    assert parts == tuple(
        LayerSlice(source, 256 * layer, 256 * (layer + 1), 4 if layer < 2 else 0)
        for source in ("keys", "values")
        for layer in range(3)
    )
    names = {i.name for i in model.graph.input}
    assert {"keys", "values", "mask"} <= names and {p.name for p in parts} <= names
    assert not [n for n in model.graph.node if n.op_type == "Slice" and n.input[0] in names]
    read = {name for node in model.graph.node for name in node.input}
    assert "keys" not in read and "values" not in read


def test_an_int8_step_keeps_no_stale_shape_of_a_part_now_per_head(tmp_path: Path) -> None:
    """The quantizer's shape inference declares the Shape of each layer's keys (3 entries); read
    per head they have 4, and the rewrite drops those declarations (ONNX Runtime warned of each
    at every load, and fell back to a lenient merge). The int8 step still answers as before."""
    quantized = tmp_path / "decoder.int8.onnx"
    quantize_decoder(TRANSFORMER / "decoder.onnx", quantized)  # as s2s-import --int8 does
    model = onnx.load(str(quantized))
    declared = {info.name for info in model.graph.value_info}
    plain = session(model)
    parts = split_encoder_inputs(model)
    per_head = {p.name for p in parts if p.heads}
    shapes = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Shape"}
    of_parts = {out for out, source in shapes.items() if source in per_head}
    assert of_parts and of_parts <= declared  # the quantizer declared them
    assert not of_parts & {info.name for info in model.graph.value_info}
    feeds = step_inputs(plain, np.random.default_rng(1), B=2, S=5)
    cutter = session(split_graph(parts))
    cut = dict(zip([p.name for p in parts], cutter.run(None, feeds_of(feeds)), strict=True))
    for a, b in zip(
        session(model).run(None, {**feeds, **cut}), plain.run(None, feeds), strict=True
    ):
        assert np.array_equal(a, b)


def feeds_of(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: feeds[name] for name in ("keys", "values")}


def step_inputs(sess: ort.InferenceSession, rng: np.random.Generator, B: int, S: int) -> dict:
    """Random inputs for one decoder step of B sentences, beam 2, 3 cached tokens."""
    N = 2 * B
    feeds: dict[str, np.ndarray] = {
        "tokens": rng.integers(4, 100, N).astype(np.int64),
        "state": np.zeros((N, 0), np.float32),
        "reorder": np.repeat(np.arange(B), 2).astype(np.int64),
        "values": rng.standard_normal((B, S, 768)).astype(np.float32),
        "keys": rng.standard_normal((B, S, 768)).astype(np.float32),
        "mask": np.arange(S)[None, :] < rng.integers(1, S + 1, B)[:, None],
        "positions": np.full(N, 3, np.int64),
    }
    for arg in sess.get_inputs():
        if arg.name == "k":
            feeds["k"] = np.array(3 if not arg.shape else [3], np.int64)
        elif arg.name.startswith("self_"):
            feeds[arg.name] = rng.standard_normal((N, 4, 3, 64)).astype(np.float32)
    return feeds


def test_the_rewritten_step_computes_what_the_stacked_one_does() -> None:
    """The step with its parts cut by `split_graph` from the same rows gives every output
    bit-identical to the step that slices them itself."""
    model = onnx.load(str(TRANSFORMER / "decoder.onnx"))
    plain = session(model)
    parts = split_encoder_inputs(model)
    rewritten, cutter = session(model), session(split_graph(parts))
    feeds = step_inputs(plain, np.random.default_rng(0), B=3, S=7)
    want = plain.run(None, feeds)
    cut = dict(zip([p.name for p in parts], cutter.run(None, feeds_of(feeds)), strict=True))
    got = rewritten.run(None, {**feeds, **cut})
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def echo_session(parts: tuple[LayerSlice, ...]) -> ort.InferenceSession:
    """A graph that reads the stacked rows and the parts, and returns the parts."""
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("values", "keys")
    ]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    inputs += [helper.make_tensor_value_info(p.name, TensorProto.FLOAT, None) for p in parts]
    outputs = [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, None) for i in range(2)]
    nodes = [helper.make_node("Identity", [p.name], [f"out{i}"]) for i, p in enumerate(parts)]
    graph = helper.make_graph(nodes, "echo", inputs, outputs)
    return session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def numpy_parts(values: np.ndarray, keys: np.ndarray) -> list[np.ndarray]:
    """keys[..., 2:6] per head (2 heads), values[..., 0:3]: what `echo_session`'s parts hold."""
    B, S, _ = keys.shape
    per_head = keys[..., 2:6].reshape(B, S, 2, 2).transpose(0, 2, 1, 3)
    return [per_head, values[..., 0:3]]


@pytest.mark.parametrize("row_ops", ["graph", "host"])
def test_the_parts_follow_the_rows_through_a_leave_and_a_join_that_keep_their_count(
    row_ops: str,
) -> None:
    """A sentence leaves and another joins: the count, the buffers and the source axis are as
    before, but the parts a step reads are the new rows' (cut again), in either row-op kind."""
    parts = (LayerSlice("keys", 2, 6, 2), LayerSlice("values", 0, 3))
    device = Device("cpu", 0, TransferLedger())
    cuts: list[tuple[LayerSlice, ...]] = []

    def cutter(wanted: tuple[LayerSlice, ...]) -> ort.InferenceSession:
        cuts.append(wanted)
        return session(split_graph(wanted))

    rows = EncoderRows(make_row_ops(device, CPU, [{}], row_ops), True, cutter=cutter)
    echo, rng = echo_session(parts), np.random.default_rng(3)

    def sentence(length: int) -> EncodedSentence:
        values = rng.standard_normal((length, 5)).astype(np.float32)
        keys = rng.standard_normal((length, 8)).astype(np.float32)
        return EncodedSentence(values, keys, np.zeros(0, np.float32))

    def check() -> tuple[int, ...]:
        binding = echo.io_binding()
        rows.bind(binding, echo)
        binding.bind_output("out0")
        binding.bind_output("out1")
        echo.run_with_iobinding(binding)
        values, keys, _ = rows_on_host(rows)
        got = [out.numpy() for out in binding.get_outputs()]
        for a, b in zip(got, numpy_parts(values[: rows.count], keys[: rows.count]), strict=True):
            assert np.array_equal(a, b)
        return rows.binding_key()

    # the graph row ops cut every row at each change of the rows; the host ones (the CPU's)
    # keep the parts row by row (HostLayerRows): cut as rows join, never by the cutter's graph
    graph_cuts = row_ops == "graph"
    rows.append([sentence(4), sentence(6)])
    before = check()
    assert check() == before and len(cuts) == graph_cuts  # unchanged rows: cut once at most
    rows.keep(np.array([1]))
    rows.append([sentence(5)])
    after = check()
    assert rows.count == 2 and after != before and len(cuts) == 2 * graph_cuts
    rows.append([sentence(9), sentence(3)])  # the source axis grows: the parts are refitted
    check()
    rows.keep(np.array([3, 0]))  # the 3-long and the 6-long: 6 > 9 / 2, S stays
    check()
    rows.keep(np.array([0]))  # the 3-long alone: S refitted to 3
    assert rows.source_len == 3
    check()


@pytest.mark.parametrize("search", ["host", "device"])
def test_an_engine_answers_the_same_with_the_parts_as_inputs(
    search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grc-en-nt-transformer on the CPU, in either search, with a prefix, and Align: every
    hypothesis the same, to the last bit, as when its step slices the stacked inputs itself."""
    texts = bundle_texts(TRANSFORMER)[:8]
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search=search)
    with_parts = Engine.load(TRANSFORMER, config)
    assert layer_slices(i.name for i in with_parts.model.decoder.get_inputs())
    first_words = " ".join(with_parts.translate(texts[:1])[0].hypotheses[0].text.split()[:2])
    cases = [({}, texts), ({"target_prefix": (first_words,)}, texts[:1])]
    got = [hypotheses(translations(with_parts, some, **changes)) for changes, some in cases]
    pairs = [(text, with_parts.translate([text])[0].hypotheses[0].text) for text in texts[:3]]
    got_aligned = [repr(pair) for pair in align(with_parts, pairs)]
    if search == "device":
        sessions = with_parts.model.search_sessions.values()
        assert sessions and all(layer_slices(i.name for i in s.get_inputs()) for s in sessions)

    for module in (runtime, step_graph):  # the step's graph (step_graph) and the search's
        monkeypatch.setattr(module, "split_encoder_inputs", lambda model: ())
    stacked = Engine.load(TRANSFORMER, config)
    assert not layer_slices(i.name for i in stacked.model.decoder.get_inputs())
    want = [hypotheses(translations(stacked, some, **changes)) for changes, some in cases]
    assert got == want
    assert [repr(pair) for pair in align(stacked, pairs)] == got_aligned
