"""A decoder state of named tensors (service/model/graph_contract.py): a toy model whose step reads,
beside the encoder's `state`, a tensor that grows a step at a time (`trail`: each hypothesis's
tokens so far, (R, L, 1)) and one that does not (`count`: its steps, (R, 1)), declared in its
manifest. Both searches (the numpy one over the runtime's decoder, the device search) carry them:
joined at zeros, reordered by the back-pointers inside the step, the growing one left-padded for a
sentence that joined later and cut to what the rows still read, its `positions` given by the
runtime (the host search) or computed in the step's graph (the device search).

The toy's next token depends on the smallest token in each hypothesis's trail, read over the last
`positions + 1` entries: a padding entry read as the hypothesis's (a zero) or an entry of another
hypothesis's (a wrong reorder) changes the answer, and so does a count that is not the
positions' (it forces a word). Every sentence must answer as it does alone, in a running batch
that sentences join and leave, under both searches.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from benchmarks.decoding.instant import (
    FIRST_WORD,
    VOCAB,
    _const,
    _model,
    _vocabulary,
    encoder_graph,
    instant_config,
    instant_text,
)
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.preparation import DecodeRequest
from service.decode.text.translation import Translation
from service.model.architecture import EOS_ID, StateSpec
from service.model.bundle import write_manifest
from tests.test_device_search import assert_same

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
STATES = (StateSpec("trail", 1, growing=True), StateSpec("count", 1))


def trail_decoder(weight: float, seed: int = 3) -> onnx.ModelProto:
    """The toy step: the instant model's `state` (L, step), plus trail (R, L, 1) and count (R, 1)
    and positions (N,); logits = a table's row for the previous token + weight · (the smallest
    token of the hypothesis's trail) · a fixed direction, the end of sentence last before step L
    and first after it, a word forced where count is not positions + 1."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 1.0, (VOCAB, VOCAB)).astype(np.float32)  # (V, V)
    table[:, : EOS_ID + 1] = -30.0  # never pad, BOS or (here) EOS: the ends add it
    direction = rng.normal(0.0, 1.0, (1, VOCAB)).astype(np.float32)  # (1, V)
    eos = np.zeros((1, VOCAB), np.float32)
    eos[0, EOS_ID] = 1.0
    forced = np.zeros((1, VOCAB), np.float32)
    forced[0, FIRST_WORD] = 1.0
    n = helper.make_node
    nodes = [
        n("Gather", ["state", "reorder"], ["followed"], axis=0),  # (N, 2)
        n("Split", ["followed"], ["target_len", "last_step"], axis=1),  # (N, 1) each
        n("Add", ["last_step", "one_f"], ["step"]),
        n("Concat", ["target_len", "step"], ["new_state"], axis=1),  # (N, 2)
        # the growing tensor: the hypothesis's trail, this token after it
        n("Gather", ["trail", "reorder"], ["trail_r"], axis=0),  # (N, L, 1)
        n("Cast", ["tokens"], ["tokens_f"], to=FLOAT),
        n("Reshape", ["tokens_f", "column3"], ["token_entry"]),  # (N, 1, 1)
        n("Concat", ["trail_r", "token_entry"], ["new_trail"], axis=1),  # (N, L + 1, 1)
        n("Gather", ["count", "reorder"], ["count_r"], axis=0),  # (N, 1)
        n("Add", ["count_r", "one_f"], ["new_count"]),  # (N, 1)
        # the hypothesis's entries: the last positions + 1 of the L + 1
        n("Shape", ["new_trail"], ["trail_shape"]),
        n("Gather", ["trail_shape", "one_i"], ["L1"], axis=0),  # ()
        n("Range", ["zero_i", "L1", "one_i"], ["index"]),  # (L + 1,)
        n("Add", ["positions", "one_i"], ["entries"]),  # (N,)
        n("Sub", ["L1", "entries"], ["first"]),  # (N,)
        n("Unsqueeze", ["first", "axis1"], ["first_col"]),  # (N, 1)
        n("GreaterOrEqual", ["index", "first_col"], ["valid"]),  # (N, L + 1)
        n("Squeeze", ["new_trail", "axis2"], ["trail_2d"]),  # (N, L + 1)
        n("Where", ["valid", "trail_2d", "big"], ["masked"]),
        n("ReduceMin", ["masked"], ["smallest"], axes=[1], keepdims=1),  # (N, 1) (opset 17)
        n("Mul", ["smallest", "weight"], ["pull"]),
        n("Mul", ["pull", "direction"], ["pulled"]),  # (N, V)
        n("Gather", ["table", "tokens"], ["rows"], axis=0),  # (N, V)
        n("Add", ["rows", "pulled"], ["logits_0"]),
        # the count must be positions + 1: else a word is forced
        n("Cast", ["entries"], ["entries_f"], to=FLOAT),
        n("Unsqueeze", ["entries_f", "axis1"], ["entries_col"]),  # (N, 1)
        n("Sub", ["new_count", "entries_col"], ["off"]),
        n("Abs", ["off"], ["off_abs"]),
        n("Mul", ["off_abs", "force"], ["forcing"]),  # (N, 1)
        n("Mul", ["forcing", "forced"], ["forced_row"]),  # (N, V)
        n("Add", ["logits_0", "forced_row"], ["logits_1"]),
        # the end of sentence: last before step L, first after it
        n("Greater", ["step", "target_len"], ["ends"]),  # (N, 1)
        n("Where", ["ends", "eos_first", "eos_last"], ["eos_logit"]),  # (N, 1)
        n("Mul", ["eos_logit", "eos"], ["eos_row"]),  # (N, V)
        n("Add", ["logits_1", "eos_row"], ["logits"]),
        n("LogSoftmax", ["logits"], ["scores"], axis=1),
        n("Reshape", ["k", "one_i1"], ["k1"]),
        n("TopK", ["scores", "k1"], ["log_probs", "token_ids"], axis=1),
        # the instant model's fixed attention
        n("Shape", ["tokens"], ["N"]),
        n("Shape", ["mask"], ["mask_shape"]),
        n("Split", ["mask_shape"], ["B", "S"], axis=0),
        n("Div", ["N", "B"], ["K"]),
        n("Concat", ["B", "K", "S"], ["expanded_shape"], axis=0),
        n("Concat", ["N", "S"], ["attention_shape"], axis=0),
        n("Transpose", ["keys"], ["keys_t"], perm=[0, 2, 1]),
        n("Expand", ["keys_t", "expanded_shape"], ["expanded"]),
        n("Reshape", ["expanded", "attention_shape"], ["attention"]),
    ]
    inits = [
        _const("table", table),
        _const("direction", direction),
        _const("eos", eos),
        _const("forced", forced),
        _const("weight", np.array([[weight]], np.float32)),
        _const("force", np.array([[60.0]], np.float32)),
        _const("eos_first", np.array([[60.0]], np.float32)),
        _const("eos_last", np.array([[-60.0]], np.float32)),
        _const("big", np.array(1e9, np.float32)),
        _const("one_f", np.array([[1.0]], np.float32)),
        _const("column3", np.array([-1, 1, 1], np.int64)),
        _const("one_i", np.array(1, np.int64)),
        _const("zero_i", np.array(0, np.int64)),
        _const("one_i1", np.array([1], np.int64)),
        _const("axis1", np.array([1], np.int64)),
        _const("axis2", np.array([2], np.int64)),
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
            vi("mask", TensorProto.BOOL, ["B", "S"]),
            vi("k", INT64, []),
            vi("trail", FLOAT, ["R", "L", 1]),
            vi("count", FLOAT, ["R", 1]),
            vi("positions", INT64, ["N"]),
        ],
        [
            vi("log_probs", FLOAT, ["N", "k"]),
            vi("token_ids", INT64, ["N", "k"]),
            vi("new_state", FLOAT, ["N", 2]),
            vi("attention", FLOAT, ["N", "S"]),
            vi("new_trail", FLOAT, ["N", "L1", 1]),
            vi("new_count", FLOAT, ["N", 1]),
        ],
        inits,
        "trail_decoder_step",
    )


def build_trail_bundle(path: Path, weight: float, states: tuple[StateSpec, ...] = STATES) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(encoder_graph(), str(path / "encoder.onnx"))
    onnx.save(trail_decoder(weight), str(path / "decoder.onnx"))
    (path / "source.vocab").write_text(_vocabulary(), encoding="utf-8")
    (path / "target.vocab").write_text(_vocabulary(), encoding="utf-8")
    tokenizer = {
        "kind": "word",
        "toolkit": "native",
        "source": {"file": "source.vocab", "lowercase": False, "append_eos": False},
        "target": {"file": "target.vocab", "lowercase": False},
    }
    architecture = {**instant_config().to_dict(), "decoder_states": [
        {"name": s.name, "width": s.width, "growing": s.growing} for s in states]}  # fmt: skip
    write_manifest(path, "trail", "0", architecture, tokenizer=tokenizer)
    return path


def load(bundle: Path, search: str, row_ops: str = "auto") -> Engine:
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, search=search, row_ops=row_ops
    )
    return Engine.load(bundle, config)


TEXTS = [instant_text(length, seed) for seed, length in enumerate([3, 7, 1, 12, 5, 20, 2, 9])]
OPTIONS = SearchOptions(beam_size=3, n_best=2, max_length=40, max_length_b=30)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_trail_bundle(tmp_path_factory.mktemp("trail"), weight=0.8)


def churn(engine: Engine, seed: int) -> dict[int, Translation]:
    """Every text twice, joining 0-3 at a time before each step."""
    rng = random.Random(seed)
    batch = engine.new_batch(3)
    pending = [
        DecodeRequest(i, engine.prepare(t), OPTIONS, "subword") for i, t in enumerate(TEXTS * 2)
    ]
    out: dict[int, Translation] = {}
    while pending or len(batch):
        batch.add([pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 3])))])
        if len(batch):
            out.update(batch.step())
    return out


@pytest.mark.parametrize(
    "search, row_ops", [("host", "auto"), ("device", "auto"), ("device", "graph")]
)
def test_a_state_of_named_tensors_answers_in_a_batch_as_alone(
    bundle: Path, search: str, row_ops: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under both searches, with numpy's row writes (the CPU's) and the device's graphs. Then a
    long sentence leaves a batch whose others joined late: its growing axis is cut to what they
    read, and they answer as alone."""
    engine = load(bundle, search, row_ops)
    assert [s.name for s in engine.cfg.decoder_states] == ["trail", "count"]
    alone = [engine.translate([t], OPTIONS, alignment="subword")[0] for t in TEXTS]
    got = churn(engine, seed=5)
    assert got.keys() == set(range(2 * len(TEXTS)))
    for key, translation in got.items():
        assert_same(alone[key % len(TEXTS)], translation, f"{search}, request {key}")
    ops = engine.model.row_ops
    cuts: list[int] = []
    keep_last = ops.keep_last

    def counting(value: Any, entries: int) -> Any:
        cuts.append(entries)
        return keep_last(value, entries)

    monkeypatch.setattr(ops, "keep_last", counting)
    batch = engine.new_batch(3)
    late = {0: [5], 17: [3, 7]}  # TEXTS[5] translates to 20 tokens; TEXTS[3] to 12, [7] to 9
    answers: dict[int, Translation] = {}
    for step in range(60):
        batch.add([DecodeRequest(i, engine.prepare(TEXTS[i]), OPTIONS, "subword")
                   for i in late.get(step, [])])  # fmt: skip
        if len(batch):
            answers.update(batch.step())
    assert answers.keys() == {5, 3, 7}
    for key, translation in answers.items():
        assert_same(alone[key], translation, f"{search}, late request {key}")
    assert cuts, "the growing axis was never cut"


def test_both_searches_carry_the_state_alike(bundle: Path) -> None:
    host, device = churn(load(bundle, "host"), 9), churn(load(bundle, "device"), 9)
    assert host.keys() == device.keys()
    for key, translation in host.items():
        assert_same(translation, device[key], f"request {key}")


def test_the_growing_tensor_changes_the_answers(tmp_path: Path, bundle: Path) -> None:
    """Without the trail's pull the toy answers otherwise: the tests above read the cache."""
    still = load(build_trail_bundle(tmp_path / "still", weight=0.0), "device")
    pulled = load(bundle, "device")
    a = [h.token_ids for t in still.translate(TEXTS, OPTIONS) for h in t.hypotheses]
    b = [h.token_ids for t in pulled.translate(TEXTS, OPTIONS) for h in t.hypotheses]
    assert a != b


def test_a_manifest_that_declares_a_state_its_decoder_lacks_is_refused(tmp_path: Path) -> None:
    from service.model.bundle import BundleError

    path = build_trail_bundle(tmp_path / "bad", 0.5, (*STATES, StateSpec("extra", 2)))
    with pytest.raises(BundleError, match="no input 'extra'"):
        load(path, "host")
