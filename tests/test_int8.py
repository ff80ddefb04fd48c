"""int8 decoder graphs whose answers do not depend on the CPU (service/model/int8.py,
export/onnx/quantize.py): the kernel sums 7-bit weights exactly on this host, full-range ones clip
exactly where the host has no VNNI, the bundles' graphs are 7-bit, and an old graph is reported
once at load where it would clip."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.onnx.quantize import SCHEMES, quantize_decoder, requantize_bundle
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.model import int8
from tests.conftest import REPO, TinyModel

K, N = 64, 16  # a product's depth and width: many uint8 x int8 pairs to a sum


def integer_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Runtime's MatMulInteger of uint8 `a` (M, K) by the constant int8 weight `b` (K, N), zero
    points 0: the kernel a quantized decoder's products run on."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "product",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", N])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"a": a})[0])


def worst_case(limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Activations at 255 and weights at +-limit, every pair of a sum the same sign: the largest
    16-bit pair sums a kernel can meet (and a few random rows)."""
    rng = np.random.default_rng(0)
    a = np.vstack([np.full((4, K), 255, np.uint8), rng.integers(0, 256, (4, K), dtype=np.uint8)])
    signs = np.where(np.arange(N) % 2 == 0, 1, -1)
    b = np.tile(signs * limit, (K, 1)).astype(np.int8)  # (K, N)
    b[:, -4:] = rng.integers(-limit, limit + 1, (K, 4))
    return a, b


def test_the_kernel_sums_seven_bit_weights_exactly() -> None:
    """The bundles' weights (|w| <= 64) against exact integer arithmetic on this host: equal, as
    they are on every CPU (255 x 64 x 2 fits a 16-bit pair sum)."""
    a, b = worst_case(int8.SAFE_WEIGHT)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(integer_product(a, b), exact)


def test_full_range_weights_clip_exactly_where_the_host_has_no_vnni() -> None:
    """Weights at 127 (the old scheme): the host's answer equals exact arithmetic where it sums in
    32 bits (VNNI, or not x86-64) and clips where it does not: what `host_sums_int8_exactly` tells
    the load-time warning."""
    a, b = worst_case(127)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    got = integer_product(a, b)
    if int8.host_sums_int8_exactly() is False:
        assert not np.array_equal(got, exact)
        assert np.abs(got[:4, :-4]).max() < np.abs(exact[:4, :-4]).max()  # the sums were clipped
    else:
        assert np.array_equal(got, exact)


def test_committed_int8_graphs_keep_within_seven_bits() -> None:
    graphs = sorted((REPO / "models").glob("*/decoder.int8.onnx"))
    assert len(graphs) >= 2
    for path in graphs:
        assert int8.saturating_weights(int8.onnx.load(str(path))) == [], path


def test_schemes_make_the_weights_they_say(tiny: TinyModel, tmp_path: Path) -> None:
    """The default scheme keeps every weight within 7 bits; the old one reaches 127 (its largest
    weight of each matrix is 127 by construction), and u8 weights are not int8 at all."""
    made = {
        scheme: quantize_decoder(tiny.bundle / "decoder.onnx", tmp_path / f"{scheme}.onnx", scheme)
        for scheme in SCHEMES
    }
    products = [
        n for n in int8.onnx.load(str(made["s8-channel-7bit"])).graph.node
        if n.op_type in int8.INTEGER_PRODUCTS
    ]  # fmt: skip
    assert products  # the step's products were quantized
    assert int8.saturating_weights(int8.onnx.load(str(made["s8-channel-7bit"]))) == []
    assert int8.saturating_weights(int8.onnx.load(str(made["u8-channel"]))) == []
    old = int8.saturating_weights(int8.onnx.load(str(made["s8-tensor-8bit"])))
    assert len(old) == len(products)
    with pytest.raises(ValueError, match=r"unknown int8 scheme 'int4'.*s8-channel-7bit"):
        quantize_decoder(tiny.bundle / "decoder.onnx", tmp_path / "x.onnx", "int4")


@pytest.fixture
def old_bundle(tiny: TinyModel, tmp_path: Path) -> Path:
    """The tiny bundle with its int8 graph made the old way (full-range weights)."""
    bundle = tmp_path / "old"
    shutil.copytree(tiny.bundle, bundle)
    requantize_bundle(bundle, "s8-tensor-8bit")
    return bundle


def test_an_old_graph_is_named_with_its_remedy_where_it_would_clip(
    old_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = old_bundle / "decoder.int8.onnx"
    message = int8.saturation_risk(graph, exact_host=False)
    assert message is not None
    assert str(graph) in message and "no VNNI" in message
    assert f"python -m export.onnx.quantize {old_bundle}" in message
    monkeypatch.setattr(int8, "host_sums_int8_exactly", lambda: None)  # no /proc/cpuinfo
    assert "unknown" in (int8.saturation_risk(graph) or "")
    assert int8.saturation_risk(graph, exact_host=True) is None
    requantize_bundle(old_bundle)
    assert int8.saturation_risk(graph, exact_host=False) is None


def test_the_engine_reports_an_old_graph_once_at_load(
    old_bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(int8, "host_sums_int8_exactly", lambda: False)
    monkeypatch.setattr(int8, "_warned", set())
    runtime = RuntimeConfig(providers=("CPUExecutionProvider",), int8_decoder=True)
    with caplog.at_level(logging.WARNING, logger=int8.__name__):
        for _ in range(2):
            Engine.load(old_bundle, runtime).translate(["one two"])
        Engine.load(old_bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))  # fp32: no
    warnings = [r for r in caplog.records if r.name == int8.__name__]
    assert len(warnings) == 1
    assert "saturate" in warnings[0].getMessage()
