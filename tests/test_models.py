"""Several models from one server: a repository in tmp_path made of links to models/default under
other names and versions (the same weights, separately loaded), served by real servers.

Covers: ListModels / GetModelInfo / Translate by model, NOT_FOUND naming what is served, health per
model, reloads (a new version takes new requests while admitted ones finish on the old; a broken one
is refused and the old keeps serving; SIGHUP in a server process), per-version metrics, and
fairness (a flood of one model's requests does not hold another model's request back).
"""

from __future__ import annotations

import concurrent.futures
import csv
import importlib.util
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

import service.serve.engine_host
import service.serve.server
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.engine.engine import Engine
from service.serve.grpc_server import SERVICE_NAME
from tests.conftest import DEFAULT_BUNDLE, TinyModel, start_server_process
from tests.test_server import (
    QUIET_SERVER_FLAGS,
    WAIT_S,
    Opts,
    ServerThread,
    error_of,
    flag_list,
    free_port,
    health_status,
    metric,
    wait_for,
)

Code = grpc.StatusCode
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_version(root: Path, name: str, version: str, bundle: Path) -> Path:
    """DIR/NAME/VERSION as a link to a bundle folder."""
    folder = root / name / version
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(bundle, target_is_directory=True)
    return folder


def add_broken_version(root: Path, name: str, version: str, bundle: Path) -> Path:
    """A copy of a bundle with one byte of the decoder changed (its sha256 no longer matches),
    made beside the repository and moved in at once: a server polling the repository never sees
    the copy before the byte is changed (it did once: it loaded the intact copy)."""
    folder = root / name / version
    staging = root.parent / f".staging-{name}-{version}"
    shutil.copytree(bundle, staging)
    decoder = staging / "decoder.onnx"
    data = bytearray(decoder.read_bytes())
    data[len(data) // 2] ^= 0xFF
    decoder.write_bytes(bytes(data))
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(folder)
    return folder


def repo_args(root: Path, *extra: str) -> list[str]:
    flags = {"--models": str(root), **QUIET_SERVER_FLAGS, "--reload-interval-s": "0"}
    return [*flag_list(flags), *extra]


@pytest.fixture(scope="module")
def bundle(tiny: TinyModel) -> Path:
    return DEFAULT_BUNDLE if (DEFAULT_BUNDLE / "manifest.json").is_file() else tiny.bundle


@pytest.fixture
def repo(tmp_path: Path, bundle: Path) -> Path:
    root = tmp_path / "repo"
    add_version(root, "numbers", "1", bundle)
    add_version(root, "numbers", "2", bundle)
    add_version(root, "echo", "1", bundle)
    return root


@pytest.fixture
def served(repo: Path) -> Iterator[ServerThread]:
    srv = ServerThread.start(repo_args(repo, "--default-model", "numbers"))
    yield srv
    srv.close()


def translate(
    srv: ServerThread, texts: list[str], name: str = "", version: str = "", beam: int = 1
) -> pb.TranslateResponse:
    request = Opts(beam=beam).request(texts)
    request.model.CopyFrom(pb.ModelSpec(name=name, version=version))
    return srv.stub.Translate(request, timeout=WAIT_S)


# --- the API --------------------------------------------------------------------------------------


def test_list_models_get_model_info_and_translate_by_model(served: ServerThread) -> None:
    listed = served.stub.ListModels(pb.ListModelsRequest(), timeout=WAIT_S)
    assert listed.default_model == "numbers"
    # the latest version of each model (the default policy); each reports its memory
    assert [(m.name, m.version, m.is_default) for m in listed.models] == [
        ("echo", "1", False),
        ("numbers", "2", True),
    ]
    assert all(m.resident_memory_bytes > 0 for m in listed.models)
    info = served.stub.GetModelInfo(
        pb.ModelInfoRequest(model=pb.ModelSpec(name="echo")), timeout=WAIT_S
    )
    assert (info.name, info.version) == ("echo", "1")
    default_info = served.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=WAIT_S)
    assert (default_info.name, default_info.version, default_info.is_default) == (
        "numbers",
        "2",
        True,
    )
    texts = ["twenty one", "three hundred"]
    by_default = translate(served, texts)
    by_name = translate(served, texts, "echo")
    by_version = translate(served, texts, "numbers", "2")
    assert (by_default.model, by_default.model_version) == ("numbers", "2")
    assert (by_name.model, by_name.model_version) == ("echo", "1")
    assert by_version.model_version == "2"
    # the same weights under two names, loaded twice: the same translations
    assert [t.hypotheses[0].text for t in by_name.translations] == [
        t.hypotheses[0].text for t in by_default.translations
    ]


def test_an_unknown_model_or_version_is_not_found_with_the_names_served(
    served: ServerThread,
) -> None:
    missing = error_of(lambda: translate(served, ["one"], "nope"))
    assert missing.code() == Code.NOT_FOUND  # type: ignore[attr-defined]
    assert "['echo', 'numbers']" in missing.details()  # type: ignore[attr-defined]
    old = error_of(lambda: translate(served, ["one"], "numbers", "1"))  # on disk, not served
    assert old.code() == Code.NOT_FOUND  # type: ignore[attr-defined]
    assert "['2']" in old.details()  # type: ignore[attr-defined]
    info = error_of(
        lambda: served.stub.GetModelInfo(
            pb.ModelInfoRequest(model=pb.ModelSpec(name="nope")), timeout=WAIT_S
        )
    )
    assert info.code() == Code.NOT_FOUND  # type: ignore[attr-defined]
    assert metric(served.r, "s2s_rejected_requests_total", reason="not_found") == 3


def test_health_has_a_service_name_per_model(served: ServerThread) -> None:
    assert served.channel is not None
    for name in ("", SERVICE_NAME, f"{SERVICE_NAME}/numbers", f"{SERVICE_NAME}/echo"):
        assert health_status(served.channel, name) == SERVING
    unknown = error_of(lambda: health_status(served.channel, f"{SERVICE_NAME}/nope"))  # type: ignore[arg-type]
    assert unknown.code() == Code.NOT_FOUND  # type: ignore[attr-defined]


def test_metrics_are_labelled_by_model_and_version(served: ServerThread) -> None:
    translate(served, ["forty two"], "echo")
    translate(served, ["forty two", "seven"], "numbers")
    r = served.r
    assert metric(r, "s2s_model_requests_total", model="echo", version="1", code="OK") == 1
    assert metric(r, "s2s_model_requests_total", model="numbers", version="2", code="OK") == 1
    assert metric(r, "s2s_model_decoder_steps_total", model="echo", version="1") > 0
    assert metric(r, "s2s_model_resident_memory_bytes", model="numbers", version="2") > 0
    assert r.metrics.registry.get_sample_value(
        "s2s_model_info",
        {
            "name": "echo",
            "version": "1",
            "attention": r.engine.cfg.attention,
            "provider": "CPUExecutionProvider",
        },
    )


# --- reloads ------------------------------------------------------------------------------------


def test_a_reload_swaps_in_a_new_version_while_admitted_requests_finish_on_the_old(
    served: ServerThread, repo: Path, bundle: Path
) -> None:
    r = served.r
    old = r.repository.get("numbers")
    long_request = Opts(beam=5, max_length=128).request(["seven hundred seventy seven"] * 64)
    in_flight = served.stub.Translate.future(long_request, timeout=WAIT_S)
    wait_for(lambda: old.in_flight == 1, "the long request to hold version 2")
    add_version(repo, "numbers", "3", bundle)
    report = served.submit(r.reload()).result(WAIT_S)
    assert report.loaded == ["numbers:3"] and report.retired == ["numbers:2"]
    assert translate(served, ["one"], "numbers").model_version == "3"  # new requests: new version
    answered = in_flight.result(WAIT_S)
    assert answered.model_version == "2" and len(answered.translations) == 64  # finished on the old
    wait_for(lambda: old.in_flight == 0, "the old version's last request to be released")
    # unloaded: its series are gone (the label sets stay bounded by the loaded versions)
    assert (
        r.metrics.registry.get_sample_value(
            "s2s_model_resident_memory_bytes", {"model": "numbers", "version": "2"}
        )
        is None
    )
    assert metric(r, "s2s_model_reloads_total") == 1


def test_a_broken_version_is_refused_with_a_metric_and_the_old_one_keeps_serving(
    served: ServerThread, repo: Path, bundle: Path
) -> None:
    add_broken_version(repo, "numbers", "3", bundle)
    report = served.submit(served.r.reload()).result(WAIT_S)
    assert report.failed == ["numbers:3"] and not report.retired
    assert metric(served.r, "s2s_model_load_failures_total", model="numbers") == 1
    assert translate(served, ["one"], "numbers").model_version == "2"
    assert health_status(served.channel, f"{SERVICE_NAME}/numbers") == SERVING  # type: ignore[arg-type]


def test_a_removed_model_leaves_and_its_health_turns_not_serving(
    served: ServerThread, repo: Path
) -> None:
    shutil.rmtree(repo / "echo")
    served.submit(served.r.reload()).result(WAIT_S)
    assert error_of(lambda: translate(served, ["one"], "echo")).code() == Code.NOT_FOUND  # type: ignore[attr-defined]
    assert health_status(served.channel, f"{SERVICE_NAME}/echo") == NOT_SERVING  # type: ignore[arg-type]


def test_sighup_reloads_a_server_process(repo: Path, bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    argv = repo_args(repo, "--port", str(port), "--log-level", "INFO")
    log_path = tmp_path / "server.log"
    proc = start_server_process(argv, log_path)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.TranslatorStub(channel)

    def versions() -> list[str]:
        assert proc.poll() is None, log_path.read_text()
        try:
            listed = stub.ListModels(pb.ListModelsRequest(), timeout=5)
        except grpc.RpcError:
            return []
        return [f"{m.name}:{m.version}" for m in listed.models]

    try:
        wait_for(lambda: versions() == ["echo:1", "numbers:2"], "the server process", timeout=60)
        add_version(repo, "numbers", "3", bundle)
        time.sleep(0.5)
        assert versions() == ["echo:1", "numbers:2"]  # no polling: nothing changes by itself
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: versions() == ["echo:1", "numbers:3"], "the reload", timeout=60)
    finally:
        channel.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    text = log_path.read_text()
    assert '"message": "model version loaded"' in text and '"resident_bytes"' in text


# --- fairness -------------------------------------------------------------------------------------


def test_a_flood_of_one_model_does_not_hold_back_another_models_request(
    served: ServerThread,
) -> None:
    """512 queued sentences of `numbers`, then one of `echo`: echo's request must not wait for the
    flood (first in, first out would admit all 512 before it). Measured in decoder steps, not
    seconds: while echo's request is answered, numbers may step about as often as echo (the
    batches take turns) plus the few steps until a running sentence frees room, never the
    hundreds of steps the flood needs."""
    r = served.r
    flood_request = Opts(beam=5, max_length=64).request(["nine hundred ninety nine"] * 64)
    flood = [served.stub.Translate.future(flood_request, timeout=WAIT_S * 4) for _ in range(8)]
    wait_for(lambda: r.worker.queued_sentences >= 256, "the flood to queue")
    steps = {m: metric(r, "s2s_model_decoder_steps_total", model=m, version=v) for m, v in
             (("numbers", "2"), ("echo", "1"))}  # fmt: skip
    started = time.perf_counter()
    answer = translate(served, ["twelve"], "echo", beam=5)
    echo_latency = time.perf_counter() - started
    numbers_steps = metric(r, "s2s_model_decoder_steps_total", model="numbers", version="2")
    echo_steps = metric(r, "s2s_model_decoder_steps_total", model="echo", version="1")
    numbers_during = numbers_steps - steps["numbers"]
    echo_during = echo_steps - steps["echo"]
    still_queued = r.worker.queued_sentences
    results = [f.result(WAIT_S * 4) for f in flood]
    flood_steps = (
        metric(r, "s2s_model_decoder_steps_total", model="numbers", version="2") - steps["numbers"]
    )
    print(  # for the report: -s shows it
        f"echo answered in {echo_latency * 1000:.0f} ms with {echo_during:.0f} echo steps and "
        f"{numbers_during:.0f} numbers steps; {still_queued} flood sentences still queued; "
        f"the flood took {flood_steps:.0f} steps"
    )
    assert answer.model == "echo" and all(len(x.translations) == 64 for x in results)
    assert still_queued > 0, "the flood was over before echo's answer: nothing was measured"
    assert numbers_during <= echo_during + 20
    assert numbers_during < flood_steps / 4


# --- a reload under load ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs the loadtest extra")
def test_no_request_fails_under_locust_load_through_reloads(
    repo: Path, bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """locust (loadtest/run.py, a workload naming two models) against a server process polling its
    repository every 0.5 s; meanwhile a new version of one model arrives (swapped in, the old one
    retired and unloaded) and a broken version of the other (refused). Not one request fails."""
    from loadtest import run

    monkeypatch.setenv("S2S_RELOAD_INTERVAL_S", "0.5")
    monkeypatch.setenv("S2S_LOG_LEVEL", "INFO")
    out = tmp_path / "load"
    argv = [
        *("--models", str(repo), "--model-mix", "numbers,echo", "--mix", "short-long"),
        *("--users", "4", "--spawn-rate", "4", "--duration", "12s", "--policy", "iteration"),
        *("--out", str(out), "--slo-max-error-ratio", "0"),
    ]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        status = pool.submit(run.main, argv)
        wait_for(lambda: (out / "metrics-before.txt").is_file(), "locust to start", timeout=120)
        time.sleep(2.0)
        add_version(repo, "numbers", "3", bundle)  # swapped in under load
        time.sleep(3.0)
        add_broken_version(repo, "echo", "2", bundle)  # refused under load
        assert status.result(200) == run.EXIT_OK, (out / "locust.log").read_text()[-3000:]
    with open(out / "locust_stats.csv", newline="") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert int(rows["Aggregated"]["Request Count"]) > 20
    assert {"short-b5@numbers", "long-b5@echo"} <= set(rows)  # both models were asked
    metrics = (out / "metrics.txt").read_text()
    assert 'name="numbers",provider="CPUExecutionProvider",version="3"' in metrics
    assert 'version="2"' not in metrics.split("s2s_model_info")[1].split("# HELP")[0]
    assert 's2s_model_load_failures_total{model="echo"} 1.0' in metrics
    log = (out / "server.log").read_text()
    assert '"message": "model version unloaded"' in log and '"version": "2"' in log


def test_a_new_version_takes_requests_only_once_warmed_up(
    served: ServerThread, repo: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the new version warms up (held here), requests keep going to the old one, answered."""
    warming, release = threading.Event(), threading.Event()
    warm_up = service.serve.engine_host.warm_up

    def held_warm_up(engine: Engine) -> None:
        warming.set()
        assert release.wait(WAIT_S)
        warm_up(engine)

    monkeypatch.setattr(service.serve.engine_host, "warm_up", held_warm_up)
    add_version(repo, "numbers", "3", bundle)
    reloading = served.submit(served.r.reload())
    assert warming.wait(WAIT_S)
    assert translate(served, ["one"], "numbers").model_version == "2"  # still the old one
    release.set()
    assert reloading.result(WAIT_S).loaded == ["numbers:3"]
    assert translate(served, ["one"], "numbers").model_version == "3"
