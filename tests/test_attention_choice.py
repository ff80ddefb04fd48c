"""Align by a chosen layer and head of a Transformer's cross-attention (AlignOptions.attention_layer
and attention_head; service/decode/runtime/attention_choice.py), on the embedded Greek→English Transformer
(3 decoder layers of 4 heads, its alignment layer 2's head 0): the choice of the bundle's own
alignment gives its own matrices, each head's rows are distributions, a layer's average is the mean
of its heads, the log-probabilities do not move, and what a model cannot give is refused.
tests/test_import_huggingface.py checks every layer and head against transformers'
output_attentions."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.serve.protocol import align_options_to_pb
from tests.conftest import REPO
from tests.test_server import WAIT_S, ServerThread, base_args

TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"
RNN = REPO / "models" / "grc-en-nt"
PAIRS = [
    ("ἐν ἀρχῇ ἦν ὁ λόγος", "In the beginning was the Word"),
    ("καὶ ὁ λόγος ἦν πρὸς τὸν θεόν, καὶ θεὸς ἦν ὁ λόγος.", "and the Word was with God, and the Word was God."),
    ("οὗτος ἦν ἐν ἀρχῇ πρὸς τὸν θεόν.", "He was in the beginning with God."),
]  # fmt: skip


def load(bundle: Path) -> Engine:
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    return Engine.load(bundle, config)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load(TRANSFORMER)


def matrices(engine: Engine, **choice: int) -> list[np.ndarray]:
    aligned = align(engine, PAIRS, AlignOptions(matrices="subword", **choice))  # type: ignore[arg-type]
    out = []
    for pair in aligned:
        assert pair.subword is not None
        out.append(pair.subword.matrix)
    return out


def test_the_bundles_own_layer_and_head_give_its_own_alignment(engine: Engine) -> None:
    shape = engine.bundle.architecture.transformer
    assert shape is not None and shape.align_heads == (0,)
    own = matrices(engine)
    chosen = matrices(
        engine, attention_layer=shape.align_layer % shape.dec_layers, attention_head=0
    )
    head_only = matrices(engine, attention_head=0)  # the layer unset: the alignment layer
    for a, b, c in zip(own, chosen, head_only, strict=True):
        # the choice's session reads the weights unpacked (sessions.make_session's prepack): its
        # products round apart from the search's in the last bits
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(a, c, atol=1e-6)


def test_each_layer_and_head_is_a_distribution_and_a_layer_averages_its_heads(
    engine: Engine,
) -> None:
    """Layers 0 and 1 attend through the fused kernel (their weights recomputed from its
    inputs), layer 2 through plain ops: every head of each reads differently."""
    shape = engine.bundle.architecture.transformer
    assert shape is not None
    own = matrices(engine)
    for layer in range(shape.dec_layers):
        heads = [
            matrices(engine, attention_layer=layer, attention_head=h) for h in range(shape.heads)
        ]
        averaged = matrices(engine, attention_layer=layer)
        for i, matrix in enumerate(averaged):
            for per_head in heads:
                np.testing.assert_allclose(per_head[i].sum(axis=1), 1.0, atol=1e-5)
            np.testing.assert_allclose(matrix, np.mean([h[i] for h in heads], axis=0), atol=1e-6)
        assert all(not np.allclose(heads[0][i], heads[1][i], atol=1e-3) for i in range(len(PAIRS)))
        if layer != shape.align_layer % shape.dec_layers:
            assert not np.allclose(averaged[0], own[0], atol=1e-3)


def test_the_choice_leaves_the_log_probabilities_alone(engine: Engine) -> None:
    own = align(engine, PAIRS, AlignOptions(matrices="none"))
    chosen = align(
        engine, PAIRS, AlignOptions(matrices="none", attention_layer=0, attention_head=3)
    )
    for a, b in zip(own, chosen, strict=True):
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=1e-5)
        assert a.eos_log_prob == pytest.approx(b.eos_log_prob, abs=1e-5)


@pytest.mark.parametrize(
    ("choice", "says"),
    [
        ({"attention_layer": 3}, "attention_layer 3 is not one of model grc-en-nt-transformer's 3"),
        ({"attention_head": 4}, "attention_head 4 is not one of model grc-en-nt-transformer's 4"),
        ({"attention_layer": -1}, "attention_layer must be >= 0"),
    ],
)
def test_a_layer_or_head_the_model_lacks_is_refused_naming_it(
    engine: Engine, choice: dict[str, int], says: str
) -> None:
    with pytest.raises(InvalidInput, match=says):
        align(engine, PAIRS[:1], AlignOptions(**choice))  # type: ignore[arg-type]


def test_an_rnn_refuses_a_choice_of_layer() -> None:
    with pytest.raises(InvalidInput, match="RNN with one attention"):
        align(load(RNN), PAIRS[:1], AlignOptions(attention_layer=0))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    srv = ServerThread.start([*base_args(TRANSFORMER), "--no-warmup"])
    yield srv
    srv.close()


def served(
    srv: ServerThread, attention_layer: int | None = None, attention_head: int | None = None
) -> list[list[float]]:
    options = align_options_to_pb(
        matrices="subword", attention_layer=attention_layer, attention_head=attention_head
    )
    request = pb.AlignRequest(
        pairs=[pb.AlignPair(source=s, target=t) for s, t in PAIRS],
        options=options,
    )
    return [list(a.subword.weights) for a in srv.stub.Align(request, timeout=WAIT_S).alignments]


def test_requests_asking_different_heads_at_once_each_get_their_own(
    server: ServerThread, engine: Engine
) -> None:
    """Align requests of three choices sent together (their pairs queue side by side; each
    choice decodes in a batch of its own) answer as the engine does for each alone."""
    choices = [{}, {"attention_layer": 0, "attention_head": 1}, {"attention_layer": 1}] * 3
    with ThreadPoolExecutor(len(choices)) as pool:
        answers = list(pool.map(lambda c: served(server, **c), choices))
    for choice, answer in zip(choices, answers, strict=True):
        want = matrices(engine, **choice)
        for got, matrix in zip(answer, want, strict=True):
            np.testing.assert_allclose(got, matrix.ravel(), atol=1e-6)


def test_the_server_refuses_a_layer_out_of_range_with_invalid_argument(
    server: ServerThread,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        served(server, attention_layer=7)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "0 to 2" in str(err.value.details())


def test_a_graph_that_cannot_give_the_choice_fails_its_request_not_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decoder graph where the chosen layer's cross-attention cannot be found (one not made by
    our exporter): the request gets INVALID_ARGUMENT saying so, and the server goes on."""
    from service.decode.runtime import runtime

    def cannot(*args: object) -> None:
        raise ValueError("the decoder graph shows 0 layers' cross-attention, not layer 1")

    monkeypatch.setattr(runtime, "choose_attention", cannot)
    srv = ServerThread.start([*base_args(TRANSFORMER), "--no-warmup"], load(TRANSFORMER))
    try:
        with pytest.raises(grpc.RpcError) as err:
            served(srv, attention_layer=1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shows 0 layers' cross-attention" in str(err.value.details())
        assert len(served(srv)) == len(PAIRS)  # the model's own alignment still answers
    finally:
        srv.close()
