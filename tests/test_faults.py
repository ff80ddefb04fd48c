"""Faults injected into a running server: clients that vanish, a killed process, a damaged model,
an ONNX Runtime failure in the middle of a batch, a full queue. Each ends in a clear status for the
requests it touches and leaves the server serving everyone else.

(Cancellation by the client, deadlines, SIGTERM under load and the queue's RESOURCE_EXHAUSTED are in
tests/test_server.py; this file adds what those do not cover.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2

from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.engine.engine import Engine
from service.decode.runtime.runtime import OnnxDecoder
from service.decode.search.device_search import DeviceSearch
from service.model.bundle import sha256_of
from tests.conftest import DEFAULT_BUNDLE, REPO
from tests.test_server import (
    WAIT_S,
    Gate,
    Opts,
    ServerThread,
    assert_matches,
    base_args,
    error_of,
    free_port,
    health_status,
    is_idle,
    metric,
    reference,
    requests_done,
    wait_for,
)

Code = grpc.StatusCode
SERVING = health_pb2.HealthCheckResponse.SERVING
LONG = Opts(beam=5, max_length=64)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    srv = ServerThread.start(base_args(DEFAULT_BUNDLE))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def engine(server: ServerThread) -> Engine:
    return cast(Engine, server.r.engine)  # the single-process server's: an engine


@pytest.fixture(scope="module")
def long_texts(engine: Engine) -> list[str]:
    """Four of the longest sentences the model decodes whole (one running sentence each, not cut
    into segments): dozens of decoder steps each."""
    from loadtest.workload import COMMITTED_TSV, read_sources

    whole = [t for t in read_sources(COMMITTED_TSV) if not engine.prepare(t).segments]
    return sorted(whole, key=len, reverse=True)[:4]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    monkeypatch.setattr(OnnxDecoder, "step", g.wrap(OnnxDecoder.step))
    monkeypatch.setattr(DeviceSearch, "step", g.wrap_search(DeviceSearch.step))
    yield g
    g.open.set()


def server_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}


def start_process(bundle: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`python -m service.serve.server` on 127.0.0.1:port, its output (JSON log lines) into `log`."""
    argv = [*base_args(bundle), "--port", str(port), *extra]
    with log.open("ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "service.serve.server", *argv],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=server_env(),
        )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(WAIT_S)


# --- a client that goes away mid-decode --------------------------------------------------------

DOOMED_CLIENT = """
import sys, grpc
from proto.translation.v1 import translation_pb2 as pb, translation_pb2_grpc as pb_grpc
stub = pb_grpc.TranslatorStub(grpc.insecure_channel("127.0.0.1:" + sys.argv[1]))
options = pb.DecodingOptions(beam_size=5, max_length=64)
stub.Translate(pb.TranslateRequest(texts=sys.argv[2:], options=options), timeout=120)
"""


@pytest.mark.parametrize("how", ["channel-closed", "client-killed"])
def test_a_client_that_disconnects_mid_decode_frees_its_places_and_spares_the_others(
    server: ServerThread, engine: Engine, gate: Gate, long_texts: list[str], how: str
) -> None:
    running = server.r
    cancelled = requests_done(running, "CANCELLED")
    gate.open.clear()  # the doomed request is admitted, then held at its first step
    if how == "channel-closed":
        channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
        doomed: Any = pb_grpc.TranslatorStub(channel).Translate.future(
            LONG.request(long_texts), timeout=WAIT_S
        )
    else:  # another process, killed with SIGKILL: its connection just drops
        doomed = subprocess.Popen(
            [sys.executable, "-c", DOOMED_CLIENT, str(running.port), *long_texts], cwd=REPO
        )
    try:
        wait_for(
            lambda: metric(running, "s2s_running_sentences") == len(long_texts),
            "the doomed request to decode",
        )
        others = [
            (["forty-seven"], Opts(beam=2)),
            (long_texts[:2], LONG),
            (["seventy"], Opts(beam=1)),
        ]
        calls = [server.stub.Translate.future(o.request(t), timeout=WAIT_S) for t, o in others]
        wait_for(lambda: running.worker.queued_sentences == 4, "the other requests to be queued")
        if how == "channel-closed":
            channel.close()
        else:
            doomed.kill()
            doomed.wait(WAIT_S)
        wait_for(
            lambda: requests_done(running, "CANCELLED") == cancelled + 1,
            "the server to see the client go",
        )
    finally:
        gate.open.set()
        if how == "client-killed":
            stop_process(doomed)
    for call, (texts, o) in zip(calls, others, strict=True):
        assert_matches(call.result(WAIT_S), reference(engine, texts, o))
    wait_for(lambda: is_idle(running), "the running gauge to return to 0")
    assert requests_done(running, "INTERNAL") == 0


# --- the process is killed and restarted ----------------------------------------------------


def test_a_killed_server_is_unavailable_then_serves_again_after_a_restart(
    engine: Engine, tmp_path: Path
) -> None:
    port, log = free_port(), tmp_path / "server.log"
    backoff = [  # reconnect quickly once the server is back (grpc's default starts at 1 s, x1.6)
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=backoff)
    stub = pb_grpc.TranslatorStub(channel)
    o, texts = Opts(beam=3, n_best=2), ["ninety-seven", "March 5, 2021"]
    want = reference(engine, texts, o)

    def serving(proc: subprocess.Popen[bytes]) -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return health_status(channel) == SERVING
        except grpc.RpcError:
            return False

    first = start_process(DEFAULT_BUNDLE, port, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: serving(first), "the server to be SERVING", timeout=60)
        assert_matches(stub.Translate(o.request(texts), timeout=WAIT_S), want)
        first.kill()  # SIGKILL: no drain, no goodbye
        first.wait(WAIT_S)
        started = time.monotonic()
        down = error_of(lambda: stub.Translate(o.request(texts), timeout=10))
        assert down.code() == Code.UNAVAILABLE
        assert time.monotonic() - started < 5.0  # refused at once, not left to its deadline
        second = start_process(DEFAULT_BUNDLE, port, log)  # the same port, at once
        answers: list[Any] = []

        def answered() -> bool:
            assert second is not None and second.poll() is None, log.read_text()
            try:
                answers.append(stub.Translate(o.request(texts), timeout=5))
                return True
            except grpc.RpcError as err:  # only "not there yet" while it restarts
                assert err.code() in (Code.UNAVAILABLE, Code.UNIMPLEMENTED), err  # type: ignore[attr-defined]
                return False

        wait_for(answered, "the restarted server to answer", timeout=60)
        assert_matches(answers[-1], want)
        second.terminate()
        assert second.wait(WAIT_S) == 0
    finally:
        channel.close()
        stop_process(first)
        if second is not None:
            stop_process(second)


# --- a damaged model ---------------------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def garbage(path: Path) -> None:
    path.write_bytes(b"this is not a model\n" * 64)


def rehash(bundle: Path) -> None:
    """Make the manifest agree with the damaged files: only the loaders can tell now."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"] = {name: sha256_of(bundle / name) for name in manifest["files"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


# case -> (file, damage, re-hash the manifest, what the error says)
DAMAGE: dict[str, tuple[str, Callable[[Path], None], bool, str]] = {
    "truncated encoder": ("encoder.onnx", truncate, False, "bundle file altered"),
    "one byte of the decoder": ("decoder.onnx", flip_a_byte, False, "bundle file altered"),
    "unused int8 decoder altered": ("decoder.int8.onnx", flip_a_byte, False, "bundle file altered"),
    "target tokenizer missing": ("target.model", Path.unlink, False, "bundle file missing"),
    "manifest not JSON": ("manifest.json", garbage, False, "is not valid JSON"),
    "truncated encoder, manifest re-hashed": ("encoder.onnx", truncate, True, "INVALID_PROTOBUF"),
    "garbage decoder, manifest re-hashed": ("decoder.onnx", garbage, True, "INVALID_PROTOBUF"),
    "garbage tokenizer, manifest re-hashed": (
        "source.model",
        garbage,
        True,
        "cannot load tokenizer",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_bundle_stops_the_start_with_an_error_naming_the_file(
    tmp_path: Path, case: str
) -> None:
    name, damage, rehashed, says = DAMAGE[case]
    bundle = Path(shutil.copytree(DEFAULT_BUNDLE, tmp_path / "bundle"))
    damage(bundle / name)
    if rehashed:
        rehash(bundle)
    port, log = free_port(), tmp_path / "server.log"
    proc = start_process(bundle, port, log)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    served: list[str] = []
    try:
        while proc.poll() is None:  # until it exits: never SERVING, never a translation
            try:
                if health_status(channel) == SERVING:
                    served.append("health SERVING")
                pb_grpc.TranslatorStub(channel).Translate(Opts().request(["one"]), timeout=1)
                served.append("a translation")
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        status = proc.wait(WAIT_S)
    finally:
        channel.close()
        stop_process(proc)
    assert status != 0 and not served, (status, served)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    critical = [e["message"] for e in lines if e["level"] == "CRITICAL"]
    assert len(critical) == 1, log.read_text()
    assert critical[0].startswith("cannot start: ") and says in critical[0]
    assert str(bundle / name) in critical[0]  # the file, by its full path


# --- ONNX Runtime fails in the middle of a batch ------------------------------------------------


def test_an_onnx_runtime_failure_mid_batch_fails_only_that_batch(
    server: ServerThread,
    engine: Engine,
    long_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, gate = server.r, Gate()
    ahead = running.worker.ahead  # a sentence joins a running batch once this thread encoded it
    assert ahead is not None
    original_step = DeviceSearch.step  # the step of every running batch (search "device")
    failed_while: list[set[int]] = []  # the beam sizes running when the failure was injected

    def step(search: DeviceSearch) -> Any:
        # No step before the encoder thread has encoded every sentence handed to it: the victim
        # joins at the step after its encoding, while the survivor (14 steps) still runs. Without
        # this, a loaded machine let the survivor finish before the victim was encoded.
        wait_for(lambda: len(ahead) == len(ahead.ready_keys()), "the victim's encoding")
        # the beam-2 batch of two sentences, once: its session's run fails
        if len(search) * search.beam_size == 4 and not failed_while:
            failed_while.append({key.beam for key in running.worker.batches})
            original_run = search.session.run_with_iobinding

            def run_with_iobinding(*args: Any, **kwargs: Any) -> Any:
                monkeypatch.setattr(search.session, "run_with_iobinding", original_run)
                raise RuntimeError("injected ONNX Runtime failure: device lost")

            monkeypatch.setattr(search.session, "run_with_iobinding", run_with_iobinding)
        return original_step(search)

    monkeypatch.setattr(DeviceSearch, "step", gate.wrap_search(step))
    internal = requests_done(running, "INTERNAL")
    survivor_o, victim_o = LONG, Opts(beam=2, max_length=32)
    gate.open.clear()
    survivor = server.stub.Translate.future(survivor_o.request(long_texts[:1]), timeout=WAIT_S)
    wait_for(lambda: metric(running, "s2s_running_sentences") == 1, "the survivor to decode")
    victim = server.stub.Translate.future(victim_o.request(["seventy", "one"]), timeout=WAIT_S)
    wait_for(lambda: running.worker.queued_sentences == 2, "the victim to be queued")
    with caplog.at_level(logging.ERROR):
        gate.open.set()
        error = victim.exception(WAIT_S)
        assert_matches(survivor.result(WAIT_S), reference(engine, long_texts[:1], survivor_o))
    assert failed_while == [{2, 5}]  # the survivor's batch was decoding when the victim's failed
    assert error is not None and error.code() == Code.INTERNAL  # type: ignore[attr-defined]
    assert error.details() == "decoding failed inside the model runtime; the error was logged"  # type: ignore[attr-defined]
    assert any("injected ONNX Runtime failure" in (r.exc_text or "") for r in caplog.records)
    assert requests_done(running, "INTERNAL") == internal + 1
    assert metric(running, "s2s_rejected_requests_total", reason="internal") >= 1
    wait_for(lambda: is_idle(running), "the server to be idle")
    after = server.stub.Translate(victim_o.request(["seventy", "one"]), timeout=WAIT_S)
    assert_matches(after, reference(engine, ["seventy", "one"], victim_o))


# --- a full queue refuses at once ---------------------------------------------------------------


def test_a_full_queue_refuses_each_call_while_it_stays_full(
    engine: Engine, gate: Gate, long_texts: list[str]
) -> None:
    """Each call past a full queue is refused (RESOURCE_EXHAUSTED) while the decode that holds the
    queue is stopped at the gate: the refusal waits for no capacity to free up. How fast it is
    belongs to the benchmarks (a wall-clock bound here failed on a loaded machine)."""
    argv = [*base_args(DEFAULT_BUNDLE), "--no-warmup"]
    srv = ServerThread.start(
        [*argv, "--max-queue-sentences", "2", "--max-batch-sentences", "1"], engine
    )
    try:
        gate.open.clear()
        held = srv.stub.Translate.future(LONG.request(long_texts[:1]), timeout=WAIT_S)
        wait_for(lambda: metric(srv.r, "s2s_running_sentences") == 1, "the first request to decode")
        queued = srv.stub.Translate.future(LONG.request(long_texts[1:3]), timeout=WAIT_S)
        wait_for(lambda: srv.r.worker.queued_sentences == 2, "the queue to fill")
        for i in range(20):
            request = Opts().request([f"{i} apples"])
            err = error_of(lambda: srv.stub.Translate(request, timeout=5))  # noqa: B023
            assert err.code() == Code.RESOURCE_EXHAUSTED, (i, err.code(), err.details())
            assert not held.done() and not queued.done(), "refused only once the queue moved"
        gate.open.set()
        assert_matches(held.result(WAIT_S), reference(engine, long_texts[:1], LONG))
        assert_matches(queued.result(WAIT_S), reference(engine, long_texts[1:3], LONG))
        wait_for(lambda: is_idle(srv.r), "the server to be idle")
    finally:
        gate.open.set()
        srv.close()
