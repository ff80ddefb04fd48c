"""EncodeAhead: queued sentences encoded on their own thread, bounded, forgettable, failure-tolerant."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from service.decode.engine.encode_ahead import EncodeAhead
from service.decode.runtime.encoded import EncodedSentence
from tests.conftest import wait_for

WAIT_S = 20.0


class FakeEncoder:
    """Encodes ids as values = ids (one column); can be paused or made to fail; records its calls."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []
        self.models: list[object] = []  # the model of each call
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, model: object, id_lists: list[Sequence[int]]) -> list[EncodedSentence]:
        self.calls.append([list(ids) for ids in id_lists])
        self.models.append(model)
        assert self.gate.wait(WAIT_S)
        if self.fail:
            raise RuntimeError("encoder exploded")
        return [
            EncodedSentence(
                values=np.array(ids, np.float32)[:, None],
                keys=np.array(ids, np.float32)[:, None],
                state=np.zeros(2, np.float32),
            )
            for ids in id_lists
        ]


@pytest.fixture
def encoder() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture
def make_ahead(encoder: FakeEncoder):  # type: ignore[no-untyped-def]
    made: list[EncodeAhead] = []

    def build(max_batch: int = 8, max_ready: int = 8) -> EncodeAhead:
        ahead = EncodeAhead(encoder, max_batch=max_batch, max_ready=max_ready)
        ahead.start()
        made.append(ahead)
        return ahead

    yield build
    encoder.gate.set()
    for ahead in made:
        ahead.stop(WAIT_S)
        assert not ahead.thread.is_alive()


def test_submitted_sentences_become_ready_and_take_returns_their_encodings(
    make_ahead: Callable[..., EncodeAhead],
) -> None:
    ahead = make_ahead()
    ahead.submit([("a", [4, 5]), ("b", [6])])
    wait_for(lambda: ahead.ready_keys() == {"a", "b"}, "both encodings")
    taken = ahead.take(["a", "b", "unknown"])
    assert set(taken) == {"a", "b"}
    assert taken["a"].values[:, 0].tolist() == [4.0, 5.0] and taken["b"].length == 1
    assert len(ahead) == 0 and ahead.ready_keys() == frozenset()


def test_encodes_in_arrival_order_in_calls_of_at_most_max_batch(
    make_ahead: Callable[..., EncodeAhead], encoder: FakeEncoder
) -> None:
    encoder.gate.clear()  # hold the first call so the rest queue up behind it
    ahead = make_ahead(max_batch=2, max_ready=100)
    ahead.submit([(f"s{i}", [i + 1]) for i in range(5)])
    wait_for(lambda: len(encoder.calls) == 1, "the first call")
    encoder.gate.set()
    wait_for(lambda: len(ahead.ready_keys()) == 5, "all five")
    assert [len(call) for call in encoder.calls] == [2, 2, 1]
    assert [ids for call in encoder.calls for ids in call] == [[1], [2], [3], [4], [5]]


def test_never_holds_more_than_max_ready_encodings(
    make_ahead: Callable[..., EncodeAhead], encoder: FakeEncoder
) -> None:
    ahead = make_ahead(max_batch=2, max_ready=3)
    ahead.submit([(f"s{i}", [i + 1]) for i in range(6)])
    wait_for(lambda: len(ahead.ready_keys()) == 3, "three ready")
    time.sleep(0.05)  # it must stop there, not go on encoding
    assert len(ahead.ready_keys()) == 3 and sum(len(c) for c in encoder.calls) == 3
    ahead.take(["s0", "s1"])  # room for two more
    wait_for(lambda: ahead.ready_keys() == {"s2", "s3", "s4"}, "the next two")


def test_a_sentence_forgotten_while_being_encoded_is_not_stored(
    make_ahead: Callable[..., EncodeAhead], encoder: FakeEncoder
) -> None:
    encoder.gate.clear()
    ahead = make_ahead()
    ahead.submit([("gone", [1]), ("kept", [2])])
    wait_for(lambda: len(encoder.calls) == 1, "the call to start")
    ahead.discard(["gone"])
    encoder.gate.set()
    wait_for(lambda: "kept" in ahead.ready_keys(), "the kept one")
    assert ahead.ready_keys() == {"kept"} and len(ahead) == 1


def test_a_failed_encoding_is_ready_with_nothing_so_the_caller_encodes_it_itself(
    make_ahead: Callable[..., EncodeAhead], encoder: FakeEncoder
) -> None:
    encoder.fail = True
    ahead = make_ahead()
    ahead.submit([("a", [1])])
    wait_for(lambda: "a" in ahead.ready_keys(), "the failure to be recorded")
    assert ahead.take(["a"]) == {} and len(ahead) == 0
    encoder.fail = False  # the thread survived the failure and keeps encoding
    ahead.submit([("b", [2])])
    wait_for(lambda: "b" in ahead.ready_keys(), "the next sentence")


def test_bad_limits_are_refused(encoder: FakeEncoder) -> None:
    with pytest.raises(ValueError, match="max_batch and max_ready"):
        EncodeAhead(encoder, max_batch=0, max_ready=1)


def test_each_call_encodes_one_models_sentences_and_a_flooded_model_leaves_room_for_another(
    make_ahead, encoder: FakeEncoder
) -> None:
    ahead = make_ahead(max_batch=4, max_ready=4)
    encoder.gate.clear()  # hold the first call so that everything below queues behind it
    ahead.submit([(f"a{i}", [i + 1]) for i in range(40)], model="A")
    wait_for(lambda: len(encoder.calls) == 1, "the first call")
    ahead.submit([("b0", [7]), ("b1", [8])], model="B")
    encoder.gate.set()
    # A's room (4) is full after its first call: B is encoded next, though 36 of A's came first
    wait_for(lambda: {"b0", "b1"} <= ahead.ready_keys(), "B's sentences")
    assert encoder.models[:2] == ["A", "B"]
    assert encoder.calls[1] == [[7], [8]]
    assert len(ahead.ready_keys()) == 6  # A holds only its room until the loop takes some
    ahead.take(["a0", "a1", "a2", "a3"])
    wait_for(lambda: len(ahead.ready_keys()) == 6 and "a4" in ahead.ready_keys(), "A's next")
    assert set(encoder.models) == {"A", "B"}


def test_turns_between_owners_and_no_owner_kept_out_by_a_full_room(
    make_ahead: Callable[..., EncodeAhead], encoder: FakeEncoder
) -> None:
    """A document of 6 sentences fills the room (3); a one-sentence request behind it is encoded
    all the same (its owner holds none), and before the document's next sentences."""
    encoder.gate.clear()
    ahead = make_ahead(max_batch=8, max_ready=3)
    ahead.submit([(f"doc.{i}", [i + 1]) for i in range(6)], None, "doc")
    encoder.gate.set()
    wait_for(lambda: len(ahead.ready_keys()) == 3, "the room full of the document")
    ahead.submit([("single", [9])], None, "single")
    wait_for(lambda: "single" in ahead.ready_keys(), "the single's encoding")
    assert ahead.ready_keys() == {"doc.0", "doc.1", "doc.2", "single"}
    ahead.take(["doc.0", "doc.1"])
    wait_for(lambda: ahead.ready_keys() == {"doc.2", "doc.3", "single"}, "the document's next")
