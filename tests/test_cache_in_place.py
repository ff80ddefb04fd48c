"""A Transformer's caches in place (service/decode/runtime/cache_in_place.py): the rewritten step equals the
contract's over several steps of joins, leaves and beam reorders; the slots follow the rows (a
parent's first child keeps its slot, every other child gets a copy, a joining row gets a free slot
and nothing else); the engine answers as with the contract's graph, in both searches, under churn."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from benchmarks.sample_texts import bundle_texts
from service.decode.engine.engine import Engine
from service.decode.runtime.cache_in_place import (
    GQA,
    LENGTHS,
    ROWS,
    SLOTS,
    CachesInPlace,
    attend_in_place,
)
from service.decode.runtime.device import Device
from service.decode.runtime.transfers import TransferLedger
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.preparation import DecodeRequest
from service.decode.text.translation import Translation
from service.model.architecture import StateSpec
from service.model.bundle import load_bundle
from tests.conftest import REPO

TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def graphs() -> tuple[onnx.ModelProto, onnx.ModelProto, tuple[StateSpec, ...]]:
    specs = tuple(load_bundle(TRANSFORMER).architecture.decoder_states)
    dense = onnx.load(str(TRANSFORMER / "decoder.onnx"))
    in_place = copy.deepcopy(dense)
    assert attend_in_place(in_place, specs)
    return dense, in_place, specs


def test_the_rewrite_attends_over_the_caches_themselves(
    graphs: tuple[onnx.ModelProto, onnx.ModelProto, tuple[StateSpec, ...]],
) -> None:
    dense, in_place, specs = graphs
    ops = [n.op_type for n in in_place.graph.node]
    assert ops.count(GQA) == len(specs) // 2  # one a layer
    readers = {i for n in in_place.graph.node if n.op_type == "Gather" for i in n.input}
    assert not readers & {s.name for s in specs}  # no cache gathered by the back-pointers
    assert {ROWS, SLOTS, LENGTHS} <= {i.name for i in in_place.graph.input}
    onnx.checker.check_model(in_place)
    # a graph whose self-attentions read something else is left as it is
    other = copy.deepcopy(dense)
    for node in other.graph.node:
        if node.op_type == "Gather" and node.input[0] == specs[0].name:
            node.input[1] = "positions"
    before = other.SerializeToString()
    assert not attend_in_place(other, specs)
    assert other.SerializeToString() == before


def test_steps_in_place_equal_the_contracts_through_joins_leaves_and_forks(
    graphs: tuple[onnx.ModelProto, onnx.ModelProto, tuple[StateSpec, ...]],
) -> None:
    """Six steps of a batch run both ways, each step's rows drawn from the last's (forks, a
    leave, a join): the same top tokens and log-probs, the caches the same entries."""
    dense_model, in_place_model, specs = graphs
    dense, in_place = session(dense_model), session(in_place_model)
    rng = np.random.default_rng(5)
    S, D = 6, 768
    caches = CachesInPlace(specs, Device("cpu", 0, TransferLedger()))
    # the dense side: caches (R, heads, L, d) left-padded, as the contract has them
    dense_caches = {
        s.name: np.zeros((0, s.heads, 0, s.width // s.heads), np.float32) for s in specs
    }
    positions = np.zeros(0, np.int64)
    sentences = 0
    reorders = [None, "fork", "fork", "leave", "join", "fork"]
    rows = 0
    for step, change in enumerate(reorders):
        if change is None or change == "join":  # two sentences of 3 rows join
            joined = 2 * 3
            reorder = np.concatenate([np.arange(rows), rows + np.arange(joined)])
            caches.join(joined)
            positions = np.concatenate([positions, np.zeros(joined, np.int64)])
            for name, value in dense_caches.items():
                pad = np.zeros((joined, *value.shape[1:]), np.float32)
                dense_caches[name] = np.concatenate([value, pad])
            sentences += 2
            rows += joined
        elif change == "fork":  # each sentence's rows from its own, with repeats
            reorder = np.concatenate([3 * b + rng.integers(0, 3, 3) for b in range(rows // 3)])
        else:  # the first sentence leaves: the last one's rows take its place
            keep = np.r_[np.arange(rows - 3, rows), np.arange(3, rows - 3)]
            reorder = keep
            rows -= 3
            sentences -= 1
        N = len(reorder)
        B = N // 3
        feeds = {
            "tokens": rng.integers(4, 2000, N),
            "state": np.zeros((int(reorder.max()) + 1, 0), np.float32),  # the last step's rows
            "values": rng.standard_normal((B, S, D)).astype(np.float32),
            "keys": rng.standard_normal((B, S, D)).astype(np.float32),
            "mask": np.ones((B, S), bool),
            "k": np.array(4),
        }
        lengths = positions[reorder]
        theirs = dense.run(
            None, {**feeds, "reorder": reorder, "positions": lengths, **dense_caches}
        )
        caches.arrange(reorder, lengths)
        binding = in_place.io_binding()
        for name, value in {**feeds, "reorder": np.arange(N), "positions": lengths}.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in ("log_probs", "token_ids", "new_state", "attention"):
            binding.bind_output(name)
        caches.bind(binding)
        caches.bind_outputs(binding)
        in_place.run_with_iobinding(binding)
        ours = [v.numpy() for v in binding.get_outputs()[:4]]
        np.testing.assert_allclose(ours[0], theirs[0], atol=1e-4)
        assert np.array_equal(ours[1], theirs[1]), step
        np.testing.assert_allclose(ours[3], theirs[3], atol=1e-5)
        caches.stepped([], lengths)
        positions = lengths + 1
        for i, spec in enumerate(specs):
            grown = theirs[4 + i]  # (N, heads, L + 1, d), left-padded
            dense_caches[spec.name] = grown
            buffer = caches.buffers[spec.name]
            for row in range(N):
                n, slot = int(positions[row]), int(caches.slot_of_row[row])
                expected = grown[row, :, grown.shape[2] - n :]
                np.testing.assert_allclose(buffer[slot, :, :n], expected, atol=1e-5)


def test_a_parents_first_child_keeps_its_slot_and_the_others_get_copies() -> None:
    spec = StateSpec("self_k0", 4, growing=True, heads=2)
    caches = CachesInPlace([spec], Device("cpu", 0, TransferLedger()))
    caches.join(4)
    caches.arrange(np.arange(4), np.zeros(4, np.int64))  # joining rows: free slots, no copy
    assert sorted(caches.slot_of_row.tolist()) == [0, 1, 2, 3]
    buffer = caches.buffers["self_k0"]
    for slot in range(4):
        buffer[slot, :, :3] = slot + 1  # three entries each, marked by their slot
    before = caches.slot_of_row.copy()
    caches.arrange(np.array([2, 2, 0, 2]), np.full(4, 3))  # row 2's children: rows 0, 1, 3
    slots = caches.slot_of_row
    assert slots[0] == before[2] and slots[2] == before[0]  # first children keep the slots
    assert len(set(slots.tolist())) == 4
    buffer = caches.buffers["self_k0"]
    for row, parent in enumerate([2, 2, 0, 2]):
        assert np.all(buffer[slots[row], :, :3] == before[parent] + 1)
    inputs = caches.inputs
    assert np.array_equal(inputs[SLOTS], slots)
    assert np.array_equal(inputs[ROWS][slots], np.arange(4))
    assert inputs[LENGTHS][slots].tolist() == [3, 3, 3, 3]


def test_scattered_slots_are_packed_below_the_row_count() -> None:
    spec = StateSpec("self_k0", 4, growing=True, heads=2)
    caches = CachesInPlace([spec], Device("cpu", 0, TransferLedger()))
    caches.join(40)
    caches.arrange(np.arange(40), np.zeros(40, np.int64))
    buffer = caches.buffers["self_k0"]
    for slot in range(40):
        buffer[slot, :, :2] = slot
    survivor = int(np.flatnonzero(caches.slot_of_row == 39)[0])
    caches.arrange(np.array([0, survivor]), np.full(2, 2))  # two rows left, one in slot 39
    assert caches.used <= 2 and sorted(caches.slot_of_row.tolist()) == [0, 1]
    moved = caches.slot_of_row[1]
    assert np.all(caches.buffers["self_k0"][moved, :, :2] == 39)


@pytest.mark.parametrize("search", ["host", "device"])
def test_the_engine_answers_as_with_the_contracts_caches(search: str) -> None:
    """grc-en-nt-transformer, n-best 3 with alignments, sentences joining a running batch as
    others leave: the same n-best lists, scores within 1e-4, attention within 1e-4."""
    texts = bundle_texts(TRANSFORMER)[:12]
    answers = {}
    for in_place in (True, False):
        config = RuntimeConfig(
            providers=("CPUExecutionProvider",), intra_op_threads=1, search=search,
            cache_in_place=in_place,
        )  # fmt: skip
        engine = Engine.load(TRANSFORMER, config)
        assert engine.model.caches_in_place == in_place
        options = SearchOptions(beam_size=4, n_best=3)
        batch = engine.new_batch(4)
        done: dict[int, Translation] = {}
        waiting = list(enumerate(texts))
        while waiting or len(batch):
            joining = [waiting.pop(0) for _ in range(min(2, len(waiting)))]
            batch.add([DecodeRequest(i, engine.prepare(t), options) for i, t in joining])
            done.update(batch.step())
        answers[in_place] = [done[i] for i in range(len(texts))]
    for ours, theirs in zip(answers[True], answers[False], strict=True):
        assert [h.text for h in ours.hypotheses] == [h.text for h in theirs.hypotheses]
        for a, b in zip(ours.hypotheses, theirs.hypotheses, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)
            assert a.alignment is not None and b.alignment is not None
            np.testing.assert_allclose(a.alignment.matrix, b.alignment.matrix, atol=1e-4)


def test_the_switch_keeps_the_contracts_graph() -> None:
    off = Engine.load(
        TRANSFORMER, RuntimeConfig(providers=("CPUExecutionProvider",), cache_in_place=False)
    )
    assert not off.model.caches_in_place
    assert not any(n.type == "tensor(int32)" for n in off.model.decoder.get_inputs())
