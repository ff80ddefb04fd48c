"""Security of the serving surface: TLS and mutual TLS on the gRPC port (real servers, certificates
made here with the openssl CLI), message-size limits, no unsafe deserialization anywhere in the code,
and a metrics port that serves metrics and nothing else.

(The images' non-root USER is checked by tests/test_deploy.py::
test_dockerfile_builds_with_install_script_and_runs_unprivileged.)
"""

from __future__ import annotations

import ast
import http.client
import logging
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.client import TranslatorClient
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import AlignmentMode
from service.serve.protocol import MAX_REQUEST_ID_CHARS, translation_to_pb
from service.serve.response_bound import worst_case_response_bytes
from tests.conftest import DEFAULT_BUNDLE, REPO
from tests.test_client import make_certificate, openssl
from tests.test_server import (
    WAIT_S,
    Opts,
    ServerThread,
    assert_matches,
    base_args,
    error_of,
    metric,
    reference,
    requests_done,
)

Code = grpc.StatusCode
TEXTS = ["ninety-seven", "March 5, 2021"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(
        DEFAULT_BUNDLE, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )


@pytest.fixture
def start_server(engine: Engine) -> Iterator[Callable[..., ServerThread]]:
    """Servers on 127.0.0.1 sharing the loaded engine, with extra flags; closed after the test."""
    servers: list[ServerThread] = []

    def start(*extra: str) -> ServerThread:
        srv = ServerThread.start([*base_args(DEFAULT_BUNDLE), "--no-warmup", *extra], engine)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()


# --- TLS -----------------------------------------------------------------------------------------


def make_ca(cwd: Path) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", f"/CN={cwd.name}-ca"),
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """trusted/: a CA, a server certificate for 127.0.0.1 and a client certificate it signed;
    rogue/: another CA and a client certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH: cannot make test certificates")
    root = tmp_path_factory.mktemp("pki")
    for name in ("trusted", "rogue"):
        make_ca(root / name)
        make_certificate("client", "DNS:client", root / name)
    make_certificate("server", "IP:127.0.0.1,DNS:localhost", root / "trusted")
    return root


def tls_flags(pki: Path, client_ca: bool = False) -> list[str]:
    t = pki / "trusted"
    flags = ["--tls-cert", str(t / "server.pem"), "--tls-key", str(t / "server.key")]
    return [*flags, "--tls-client-ca", str(t / "ca.pem")] if client_ca else flags


def translate_with(
    target: str, credentials: grpc.ChannelCredentials | None
) -> pb.TranslateResponse:
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        return pb_grpc.TranslatorStub(channel).Translate(Opts(beam=2).request(TEXTS), timeout=10)


def read(path: Path) -> bytes:
    return path.read_bytes()


def test_tls_serves_clients_that_trust_its_certificate_and_no_one_else(
    start_server: Callable[..., ServerThread], engine: Engine, pki: Path
) -> None:
    srv = start_server(*tls_flags(pki))
    target, t = f"127.0.0.1:{srv.r.port}", pki / "trusted"
    with TranslatorClient(target, timeout=10, tls_ca=str(t / "ca.pem")) as client:
        got = client.translate(TEXTS, beam_size=2)
    assert [g.best.text for g in got] == [
        r.hypotheses[0].text for r in reference(engine, TEXTS, Opts(beam=2))
    ]
    refused = {
        "plaintext": None,
        "system roots": grpc.ssl_channel_credentials(),
        "another CA": grpc.ssl_channel_credentials(read(pki / "rogue" / "ca.pem")),
    }
    for name, credentials in refused.items():
        err = error_of(lambda c=credentials: translate_with(target, c))  # type: ignore[misc]
        assert err.code() == Code.UNAVAILABLE, name
    assert requests_done(srv.r, "OK") == 1  # the refused ones never reached the servicer


def test_mutual_tls_refuses_clients_without_a_certificate_signed_by_the_client_ca(
    start_server: Callable[..., ServerThread], engine: Engine, pki: Path
) -> None:
    srv = start_server(*tls_flags(pki, client_ca=True))
    target, t, r = f"127.0.0.1:{srv.r.port}", pki / "trusted", pki / "rogue"
    mine = grpc.ssl_channel_credentials(
        read(t / "ca.pem"), read(t / "client.key"), read(t / "client.pem")
    )
    assert_matches(translate_with(target, mine), reference(engine, TEXTS, Opts(beam=2)))
    refused = {
        "plaintext": None,
        "no client certificate": grpc.ssl_channel_credentials(read(t / "ca.pem")),
        "certificate of another CA": grpc.ssl_channel_credentials(
            read(t / "ca.pem"), read(r / "client.key"), read(r / "client.pem")
        ),
    }
    for name, credentials in refused.items():
        err = error_of(lambda c=credentials: translate_with(target, c))  # type: ignore[misc]
        assert err.code() == Code.UNAVAILABLE, name
    assert requests_done(srv.r, "OK") == 1
    # the project's client, with its certificate, is let in too
    with TranslatorClient(
        target,
        timeout=10,
        tls_ca=str(t / "ca.pem"),
        tls_cert=str(t / "client.pem"),
        tls_key=str(t / "client.key"),
    ) as client:
        assert len(client.translate(TEXTS, beam_size=2)) == 2


def test_wrong_tls_files_stop_the_start_with_an_error_naming_them(
    engine: Engine, pki: Path
) -> None:
    t = pki / "trusted"
    cases = {
        "key of another certificate": (
            ["--tls-cert", str(t / "server.pem"), "--tls-key", str(t / "client.key")],
            str(t / "client.key"),
        ),
        "certificate file missing": (
            ["--tls-cert", str(t / "nowhere.pem"), "--tls-key", str(t / "server.key")],
            str(t / "nowhere.pem"),
        ),
        "not PEM": (
            ["--tls-cert", str(t / "server.csr"), "--tls-key", str(t / "server.key")],
            str(t / "server.csr"),
        ),
    }
    for name, (flags, named) in cases.items():
        srv = ServerThread()
        try:
            with pytest.raises((RuntimeError, OSError)) as info:
                srv.ready(srv.begin([*base_args(DEFAULT_BUNDLE), *flags], engine))
            assert named in str(info.value), (name, info.value)
        finally:
            srv.close()


def start_error(engine: Engine, *flags: str) -> BaseException:
    """The error create_server() raises with these flags (it must raise)."""
    srv = ServerThread()
    try:
        with pytest.raises((RuntimeError, OSError, ValueError)) as info:
            srv.ready(srv.begin([*base_args(DEFAULT_BUNDLE), *flags], engine))
        return info.value
    finally:
        srv.close()


def test_an_unusable_client_ca_is_named_and_the_valid_certificate_is_not_blamed(
    engine: Engine, pki: Path, tmp_path: Path
) -> None:
    t = pki / "trusted"
    garbage = tmp_path / "ca.pem"
    garbage.write_bytes(b"\xa0 not a certificate\n")
    for ca, says in (
        (garbage, "holds no PEM certificate"),
        (tmp_path / "nowhere.pem", "cannot read"),
    ):
        err = str(start_error(engine, *tls_flags(pki), "--tls-client-ca", str(ca)))
        assert str(ca) in err and says in err, err
        assert str(t / "server.pem") not in err and str(t / "server.key") not in err, err


def test_a_metrics_port_in_use_is_named(engine: Engine) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = start_error(engine, "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    assert isinstance(err, OSError) and f"127.0.0.1:{port}" in str(err), err
    assert "--metrics-port" in str(err)


# --- message sizes -------------------------------------------------------------------------------


def test_messages_over_the_size_limit_are_refused_and_the_server_keeps_serving(
    start_server: Callable[..., ServerThread], engine: Engine
) -> None:
    limit = 8192
    srv = start_server("--max-message-bytes", str(limit))
    running = srv.r
    with TranslatorClient(f"127.0.0.1:{running.port}", timeout=WAIT_S) as client:
        # a request over the limit: grpc refuses it before the servicer sees it
        err = error_of(lambda: client.translate(["seventy " * 250] * 5))
        assert err.code() == Code.RESOURCE_EXHAUSTED
        assert "larger than max" in err.details() and str(limit) in err.details()
        assert requests_done(running, "OK") + requests_done(running, "INVALID_ARGUMENT") == 0
        # a small request whose answer would be over the limit: refused by the servicer, and
        # counted as what the client got (grpc alone would fail the send after counting it OK)
        big = error_of(
            lambda: client.translate(TEXTS * 2, beam_size=16, n_best=16, alignment="word")
        )
        assert big.code() == Code.INVALID_ARGUMENT
        assert f"over the server's message limit of {limit}" in big.details()
        assert requests_done(running, "OK") == 0
        assert requests_done(running, "INVALID_ARGUMENT") == 1
        # and the next ordinary request is served
        got = client.translate(TEXTS, beam_size=2)
    want = reference(engine, TEXTS, Opts(beam=2))
    assert [g.best.text for g in got] == [w.hypotheses[0].text for w in want]


def test_a_request_whose_answer_could_be_too_big_is_refused_before_decoding(
    start_server: Callable[..., ServerThread], engine: Engine
) -> None:
    """Issue 16 point 3: 64 long texts at beam 16, n_best 16 with alignment used to decode for
    seconds (and take the server's memory past 0.5 GB) before being refused for the response's
    size. The worst case is known before decoding: refused at once, nothing decoded, and the limit
    is in ModelInfo."""
    srv = start_server()  # the default message limit, 4 MiB
    running = srv.r
    limit = running.settings.server.max_message_bytes
    text = " ".join(["nine hundred and ninety-nine"] * 12)
    request = pb.TranslateRequest(
        texts=[text] * 64,
        options=pb.DecodingOptions(beam_size=16, n_best=16, alignment=pb.ALIGNMENT_MODE_SUBWORD),
    )
    err = error_of(lambda: srv.stub.Translate(request, timeout=WAIT_S))
    assert err.code() == Code.INVALID_ARGUMENT
    assert "the response could reach" in err.details()
    assert f"over the server's message limit of {limit}" in err.details()
    assert "n_best" in err.details() and "alignment NONE" in err.details()
    assert metric(running, "s2s_decoder_step_duration_seconds_count") == 0  # nothing decoded
    info = srv.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=WAIT_S)
    assert info.limits.max_message_bytes == limit


@pytest.mark.parametrize("alignment", ["none", "subword", "word"])
def test_the_worst_case_response_size_bounds_real_responses(
    engine: Engine, alignment: AlignmentMode
) -> None:
    """The estimate the server refuses by is an upper bound of what it sends: texts whose
    translations run to the maximum length (max_length small), every hypothesis returned."""
    texts = [*TEXTS, "nine hundred and ninety-nine thousand", "December 31, 1999 at 11:59 pm"]
    for o in (
        SearchOptions(beam_size=4, n_best=4),
        SearchOptions(beam_size=3, n_best=2, max_length=3),
    ):
        got = engine.translate(texts, o, alignment)
        response = pb.TranslateResponse(
            translations=[translation_to_pb(t) for t in got],
            request_id="x" * MAX_REQUEST_ID_CHARS,
            model_version=engine.bundle.version,
        )
        lengths = [len(engine.prepare(t).ids) for t in texts]
        bound = worst_case_response_bytes(lengths, o, alignment, engine.max_piece_bytes)
        assert response.ByteSize() <= bound
        assert bound < 40 * response.ByteSize() or o.max_length > 3  # not absurdly loose


def test_request_ids_are_bounded(start_server: Callable[..., ServerThread]) -> None:
    """Issue 16 point 4: a request_id over the limit is refused, and neither echoed nor logged
    whole (a 3.9 MB id used to be both); an id at the limit is echoed as sent."""
    server = start_server()
    text = ["ninety-seven"]
    long_id = "x" * (4 * 1024 * 1024 - 1000)
    err = error_of(
        lambda: server.stub.Translate(
            pb.TranslateRequest(texts=text, request_id=long_id), timeout=WAIT_S
        )
    )
    assert err.code() == Code.INVALID_ARGUMENT
    assert f"over the limit of {MAX_REQUEST_ID_CHARS}" in err.details()
    assert len(err.details()) < 300
    ok_id = "y" * MAX_REQUEST_ID_CHARS
    got = server.stub.Translate(pb.TranslateRequest(texts=text, request_id=ok_id), timeout=WAIT_S)
    assert got.request_id == ok_id
    info = server.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=WAIT_S)
    assert info.limits.max_request_id_chars == MAX_REQUEST_ID_CHARS


def test_a_long_request_id_is_logged_cut(
    start_server: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server()
    with caplog.at_level(logging.INFO, logger="s2s.server"):
        error_of(
            lambda: server.stub.Translate(
                pb.TranslateRequest(texts=["ninety-seven"], request_id="z" * 100_000),
                timeout=WAIT_S,
            )
        )
    ids = [r.request_id for r in caplog.records if hasattr(r, "request_id")]  # type: ignore[attr-defined]
    assert ids and all(len(i) <= MAX_REQUEST_ID_CHARS + 3 for i in ids)


# --- no unsafe deserialization -------------------------------------------------------------------

UNSAFE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "joblib",
    "marshal",
    "shelve",
}
SCANNED = ("service", "export", "loadtest")  # the code that reads files and requests
SKIPPED_PARTS = {".venv", ".git", "runs", "data", "build", "dist", "__pycache__"}


def dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name/Attribute chain, "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_uses(source: str, strict: bool = True) -> list[str]:
    """What in `source` can run code from untrusted data: `torch.load` without weights_only=True,
    and (strict) pickle-family modules, yaml.load without a SafeLoader, np.load(allow_pickle=True),
    eval() and exec(). Each as "line: what"."""
    found = []
    torch_load_names = {"torch.load"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "torch":
            torch_load_names |= {a.asname or a.name for a in node.names if a.name == "load"}
        if isinstance(node, ast.Import):
            torch_load_names |= {
                f"{a.asname}.load" for a in node.names if a.name == "torch" and a.asname
            }
    for node in ast.walk(ast.parse(source)):
        where = getattr(node, "lineno", 0)
        if strict and isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            found += [f"{where}: import {m}" for m in modules if m.split(".")[0] in UNSAFE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        if name in torch_load_names and not is_true(keywords.get("weights_only")):
            found.append(f"{where}: {name} without weights_only=True")
        if not strict:
            continue
        if name in ("eval", "exec"):
            found.append(f"{where}: {name}()")
        if name.split(".")[-1] in (
            "load",
            "load_all",
            "unsafe_load",
            "full_load",
        ) and name.startswith("yaml."):
            loader = dotted(
                keywords.get("Loader") or (node.args[1] if len(node.args) > 1 else ast.Pass())
            )
            if not loader.endswith("SafeLoader"):
                found.append(f"{where}: {name} without a SafeLoader")
        if name in ("np.load", "numpy.load") and is_true(keywords.get("allow_pickle")):
            found.append(f"{where}: {name}(allow_pickle=True)")
    return found


def python_files(*top: str) -> list[Path]:
    """The Python files under the given top-level folders (default: the whole repository), without
    generated stubs, virtual environments and run outputs."""
    roots = [REPO / t for t in top] or [
        p
        for p in REPO.iterdir()
        if p.is_dir() and p.name not in SKIPPED_PARTS and not p.name.startswith(".")
    ]
    files = [p for root in roots for p in root.rglob("*.py")] + (
        [] if top else list(REPO.glob("*.py"))
    )
    return sorted(
        p
        for p in files
        if not SKIPPED_PARTS & set(p.relative_to(REPO).parts) and "_pb2" not in p.name
    )


def test_the_scanner_finds_every_unsafe_pattern() -> None:
    unsafe = """
import pickle
from dill import loads
import torch, torch as T, yaml, numpy as np
from torch import load as tl
torch.load("m.pt")
torch.load("m.pt", weights_only=False)
T.load("m.pt")
tl("m.pt")
yaml.load(text)
yaml.load(text, Loader=yaml.Loader)
np.load("a.npy", allow_pickle=True)
eval("1")
exec("x = 1")
"""
    assert len(unsafe_uses(unsafe)) == 11, unsafe_uses(unsafe)
    safe = """
import torch, yaml, numpy as np
torch.load("m.pt", map_location="cpu", weights_only=True)
yaml.load(text, Loader=yaml.SafeLoader)
yaml.safe_load(text)
np.load("a.npy")
model.eval()
"""
    assert unsafe_uses(safe) == []


def test_no_unsafe_deserialization_of_untrusted_files() -> None:
    scanned = python_files(*SCANNED)
    assert len(scanned) > 20 and (REPO / "export" / "train" / "checkpoint.py") in scanned
    problems = [
        f"{p.relative_to(REPO)}:{use}" for p in scanned for use in unsafe_uses(p.read_text())
    ]
    everywhere = python_files()  # torch.load anywhere (tests and benchmarks too)
    problems += [
        f"{p.relative_to(REPO)}:{use}"
        for p in everywhere
        for use in unsafe_uses(p.read_text(), strict=False)
    ]
    assert problems == []


# --- the metrics port ----------------------------------------------------------------------------

PATHS = [
    "/",
    "/metrics",
    "/metrics?name[]=s2s_queue_depth_sentences",
    "/etc/passwd",
    "/../../../../etc/passwd",
    "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/manifest.json",
    "/models/default/manifest.json",
    "/service/serve/server.py",
    "/translation.v1.Translator/Translate",
    "/grpc.health.v1.Health/Check",
    "/debug/pprof",
    "/favicon.ico",
]


def http_call(
    port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "text/plain"})
        reply = connection.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read().decode("utf-8", "replace")
    finally:
        connection.close()


def metric_families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def s2s_samples(text: str) -> dict[tuple[str, tuple[Any, ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("s2s_")
        for s in family.samples
    }


def test_the_metrics_port_serves_metrics_and_nothing_else(
    start_server: Callable[..., ServerThread],
) -> None:
    srv = start_server("--metrics-port", "0", "--metrics-host", "127.0.0.1")
    port = srv.r.metrics_port
    assert port
    srv.stub.Translate(Opts(beam=2).request(TEXTS), timeout=WAIT_S)
    secrets = ("root:", (DEFAULT_BUNDLE / "manifest.json").read_text()[:40], "def create_server")
    for path in PATHS:
        status, headers, text = http_call(port, "GET", path)
        assert status == 200, path
        if path == "/favicon.ico":  # prometheus_client answers it empty
            assert text == "", path
            continue
        assert headers["Content-Type"].startswith("text/plain"), path
        families = metric_families(text)
        assert families and all(f.startswith(("s2s_", "process_")) for f in families), path
        assert not any(secret in text for secret in secrets), path
    before = s2s_samples(http_call(port, "GET", "/metrics")[2])
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, text = http_call(port, method, "/metrics", b"s2s_queue_depth_sentences 99\n")
        assert status == 405 and "s2s_" not in text, method
    assert s2s_samples(http_call(port, "GET", "/metrics")[2]) == before  # nothing changed
    # and it is no gRPC endpoint
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.TranslatorStub(channel)
        err = error_of(lambda: stub.Translate(Opts().request(["one"]), timeout=5))
    assert err.code() == Code.UNAVAILABLE
