"""service/serve/channel.py: the wire format both ways, and a front's peer against an engine's
endpoint over inproc://, with no server around them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from service.decode.align.forced import AlignOptions, Forced
from service.decode.shared import errors
from service.decode.shared.controls import Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import Prepared
from service.decode.text.sides import PreparedPair, Side
from service.serve import channel as ch


def test_translate_work_crosses_as_token_ids_options_and_controls() -> None:
    whole = Prepared("one two", [5, 6, 7], ["▁one", "▁two", ""])
    segmented = Prepared(
        "a. b.", [8, 9, 10, 11], [], (Prepared("a.", [8, 9], []), Prepared("b.", [10, 11], []))
    )
    options = SearchOptions(beam_size=4, n_best=2, target_prefix=("x", ""), suppress=("y",))
    controls = [
        (Controls(prefix=(3, 4), suppress=((7, 8),), constraints=((9,), (10, 11))),),
        (Controls(min_length=2), Controls()),
    ]
    message = (ch.JOB, 7, ch.TRANSLATE, "m", "1", 12.5, {"traceparent": "t"}, "rid",
               ch.translate_work([whole, segmented], options, "word", controls, True, True))  # fmt: skip
    got = ch.unpack(ch.pack(message))
    assert got[:8] == [ch.JOB, 7, ch.TRANSLATE, "m", "1", 12.5, {"traceparent": "t"}, "rid"]
    sentences, search, alignment, read_controls, keep_rows, progress = ch.read_translate(got[8])
    assert search == options and hash(search) == hash(options)  # tuples again: hashable
    assert alignment == "word" and read_controls == controls and keep_rows and progress
    assert not ch.read_translate(ch.translate_work([whole], options, "word", controls[:1])).progress
    assert sentences[0].ids == [5, 6, 7] and not sentences[0].segments
    assert [p.ids for p in sentences[1].parts] == [[8, 9], [10, 11]]
    assert sentences[1].ids == [8, 9, 10, 11]  # what the engine needs: ids, no text


def test_results_cross_as_arrays_and_errors_as_their_class() -> None:
    attention = np.random.default_rng(0).random((3, 4), np.float32)  # (T, S)
    hyp = Hypothesis([5, 6, 7], -1.5, -2.25, attention, True, np.array([-0.5, -1.0, -0.75]))
    raw = [[[hyp, hyp]], [[hyp], [hyp]]]  # a sentence with n-best 2; a segmented one
    got = ch.results_in(ch.TRANSLATE, ch.unpack(ch.pack((ch.DONE, 1, ch.results_out(1, raw))))[2])
    back = got[1][1][0]
    assert back.tokens == [5, 6, 7] and (back.score, back.log_prob) == (-1.5, -2.25)
    assert back.attention.dtype == np.float32 and np.array_equal(back.attention, attention)
    assert hyp.token_log_probs is not None
    assert np.array_equal(back.token_log_probs, hyp.token_log_probs)
    forced = Forced(np.array([-0.1, -0.2]), attention[:2])
    pairs = ch.results_in(ch.ALIGN, ch.unpack(ch.pack(ch.results_out(ch.ALIGN, [(forced, None)]))))
    assert np.array_equal(pairs[0][0].attention, forced.attention) and pairs[0][1] is None
    error = ch.error_from(*ch.error_message(errors.QueueFull("full")))
    assert isinstance(error, errors.QueueFull) and str(error) == "full"
    assert isinstance(ch.error_from(*ch.error_message(KeyError("x"))), errors.DecodeFailed)
    with pytest.raises(TypeError):
        ch.pack((object(),))


def test_align_work_keeps_what_the_link_head_reads() -> None:
    side = Side(["a", "b"], [4, 5, 6], ["▁a", "▁b", "c"], np.array([0, 1, 1]), [])
    pair = PreparedPair(Prepared("a b", [4, 5, 6], []), side, side)
    options = AlignOptions(links="head", matrices="word")
    pairs, read = ch.read_align(ch.unpack(ch.pack(ch.align_work([pair], options))))
    assert read == options
    assert pairs[0].src.words == ["a", "b"] and pairs[0].tgt.ids == [4, 5, 6]
    assert np.array_equal(pairs[0].src.word_of, [0, 1, 1])


def test_a_peer_and_an_endpoint_over_inproc() -> None:
    """A front's Peer gets the answer of its request (and, before it, a streamed job's settled
    prefix), the heartbeats and the versions; a request the engine refuses raises its error on
    the front."""
    received: list[Any] = []

    def handle(peer: bytes, message: Any) -> None:
        received.append(message)
        if message[0] == ch.HELLO:
            endpoint.send(peer, (ch.VERSIONS, 1, "engine", (("m", "1", "/m", ("CPU",), 0),)))
        elif message[0] == ch.JOB:
            if message[3] == "ok":  # a settled prefix first (a streamed job's), then the answer
                settled = Hypothesis([5, 6], -0.5, -0.5, None, False, np.array([-0.25, -0.25]))
                endpoint.send(peer, (ch.PROGRESS, message[1], 3, ch.hypothesis_out(settled)))
            reply = (ch.DONE, message[1], "raw") if message[3] == "ok" else (
                ch.FAILED, message[1], "QueueFull", "the queue is full")  # fmt: skip
            endpoint.send(peer, reply)

    endpoint = ch.Endpoint("inproc://test-channel", handle, lambda: endpoint.broadcast(
        (ch.BEAT, "engine", 0.0, 0, 0)), 0.05)  # fmt: skip
    endpoint.start()
    beats, versions = threading.Event(), threading.Event()
    progress: list[tuple[int, list[int]]] = []

    async def front() -> list[Any]:
        peer = ch.Peer("inproc://test-channel", "front", lambda m: versions.set(),
                       lambda m: beats.set())  # fmt: skip
        peer.start()
        loop = asyncio.get_running_loop()
        answers: list[Any] = []
        for model in ("ok", "full"):
            done: asyncio.Future[Any] = loop.create_future()

            def build(i: int, model: str = model) -> tuple[Any, ...]:
                return (ch.JOB, i, 0, model, "1", None, {}, "r", ())

            def answer(r: Any, e: Exception | None, done: asyncio.Future[Any] = done) -> None:
                done.set_result((r, e))

            peer.request(0, build, answer, lambda i, h: progress.append((i, h.tokens)))
            answers.append(await asyncio.wait_for(done, 5))
        while not beats.is_set():
            await asyncio.sleep(0.01)
        await peer.close()
        return answers

    try:
        (ok, ok_error), (full, full_error) = asyncio.run(front())
    finally:
        endpoint.stop()
    assert ok == "raw" and ok_error is None
    assert progress == [(3, [5, 6])]  # heard before its answer, on the front's loop
    assert full is None and isinstance(full_error, errors.QueueFull)
    assert versions.is_set() and received[0][0] == ch.HELLO


def test_a_peer_hears_its_engine_go_at_once_after_what_it_sent(tmp_path: Any) -> None:
    """Over ipc:// (the engine processes' transport), the engine's end closing (its process ended)
    calls the Peer's on_gone: at once, not after a missed heartbeat, and after the answer the
    engine sent just before it is dispatched (a request it finished is not failed)."""
    import zmq

    address = f"ipc://{tmp_path}/engine"
    events: list[Any] = []

    async def front() -> None:
        engine: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        engine.setsockopt(zmq.LINGER, 1000)
        engine.bind(address)
        gone = asyncio.Event()

        def on_gone() -> None:
            events.append("gone")
            gone.set()

        peer = ch.Peer(address, "front", events.append, events.append, on_gone=on_gone)
        peer.start()
        peer.request(0, lambda i: (ch.JOB, i, 0, "m", "1", None, {}, "r", ()),
                     lambda r, e: events.append((r, e)))  # fmt: skip
        front_id, data = engine.recv_multipart()  # the HELLO
        while ch.unpack(data)[0] != ch.JOB:
            front_id, data = engine.recv_multipart()
        job = ch.unpack(data)
        engine.send_multipart([front_id, ch.pack((ch.DONE, job[1], "raw"))])
        engine.close()  # as a killed process's end closes
        await asyncio.wait_for(gone.wait(), 5)
        await peer.close()

    asyncio.run(front())
    assert events == [("raw", None), "gone"]


def test_fail_all_tells_what_the_engine_took_from_what_it_never_took(tmp_path: Any) -> None:
    """A request the engine said TAKEN fails with the error when it goes; one it never took fails
    NotTaken (the front sends it again: tests/test_engine_link.py)."""
    import zmq

    address = f"ipc://{tmp_path}/engine"
    answers: dict[str, Exception | None] = {}

    async def front() -> None:
        engine: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        engine.setsockopt(zmq.LINGER, 1000)
        engine.bind(address)
        peer = ch.Peer(address, "front", lambda m: None, lambda m: None)
        peer.start()
        for name in ("taken", "never taken"):

            def build(i: int, name: str = name) -> tuple[Any, ...]:
                return (ch.JOB, i, 0, name, "1", None, {}, "r", ())

            def answer(r: Any, e: Exception | None, name: str = name) -> None:
                answers[name] = e

            peer.request(0, build, answer)
        jobs: list[Any] = []
        while len(jobs) < 2:
            front_id, data = engine.recv_multipart()
            if ch.unpack(data)[0] == ch.JOB:
                jobs.append(ch.unpack(data))
        taken = next(j for j in jobs if j[3] == "taken")
        engine.send_multipart([front_id, ch.pack((ch.TAKEN, taken[1]))])
        while not peer.taken:
            await asyncio.sleep(0.01)
        peer.fail_all(errors.EngineUnavailable("it stopped"))
        engine.close()
        await peer.close()

    asyncio.run(front())
    assert type(answers["taken"]) is errors.EngineUnavailable
    assert isinstance(answers["never taken"], ch.NotTaken)
