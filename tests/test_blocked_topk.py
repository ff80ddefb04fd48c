"""The two-stage top k (service/decode/runtime/blocked_topk.py) answers as one ONNX TopK does: the same
values and ids, ties in the same order, for every k, with and without a rest after the blocks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from benchmarks.sample_texts import bundle_texts
from service.decode.align.aligner import align
from service.decode.engine.engine import Engine
from service.decode.runtime import blocked_topk, runtime, step_graph
from service.decode.runtime.blocked_topk import block_size, block_topk
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions, merge_options
from service.decode.text.translation import Translation
from tests.conftest import REPO


def topk_model(vocab: int, opset: int) -> onnx.ModelProto:
    """A LogSoftmax row, (N, vocab), and TopK's log_probs and token_ids, as the decoder ends."""
    graph = helper.make_graph(
        [
            helper.make_node("LogSoftmax", ["logits"], ["row"], axis=-1),
            helper.make_node("TopK", ["row", "k"], ["log_probs", "token_ids"], axis=-1),
        ],
        "step",
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", vocab]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["N", "k"]),
            helper.make_tensor_value_info("token_ids", TensorProto.INT64, ["N", "k"]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def rows_with_ties(vocab: int, seed: int) -> np.ndarray:
    """Random logits with equal values inside a block, across blocks and in the rest, and a row
    of equal values."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((12, vocab)) * 4).astype(np.float32)
    best = logits.max(axis=1)
    logits[0, [3, 7, vocab - 1]] = best[0] + 1  # three ties for the top, one in the rest
    logits[1, [5, vocab // 2, vocab // 2 + 1]] = best[1] + 1
    logits[2, :] = 0.5  # every entry tied
    logits[3, ::2] = -np.inf  # banned entries
    logits[4, 1:] = -np.inf  # one finite entry: the rest of the top k are -inf
    return logits


@pytest.mark.parametrize("vocab", [4000, 4001, 32042])
@pytest.mark.parametrize("opset", [17, 18])
def test_two_stages_answer_as_one_topk(vocab: int, opset: int) -> None:
    plain = topk_model(vocab, opset)
    blocked = topk_model(vocab, opset)
    assert block_topk(blocked, "log_probs", vocab)
    assert not any(n.op_type == "TopK" and "row" in n.input for n in blocked.graph.node)
    one, two = session(plain), session(blocked)
    logits = rows_with_ties(vocab, vocab)
    block = block_size(vocab)
    assert block is not None
    for k in (1, 6, 11, vocab // block, vocab // block + 3, vocab):
        feeds = {"logits": logits, "k": np.array([k], np.int64)}
        want_values, want_ids = one.run(None, feeds)
        got_values, got_ids = two.run(None, feeds)
        np.testing.assert_array_equal(got_values, want_values, err_msg=f"k={k}")
        np.testing.assert_array_equal(got_ids, want_ids, err_msg=f"k={k}")


def test_block_is_a_divisor_where_there_is_one() -> None:
    assert block_size(32000) == 100  # read in place
    assert block_size(32042) == 74  # 2 x 37 x 433
    assert 32000 % 100 == 0 and 32042 % 74 == 0
    # 2 x 31259: whole blocks sliced out, the rest a block of its own
    assert block_size(62518) == 96
    assert block_size(2000) is None  # short rows keep one TopK


def test_a_short_row_or_another_topk_is_left_alone() -> None:
    model = topk_model(1000, 17)
    assert not block_topk(model, "log_probs", 1000)
    model = topk_model(4000, 17)
    assert not block_topk(model, "no_such_output", 4000)
    smallest = topk_model(4000, 17)
    smallest.graph.node[1].attribute.append(helper.make_attribute("largest", 0))
    assert not block_topk(smallest, "log_probs", 4000)
    assert [n.op_type for n in smallest.graph.node] == ["LogSoftmax", "TopK"]


def translations(engine: Engine, texts: list[str], **changes: object) -> list[Translation]:
    defaults = SearchOptions(**merge_options(SearchOptions().values(), engine.decoding_defaults))
    options = replace(defaults, beam_size=5, n_best=3, **changes)  # type: ignore[arg-type]
    return engine.translate(texts, options, "subword")


def hypotheses(results: list[Translation]) -> list[list[tuple[object, ...]]]:
    return [
        [
            (h.token_ids, h.score, h.log_prob, h.token_log_probs, repr(h.alignment))
            for h in r.hypotheses
        ]
        for r in results
    ]


@pytest.mark.parametrize("model", ["grc-en-nt", "grc-en-nt-transformer"])
@pytest.mark.parametrize("search", ["host", "device"])
def test_engines_translate_the_same_with_two_stages(
    model: str, search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedded model (2,000 target tokens, under MIN_VOCAB) decoded with its top k in two
    stages, lowered MIN_VOCAB making them so, in either search and with a prefix (the device
    search's masked row): every hypothesis the same, to the last bit, as with one TopK."""
    bundle = REPO / "models" / model
    texts = bundle_texts(bundle)[:8]
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search=search)
    one = Engine.load(bundle, config)
    first_words = " ".join(one.translate(texts[:1])[0].hypotheses[0].text.split()[:2])
    cases = [({}, texts), ({"target_prefix": (first_words,)}, texts[:1])]
    # the device search's and Align's graphs are made on first use: the reference's before the
    # patch; Align reads the log-softmax row beside the top k (step_graph.FULL_LOG_PROBS)
    want = [hypotheses(translations(one, some, **changes)) for changes, some in cases]
    pairs = [(text, one.translate([text])[0].hypotheses[0].text) for text in texts[:3]]
    want_aligned = [repr(pair) for pair in align(one, pairs)]
    rewritten: list[str] = []

    def spy(model: onnx.ModelProto, output: str, vocab: int) -> bool:
        done = block_topk(model, output, vocab)
        rewritten.append(f"{output}: {done}")
        return done

    monkeypatch.setattr(blocked_topk, "MIN_VOCAB", 1000)
    for module in (runtime, step_graph):  # the step's graph (step_graph) and the search's
        monkeypatch.setattr(module, "block_topk", spy)
    two = Engine.load(bundle, config)
    got = [hypotheses(translations(two, some, **changes)) for changes, some in cases]
    assert got == want
    assert [repr(pair) for pair in align(two, pairs)] == want_aligned
    assert rewritten and all(r.endswith("True") for r in rewritten), rewritten
    if search == "device":  # the search graph's TopK, on the row and on the prefix's masked row
        assert {"search/log_probs: True", "search/top_log_probs: True"} <= set(rewritten)
