"""The server as separate processes (service/serve/supervisor.py): a supervisor, engine processes
and front processes sharing the ports, each test against real processes on the default model.

What the single-process server promises holds across them: an engine killed mid-batch, or hung
while alive, turns the requests it held into UNAVAILABLE answers with a message (none hangs) and a
restart, which the requests that come meanwhile wait for (an engine that cannot start again ends
their wait, UNAVAILABLE saying why); a front killed mid-request costs only its own requests; SIGTERM under load drains every process with no
accepted request lost; SIGHUP reloads every process to the same versions and memory; deadlines,
cancellation and a full queue; one /metrics with every process's series; one trace per request
across front and engine; TLS and mutual TLS on the fronts.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.client import TranslatorClient
from service.serve.pod_metrics import merge_texts
from service.serve.supervisor import layout
from tests.conftest import DEFAULT_BUNDLE, REPO, wait_for
from tests.test_client import make_certificate
from tests.test_security import make_ca, tls_flags
from tests.test_server import SERVICE_NAME, SERVING, WAIT_S, Opts, error_of, health_status

Code = grpc.StatusCode
LONG = ["seven hundred seventy seven thousand three hundred and twelve"] * 16
pytestmark = pytest.mark.slow


class Pod:
    """`python -m service.serve.server` as a supervisor with its processes, on free ports."""

    def __init__(
        self, tmp_path: Path, *extra: str, fronts: int = 1, env: dict[str, str] | None = None
    ) -> None:
        from loadtest.harness import free_port

        self.port, self.metrics_port = free_port(), free_port()
        self.log = tmp_path / "server.log"
        self.fronts = fronts
        argv = [
            "--bundle", str(DEFAULT_BUNDLE), "--port", str(self.port),
            "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1",
            "--host", "127.0.0.1", "--providers", "CPUExecutionProvider",
            "--intra-op-threads", "1", "--log-level", "INFO", "--fronts", str(fronts),
            "--reload-interval-s", "0", *extra,
        ]  # fmt: skip
        environ = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service.serve.server", *argv],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**environ, **(env or {})},
            )
        self.channels: list[grpc.Channel] = []

    def channel(self, **options: Any) -> grpc.Channel:
        """A new connection (each may land on another front)."""
        channel = grpc.insecure_channel(
            f"127.0.0.1:{self.port}",
            options=[("grpc.use_local_subchannel_pool", 1), *options.items()],
        )
        self.channels.append(channel)
        return channel

    def stub(self) -> pb_grpc.TranslatorStub:
        return pb_grpc.TranslatorStub(self.channel())

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def pids(self, role: str) -> dict[int, int]:
        """Each process's latest pid, by index."""
        return {
            e["index"]: e["pid"]
            for e in self.lines()
            if e.get("message") == "process started" and e.get("role") == role
        }

    def count(self, message: str) -> int:
        return sum(1 for e in self.lines() if e.get("message") == message)

    def wait_serving(self, fronts_serving: int | None = None) -> Pod:
        channel = self.channel()

        def serving() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return health_status(channel, SERVICE_NAME) == SERVING
            except grpc.RpcError:
                return False

        wait_for(serving, "the server to be SERVING", timeout=60)
        want = self.fronts if fronts_serving is None else fronts_serving
        wait_for(lambda: self.count("serving") >= want, "every front to serve", timeout=60)
        return self

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as page:
            return str(page.read().decode())

    def sample(self, metric: str, **labels: str) -> float:
        """The sum of the samples of `metric` with these labels (others free)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(metric + "{") and not line.startswith(metric + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> int:
        for channel in self.channels:
            channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.stop()


def start(pods: list[Pod], tmp_path: Path, *extra: str, **kwargs: Any) -> Pod:
    pod = Pod(tmp_path, *extra, **kwargs)
    pods.append(pod)
    return pod.wait_serving()


def long_request(n: int = 16, request_id: str = "") -> pb.TranslateRequest:
    return Opts(beam=5, max_length=160).request(LONG[:n], request_id=request_id)


def outcomes(calls: list[Any]) -> list[grpc.RpcError]:
    """Each call's end: answered (before the fault) or UNAVAILABLE; returns the refusals."""
    refused = []
    for call in calls:
        try:
            call.result()
        except grpc.RpcError as err:
            assert err.code() == Code.UNAVAILABLE, err  # type: ignore[attr-defined]
            refused.append(err)
    return refused


def refusals_ended(calls: list[Any], ends: list[float]) -> list[float]:
    """When each refused call ended (`ends` from `ending_times`), once every call has ended."""
    wait_for(lambda: all(end < math.inf for end in ends), "every call's end to be noted")
    return [end for call, end in zip(calls, ends, strict=True) if call.exception() is not None]


def ending_times(calls: list[Any]) -> list[float]:
    """Each call's end (monotonic), noted as it ends. The requests an engine never took (TAKEN
    had not come back when it went) are sent again and answered after its restart, seconds
    later, so a fault's refusals are timed one by one, not by the last call's end."""
    ends = [math.inf] * len(calls)
    for i, call in enumerate(calls):
        call.add_done_callback(lambda _, i=i: ends.__setitem__(i, time.monotonic()))
    return ends


def sent_again(pod: Pod) -> int:
    """The requests the fronts sent again (their engine went before it took them)."""
    return sum(e["requests_sent_again"] for e in pod.lines() if e.get("message") == "engine down")


def test_the_layout_follows_the_cores() -> None:
    from service.serve.config import load_settings

    settings = load_settings([], environ={})
    assert layout(settings, cores=1) == (0, 1)  # one core: the single-process mode
    assert layout(settings, cores=2) == (1, 1)
    assert layout(settings, cores=16) == (4, 1)
    assert layout(load_settings(["--fronts", "3", "--engines", "2"], environ={}), 16) == (3, 2)
    assert layout(load_settings(["--fronts", "0"], environ={}), 16)[0] == 0


def test_an_engine_killed_mid_batch_fails_what_it_held_and_the_requests_meanwhile_wait_for_it(
    pods: list[Pod], tmp_path: Path
) -> None:
    """The only engine SIGKILLed under load: the requests it held fail UNAVAILABLE at once; the
    ones that come while it is started again (one every 100 ms) wait and are answered, the same
    answer as before, where each was refused before (issue 48: 65 of 65 over a 6.7 s restart);
    one whose deadline is shorter than the restart gets DEADLINE_EXCEEDED. Readiness turns
    NOT_SERVING at once all the same."""
    pod = start(pods, tmp_path, "--engines", "1")
    stub = pod.stub()
    probe = Opts(beam=2).request(["forty two"])
    want = stub.Translate(probe, timeout=WAIT_S).translations[0].hypotheses[0].text
    calls = [stub.Translate.future(long_request(), timeout=WAIT_S) for _ in range(64)]
    ends = ending_times(calls)
    wait_for(lambda: pod.sample("s2s_running_sentences") > 0, "sentences decoding")
    engine = pod.pids("engine")[0]
    killed = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    refused = outcomes(calls)  # none hangs: each answered, within seconds
    assert max(refusals_ended(calls, ends)) - killed < 5.0
    assert refused and all("engine process" in e.details() for e in refused)  # type: ignore[attr-defined]
    health = pod.channel()
    wait_for(lambda: health_status(health, SERVICE_NAME) != SERVING, "NOT_SERVING")
    # the front answers meanwhile: ModelInfo, health (its models NOT_SERVING until the restart)
    assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=5).name == "numbers-en-fr"
    short = stub.Translate.future(probe, timeout=0.5)  # shorter than any restart
    probes = []
    while health_status(health, SERVICE_NAME) != SERVING:  # until the engine is back
        probes.append(stub.Translate.future(probe, timeout=WAIT_S))
        time.sleep(0.1)
        assert time.monotonic() - killed < WAIT_S, "the engine was not started again"
    restart_s = time.monotonic() - killed
    texts = [p.result().translations[0].hypotheses[0].text for p in probes]  # none refused
    assert texts == [want] * len(probes)
    assert error_of(short.result).code() == Code.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    print(f"restart {restart_s:.1f} s: {len(probes)} requests sent meanwhile, each answered")
    assert pod.pids("engine")[0] != engine
    assert pod.sample("s2s_process_restarts_total", role="engine") == 1
    rejected = pod.sample("s2s_rejected_requests_total", reason="engine_unavailable")
    assert rejected == len(refused)  # only the requests it held
    # the requests that waited: those that came before the front had it back (the last one or
    # two may have come after: health tells the client a little later)
    # (and those of the 64 the engine had not taken, or that came after it went: they waited too)
    resumed = pod.sample("s2s_restart_waits_total", outcome="resumed")
    answered = len(calls) - len(refused)
    assert len(probes) // 2 + sent_again(pod) <= resumed <= len(probes) + answered
    assert pod.sample("s2s_restart_waits_total", outcome="deadline_exceeded") == 1
    assert pod.sample("s2s_restart_wait_seconds_count") == resumed + 1
    assert 0 < pod.sample("s2s_restart_wait_seconds_sum") <= (resumed + 1) * restart_s
    assert pod.stop() == 0


def test_an_engine_that_cannot_start_again_ends_the_wait_unavailable_saying_why(
    pods: list[Pod], tmp_path: Path
) -> None:
    """Its bundle damaged after the first start, the engine killed: its next start fails, and the
    request waiting for it is answered UNAVAILABLE with the engine's own reason, long before its
    deadline, as are new ones at once; the bundle mended, a later start serves again."""
    bundle = tmp_path / "bundle"
    shutil.copytree(DEFAULT_BUNDLE, bundle)
    pod = start(pods, tmp_path, "--bundle", str(bundle))
    stub = pod.stub()
    probe = Opts(beam=2).request(["forty two"])
    assert stub.Translate(probe, timeout=WAIT_S).translations
    encoder = bundle / "encoder.onnx"
    whole = encoder.read_bytes()
    encoder.write_bytes(whole[: len(whole) // 2])
    os.kill(pod.pids("engine")[0], signal.SIGKILL)
    wait_for(lambda: pod.count("engine down") > 0, "the front to take the engine down")
    waiting = stub.Translate.future(probe, timeout=WAIT_S)  # waits: the engine is restarting
    began = time.monotonic()
    failed = error_of(waiting.result)
    assert time.monotonic() - began < WAIT_S / 2  # when the start failed, not at the deadline
    assert failed.code() == Code.UNAVAILABLE  # type: ignore[attr-defined]
    assert "engine 0 failed to start again (exit status 1)" in failed.details()  # type: ignore[attr-defined]
    assert "bundle file altered" in failed.details()  # type: ignore[attr-defined]
    began = time.monotonic()
    refused = error_of(lambda: stub.Translate(probe, timeout=WAIT_S))  # refused at once
    assert time.monotonic() - began < 2.0
    assert refused.code() == Code.UNAVAILABLE  # type: ignore[attr-defined]
    assert "bundle file altered" in refused.details()  # type: ignore[attr-defined]
    assert pod.sample("s2s_restart_waits_total", outcome="engine_unavailable") == 1
    encoder.write_bytes(whole)  # mended: a later start (the supervisor goes on) serves
    again = pod.channel()
    wait_for(lambda: health_status(again, SERVICE_NAME) == SERVING, "SERVING again", 90)
    assert stub.Translate(probe, timeout=WAIT_S).translations
    assert pod.stop() == 0


def test_with_two_engines_one_killed_leaves_the_other_serving(
    pods: list[Pod], tmp_path: Path
) -> None:
    """Engines x threads on a CPU host: both decode; one killed fails only the requests it held,
    the model stays SERVING on the other, and new requests are answered meanwhile."""
    pod = start(pods, tmp_path, "--engines", "2")
    stub = pod.stub()
    calls = [stub.Translate.future(long_request(), timeout=WAIT_S) for _ in range(64)]
    wait_for(lambda: pod.sample("s2s_running_sentences") > 0, "sentences decoding")
    engines = pod.pids("engine")
    assert len(engines) == 2
    os.kill(engines[0], signal.SIGKILL)
    # the front knows at once, by the engine's connection closing (not seconds later by a missed
    # heartbeat, or at its restart): from then on it sends that engine nothing
    wait_for(lambda: pod.count("engine down") > 0, "the front to take the engine down")
    (down,) = [e for e in pod.lines() if e.get("message") == "engine down"]
    assert (down["engine"], down["why"]) == (0, "its connection closed")
    refused = outcomes(calls)
    answered = len(calls) - len(refused)
    assert answered > 0  # the other engine's (and those done before)
    channel = pod.channel()
    assert health_status(channel, f"{SERVICE_NAME}/numbers-en-fr") == SERVING
    for _ in range(5):  # served by the engine left while the other restarts
        assert stub.Translate(Opts(beam=2).request(["one"]), timeout=WAIT_S).translations
    wait_for(lambda: pod.pids("engine")[0] != engines[0], "the engine to be started again")
    assert pod.sample("s2s_process_restarts_total", role="engine") == 1
    assert pod.stop() == 0


def test_a_hung_engine_is_told_by_its_heartbeat_killed_and_restarted(
    pods: list[Pod], tmp_path: Path
) -> None:
    pod = start(pods, tmp_path, "--engine-hang-s", "3")
    stub = pod.stub()
    calls = [stub.Translate.future(long_request(), timeout=WAIT_S) for _ in range(64)]
    ends = ending_times(calls)
    wait_for(lambda: pod.sample("s2s_running_sentences") > 0, "sentences decoding")
    engine = pod.pids("engine")[0]
    os.kill(engine, signal.SIGSTOP)  # alive, and silent
    stopped = time.monotonic()
    wait_for(lambda: pod.count("engine down") > 0, "the front to take the engine down")
    assert time.monotonic() - stopped < 4.0  # the fronts' heartbeat timeout (2 s), not the deadline
    assert health_status(pod.channel(), f"{SERVICE_NAME}/numbers-en-fr") != SERVING
    # a request meanwhile waits for the engine's restart (the supervisor kills it after 3 s)
    waiting = stub.Translate.future(Opts(beam=2).request(["one"]), timeout=WAIT_S)
    wait_for(lambda: pod.pids("engine")[0] != engine, "the supervisor to kill and restart it")
    assert waiting.result().translations
    assert outcomes(calls)  # the others: answered before, or sent again and answered after
    assert max(refusals_ended(calls, ends)) - stopped < 4.0  # failed when it was taken down
    again = pod.channel()
    wait_for(lambda: health_status(again, SERVICE_NAME) == SERVING, "SERVING again")
    assert stub.Translate(Opts(beam=2).request(["one"]), timeout=WAIT_S).translations
    # the request sent meanwhile waited, as did any of the 64 the engine had not taken yet (sent
    # again) or that reached the front after it went
    resumed = pod.sample("s2s_restart_waits_total", outcome="resumed")
    assert 1 + sent_again(pod) <= resumed <= 1 + len(calls) - len(outcomes(calls))
    assert pod.count("engine hung: killing it") == 1
    assert pod.stop() == 0


def test_a_front_killed_mid_request_spares_the_others_and_is_restarted(
    pods: list[Pod], tmp_path: Path
) -> None:
    pod = start(pods, tmp_path, fronts=2)
    fronts = pod.pids("front")
    stubs = [pod.stub() for _ in range(16)] * 2  # connections spread over both fronts
    calls = [
        s.Translate.future(long_request(16, f"r{i}"), timeout=WAIT_S) for i, s in enumerate(stubs)
    ]
    wait_for(lambda: pod.sample("s2s_running_sentences") > 0, "sentences decoding")
    os.kill(fronts[0], signal.SIGKILL)
    codes = []
    for call in calls:
        try:
            call.result()
            codes.append(Code.OK)
        except grpc.RpcError as err:
            codes.append(err.code())  # type: ignore[attr-defined]
    assert Code.OK in codes, codes  # the other front's requests answered
    assert set(codes) <= {Code.OK, Code.UNAVAILABLE, Code.CANCELLED}, codes
    # the engine dropped the dead front's sentences (its jobs cancelled): it is idle again
    wait_for(lambda: pod.sample("s2s_running_sentences") == 0, "the engine to be idle", 20)
    wait_for(lambda: pod.pids("front")[0] != fronts[0], "the front to be started again")
    wait_for(lambda: pod.count("serving") >= 3, "the new front to serve")
    for stub in [pod.stub() for _ in range(6)]:
        assert stub.Translate(Opts(beam=2).request(["one"]), timeout=WAIT_S).translations
    assert pod.sample("s2s_process_restarts_total", role="front") == 1
    assert pod.stop() == 0


def test_sigterm_under_load_drains_every_process_and_loses_no_accepted_request(
    pods: list[Pod], tmp_path: Path
) -> None:
    pod = start(pods, tmp_path, "--grace-s", "15", fronts=2)
    results: list[tuple[str, grpc.StatusCode]] = []
    lock, sent_term = threading.Lock(), threading.Event()

    def client(name: str) -> None:
        stub = pod.stub()
        for n in range(10_000):
            request_id = f"{name}-{n}"
            try:
                stub.Translate(long_request(6, request_id), timeout=WAIT_S)
                code = Code.OK
            except grpc.RpcError as err:
                code = err.code()  # type: ignore[attr-defined]
            with lock:
                results.append((request_id, code))
            if sent_term.is_set() and code != Code.OK:
                return

    threads = [threading.Thread(target=client, args=(f"c{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(results) >= 6, "some load to have been served", 60)
    wait_for(lambda: pod.sample("s2s_requests_in_flight", method="Translate") >= 2, "in flight")
    pod.proc.send_signal(signal.SIGTERM)
    sent_term.set()
    for t in threads:
        t.join(WAIT_S)
    assert pod.proc.wait(40) == 0
    handled = {
        e["request_id"]: e["code"]
        for e in pod.lines()
        if e.get("message") == "request done" and e.get("method") == "Translate"
    }
    for request_id, code in results:
        if request_id in handled:  # reached a front: answered, and as that front logged it
            assert handled[request_id] == code.name, (request_id, code)
            assert code in (Code.OK, Code.UNAVAILABLE)
        else:
            assert code == Code.UNAVAILABLE
    assert sum(1 for _, c in results if c == Code.OK) >= 6
    assert pod.count("stopped") >= 3  # both fronts and the supervisor (the engine logs it too)


def test_sighup_reloads_every_process_to_the_same_versions_and_memory(
    pods: list[Pod], tmp_path: Path
) -> None:
    repo, memory = tmp_path / "repo", tmp_path / "memory"
    (repo / "numbers").mkdir(parents=True)
    (repo / "numbers" / "1").symlink_to(DEFAULT_BUNDLE, target_is_directory=True)
    memory.mkdir()
    (memory / "numbers-en-fr.tsv").write_text("forty two\tsix sept\n", "utf-8")
    pod = start(
        pods, tmp_path, "--models", str(repo), "--bundle", "", "--memory-dir", str(memory),
        fronts=2,
    )  # fmt: skip

    def answers() -> set[tuple[str, str]]:
        out = set()
        for stub in [pod.stub() for _ in range(8)]:
            reply = stub.Translate(pb.TranslateRequest(texts=["forty two"]), timeout=WAIT_S)
            out.add((reply.model_version, reply.translations[0].hypotheses[0].text))
        return out

    assert answers() == {("1", "six sept")}
    (repo / "numbers" / "2").symlink_to(DEFAULT_BUNDLE, target_is_directory=True)
    (memory / "numbers-en-fr.tsv").write_text("forty two\thuit\n", "utf-8")
    pod.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: answers() == {("2", "huit")}, "every front on version 2, with the new memory")
    for stub in [pod.stub() for _ in range(6)]:
        listed = stub.ListModels(pb.ListModelsRequest(), timeout=5).models
        assert [(m.name, m.version) for m in listed] == [("numbers", "2")]
    assert pod.count("reloaded") == 1  # the engine's
    assert pod.stop() == 0


def test_deadlines_cancellation_and_a_full_queue_across_processes(
    pods: list[Pod], tmp_path: Path
) -> None:
    """On the Greek model, one sentence at a time (a sentence takes tens of milliseconds)."""
    greek = [t for t in (REPO / "loadtest" / "grc_sources.txt").read_text("utf-8").split("\n") if t]
    greek = (greek * 4)[:32]
    pod = start(
        pods, tmp_path, "--bundle", str(REPO / "models" / "grc-en-nt"),
        "--max-batch-sentences", "1", "--max-queue-sentences", "32",
    )  # fmt: skip
    stub = pod.stub()
    o = Opts(beam=5, max_length=64)
    translated = pod.sample("s2s_translated_sentences_total")
    held = stub.Translate.future(o.request(greek), timeout=WAIT_S)  # 1 decoding, 31 waiting
    wait_for(lambda: pod.sample("s2s_queue_depth_sentences") >= 20, "the queue to fill")
    # a full queue: refused at once. 31 sentences do not fit while 2 or more wait (the metric read
    # above lags the queue, which drains while the engine decodes: 13 fit again once 19 waited)
    began = time.monotonic()
    full = error_of(lambda: stub.Translate(o.request(greek[:31]), timeout=WAIT_S))
    assert full.code() == Code.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert time.monotonic() - began < 1.0  # refused, not queued behind seconds of decoding
    # the client cancels: the engine drops its sentences, decoded or waiting
    held.cancel()
    wait_for(lambda: pod.sample("s2s_queue_depth_sentences") == 0, "the cancelled ones dropped")
    wait_for(lambda: pod.sample("s2s_running_sentences") == 0, "the engine idle")
    assert pod.sample("s2s_translated_sentences_total") - translated < len(greek)
    # a deadline that passes while queued behind another request
    first = stub.Translate.future(o.request(greek[:10]), timeout=WAIT_S)
    late = error_of(lambda: stub.Translate(o.request(greek[10:12]), timeout=0.03))
    assert late.code() == Code.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert len(first.result().translations) == 10
    wait_for(lambda: pod.sample("s2s_queue_depth_sentences") == 0, "the expired ones dropped")
    assert pod.sample("s2s_rejected_requests_total", reason="queue_full") == 1
    assert pod.stop() == 0


def test_one_metrics_endpoint_holds_every_processes_series(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path, "--http-port", "0", fronts=2)
    for stub in [pod.stub() for _ in range(10)]:
        stub.Translate(Opts(beam=2).request(["one", "two"]), timeout=WAIT_S)
    http_port = next(e["http_port"] for e in pod.lines() if e.get("message") == "starting")
    for _ in range(4):  # HTTP/JSON on the same fronts, the port shared as gRPC's is
        body = json.dumps({"texts": ["three"]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/v1/Translate", body,
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert json.loads(reply.read())["translations"][0]["hypotheses"][0]["text"]
    text = pod.metrics()
    grpc_ok = 'method="Translate",protocol="grpc"'
    ok = {"code": "OK", "method": "Translate"}
    assert pod.sample("s2s_request_duration_seconds_count", **ok, protocol="grpc") == 10
    assert pod.sample("s2s_request_duration_seconds_count", **ok, protocol="http") == 4
    assert pod.sample("s2s_translated_sentences_total") == 24  # the engine's
    assert pod.sample("s2s_model_info", name="numbers-en-fr") == 1  # one engine: info once
    assert pod.sample("process_resident_memory_bytes") > 3 * 50e6  # supervisor, engine, fronts
    assert f's2s_request_duration_seconds_bucket{{code="OK",le="+Inf",{grpc_ok}}}' in text
    # the merged exposition parses as one (promtool reads the same text: tests/test_deploy.py)
    assert merge_texts([text]).count("# TYPE s2s_request_duration_seconds histogram") == 1
    assert pod.stop() == 0


def test_one_trace_per_request_across_front_and_engine(pods: list[Pod], tmp_path: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    pod = start(pods, tmp_path, "--tracing", env=env)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    stub = pod.stub()
    stub.Translate(
        Opts(beam=2).request(["forty two"]), timeout=WAIT_S, metadata=(("traceparent", parent),)
    )
    assert pod.stop() == 0
    spans = [
        s
        for s in console_spans(pod.log.read_text())
        if s["context"]["trace_id"].endswith("0af7651916cd43dd8448eb211c80319c")
    ]
    by_name = {s["name"]: s for s in spans}
    assert {"Translate", "queue", "decode"} <= set(by_name), sorted(by_name)
    rpc = by_name["Translate"]["context"]["span_id"]
    assert by_name["queue"]["parent_id"] == rpc and by_name["decode"]["parent_id"] == rpc
    assert by_name["decode"]["attributes"]["s2s.decode.steps"] > 0


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans OpenTelemetry's console exporter printed (one JSON object each, indented)."""
    decoder, spans, i = json.JSONDecoder(), [], 0
    for match in re.finditer(r'^\{\n\s+"name"', text, re.MULTILINE):
        if match.start() < i:
            continue
        span, i = decoder.raw_decode(text, match.start())
        spans.append(span)
    return spans


def test_tls_and_mutual_tls_on_the_fronts(pods: list[Pod], tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH: cannot make test certificates")
    pki = tmp_path / "pki"
    make_ca(pki / "trusted")
    make_certificate("client", "DNS:client", pki / "trusted")
    make_certificate("server", "IP:127.0.0.1,DNS:localhost", pki / "trusted")
    pod = Pod(tmp_path, *tls_flags(pki, client_ca=True), fronts=2)
    pods.append(pod)
    wait_for(lambda: pod.count("serving") >= 2, "both fronts to serve", timeout=60)
    t = pki / "trusted"
    target = f"127.0.0.1:{pod.port}"
    for _ in range(4):  # connections over both fronts
        with TranslatorClient(
            target, tls_ca=str(t / "ca.pem"), tls_cert=str(t / "client.pem"),
            tls_key=str(t / "client.key"),
        ) as client:  # fmt: skip
            assert client.translate(["one"])[0].best.text
        with (
            TranslatorClient(target, tls_ca=str(t / "ca.pem")) as anonymous,
            pytest.raises(grpc.RpcError),
        ):
            anonymous.translate(["one"])
    assert pod.stop() == 0


def test_the_exit_status_forgives_only_an_engine_stopped_while_it_was_starting_again() -> None:
    """SIGTERM can reach an engine the supervisor is starting again before its handler is in
    place (it has published nothing, so it holds no request): that -SIGTERM is a clean stop. A
    front's or a serving engine's is not, nor any other status."""
    from types import SimpleNamespace

    from service.serve.supervisor import Child, stopped_cleanly

    def child(role: str, code: int, served: bool) -> Child:
        made = Child(role, 0, [], served=served)
        made.process = SimpleNamespace(returncode=code)  # type: ignore[assignment]
        return made

    term = -signal.SIGTERM
    assert stopped_cleanly(child("engine", term, served=False))
    assert stopped_cleanly(child("front", 0, served=False))
    assert not stopped_cleanly(child("engine", term, served=True))
    assert not stopped_cleanly(child("front", term, served=False))
    assert not stopped_cleanly(child("engine", -signal.SIGKILL, served=False))
    assert not stopped_cleanly(child("engine", 1, served=False))
