"""The HTTP/JSON face end to end: real servers (gRPC and HTTP in one process) on 127.0.0.1.

Every answer is compared with the gRPC API's for the same request, so the two faces cannot drift;
the error cases check the HTTP status, the gRPC code in the body and that the message says what
to change.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

import service.serve.status
from proto.translation.v1 import translation_pb2 as pb
from service.serve.http_api import HTTP_STATUS
from tests.test_client import certificates  # noqa: F401  (the fixture)
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    base_args,
    bundle,
    engine,
    requests_done,
    server,
    texts,
)


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def call(
    port: int,
    path: str,
    body: bytes | str | dict[str, Any] | None = None,
    *,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    scheme: str = "http",
    context: ssl.SSLContext | None = None,
) -> Answer:
    """One HTTP request; JSON bodies get Content-Type: application/json unless headers say otherwise."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    data = data.encode() if isinstance(data, str) else data
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(
        f"{scheme}://127.0.0.1:{port}{path}", data=data, headers=all_headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        raw, status, got = err.read(), err.code, dict(err.headers)
    return Answer(status, json.loads(raw) if raw else {}, got)


@pytest.fixture(scope="module")
def http(bundle: Path, engine: Any) -> Iterator[ServerThread]:  # noqa: F811
    srv = ServerThread.start(
        [*base_args(bundle), "--no-warmup", "--http-port", "0", "--max-texts", "8"], engine
    )
    yield srv
    srv.close()


@pytest.fixture
def start_http(bundle: Path, engine: Any) -> Iterator[Callable[..., ServerThread]]:  # noqa: F811
    servers: list[ServerThread] = []

    def start(*extra: str) -> ServerThread:
        srv = ServerThread.start(
            [*base_args(bundle), "--no-warmup", "--http-port", "0", *extra], engine
        )
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()


def port_of(srv: ServerThread) -> int:
    assert srv.r.http_port is not None
    return srv.r.http_port


def test_translate_answers_as_grpc_does(http: ServerThread, texts: list[str]) -> None:  # noqa: F811
    request = pb.TranslateRequest(
        texts=texts[:3],
        options=pb.DecodingOptions(beam_size=4, n_best=3, alignment=pb.ALIGNMENT_MODE_WORD),
        request_id="same-id",
    )
    expected = http.stub.Translate(request, timeout=30)
    body = json_format.MessageToDict(request)  # lowerCamelCase, as the mapping prints
    answer = call(port_of(http), "/v1/Translate", body)
    assert answer.status == 200, answer.body
    assert answer.headers["X-Request-Id"] == "same-id"
    got = json_format.ParseDict(answer.body, pb.TranslateResponse())
    assert got == expected  # every hypothesis, score and alignment weight, to the bit
    hypothesis = answer.body["translations"][0]["hypotheses"][0]
    assert {"text", "tokens", "score", "log_prob", "finished", "alignment"} <= set(hypothesis)


def test_field_names_either_way_and_enum_by_number(http: ServerThread, texts: list[str]) -> None:  # noqa: F811
    snake = {"texts": texts[:1], "options": {"beam_size": 2, "alignment": 3}, "request_id": "x"}
    camel = {"texts": texts[:1], "options": {"beamSize": 2, "alignment": "ALIGNMENT_MODE_WORD"}}
    camel["requestId"] = "x"
    a, b = call(port_of(http), "/v1/Translate", snake), call(port_of(http), "/v1/Translate", camel)
    assert a.status == b.status == 200
    assert a.body == b.body


def test_model_info_by_get_and_post(http: ServerThread) -> None:
    expected = json_format.MessageToDict(
        http.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,  # as the HTTP face prints: empty lists too
    )
    got = call(port_of(http), "/v1/GetModelInfo", method="GET")
    posted = call(port_of(http), "/v1/GetModelInfo", {})
    assert got.status == posted.status == 200
    assert got.body == posted.body
    assert {k: v for k, v in got.body.items() if k in expected} == expected
    assert got.body["limits"]["max_texts"] == 8


OVERSIZE = 4 * 1024 * 1024 + 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "says"),
    [
        ('{"texts": ["a"', None, 400, "INVALID_ARGUMENT", "not valid JSON"),
        ('["a"]', None, 400, "INVALID_ARGUMENT", "must be a JSON object"),
        ('{"textz": ["a"]}', None, 400, "INVALID_ARGUMENT", 'no field named "textz"'),
        ('{"texts": "a"}', None, 400, "INVALID_ARGUMENT", "repeated field texts must be in []"),
        ('{"texts": [1]}', None, 400, "INVALID_ARGUMENT", "texts field"),
        ('{"texts": ["a"], "options": {"beam_size": -2}}', None, 400, "INVALID_ARGUMENT", "-2"),
        ('{"texts": ["a"], "options": {"beam_size": 99}}', None, 400, "INVALID_ARGUMENT", "beam_size must be between 1 and 16"),
        ('{"texts": ["a"], "options": {"beam_size": 2, "n_best": 3}}', None, 400, "INVALID_ARGUMENT", "n_best"),
        ('{"texts": ["a"], "options": {"alignment": "WORDS"}}', None, 400, "INVALID_ARGUMENT", "Invalid enum value WORDS"),
        ('{"texts": []}', None, 400, "INVALID_ARGUMENT", "texts is empty"),
        ('{"texts": ["a","b","c","d","e","f","g","h","i"]}', None, 400, "INVALID_ARGUMENT", "over the limit of 8"),
        ('{"texts": ["a"]}', {"Content-Type": "text/plain"}, 415, "INVALID_ARGUMENT", "Content-Type: application/json"),
        ('{"texts": ["a"]}', {"X-Timeout": "soon"}, 400, "INVALID_ARGUMENT", "timeout must be a positive number"),
        ('{"texts": ["a"]}', {"X-Timeout": "-1"}, 400, "INVALID_ARGUMENT", "timeout must be a positive number"),
        (b'{"texts": ["\xff"]}', None, 400, "INVALID_ARGUMENT", "not valid JSON"),
        ("x" * OVERSIZE, None, 413, "INVALID_ARGUMENT", "over the server's message limit of 4194304 bytes"),
    ],
    ids=[
        "bad-json", "not-object", "unknown-field", "wrong-type-list", "wrong-type-item",
        "negative-uint", "beam-over-limit", "n-best-over-beam", "unknown-enum", "no-texts",
        "too-many-texts", "not-json-content-type", "timeout-not-a-number", "timeout-negative",
        "not-utf8", "oversize-body",
    ],
)  # fmt: skip
def test_errors_have_status_code_and_message(
    http: ServerThread,
    body: str | bytes,
    headers: dict[str, str] | None,
    status: int,
    code: str,
    says: str,
) -> None:
    before = requests_done(http.r, code, protocol="http")
    answer = call(port_of(http), "/v1/Translate", body, headers=headers)
    assert (answer.status, answer.body["code"]) == (status, code), answer.body
    assert says in answer.body["message"]
    assert requests_done(http.r, code, protocol="http") == before + 1


def test_oversize_body_without_length_is_refused_too(http: ServerThread) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b"x" * (1024 * 1024)

    request = urllib.request.Request(
        f"http://127.0.0.1:{port_of(http)}/v1/Translate",
        data=chunks(),
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 413
    assert "message limit" in json.loads(info.value.read())["message"]


def test_unknown_path_and_method_answer_json(http: ServerThread) -> None:
    missing = call(port_of(http), "/v1/Frobnicate", {})
    assert (missing.status, missing.body["code"]) == (404, "NOT_FOUND")
    assert "POST /v1/Translate" in missing.body["message"]
    wrong = call(port_of(http), "/v1/Translate", method="GET")
    assert wrong.status == 405
    assert call(port_of(http), "/", method="GET").status == 404  # no page without --ui


def test_deadline_from_timeout_parameter(http: ServerThread, texts: list[str]) -> None:  # noqa: F811
    body = {"texts": texts[:8], "options": {"beam_size": 16, "n_best": 16, "alignment": 2}}
    answer = call(port_of(http), "/v1/Translate?timeout=0.000001", body)
    assert (answer.status, answer.body["code"]) == (504, "DEADLINE_EXCEEDED"), answer.body
    assert requests_done(http.r, "DEADLINE_EXCEEDED", protocol="http") >= 1


def test_ok_counted_under_protocol_http(http: ServerThread, texts: list[str]) -> None:  # noqa: F811
    grpc_before = requests_done(http.r, "OK")
    before = requests_done(http.r, "OK", protocol="http")
    assert call(port_of(http), "/v1/Translate", {"texts": texts[:1]}).status == 200
    assert requests_done(http.r, "OK", protocol="http") == before + 1
    assert requests_done(http.r, "OK") == grpc_before


def test_every_status_the_server_maps_has_an_http_status() -> None:
    for code in service.serve.status.STATUS.values():
        assert code in HTTP_STATUS
    assert HTTP_STATUS[grpc.StatusCode.INVALID_ARGUMENT] == 400
    assert HTTP_STATUS[grpc.StatusCode.RESOURCE_EXHAUSTED] == 429
    assert HTTP_STATUS[grpc.StatusCode.UNAVAILABLE] == 503


def test_cross_origin_only_when_configured(start_http: Callable[..., ServerThread]) -> None:
    closed = start_http()
    allowed = "https://explorer.example"
    opened = start_http("--http-cors-origins", allowed)
    preflight = {"Origin": allowed, "Access-Control-Request-Method": "POST"}
    refused = call(port_of(closed), "/v1/Translate", method="OPTIONS", headers=preflight)
    assert (refused.status, refused.body["code"]) == (403, "PERMISSION_DENIED")
    assert "--http-cors-origins" in refused.body["message"]
    ok = call(port_of(opened), "/v1/Translate", method="OPTIONS", headers=preflight)
    assert ok.status == 204
    assert ok.headers["Access-Control-Allow-Origin"] == allowed
    other = {"Origin": "https://elsewhere.example"}
    assert (
        "Access-Control-Allow-Origin"
        not in call(port_of(opened), "/v1/GetModelInfo", method="GET", headers=other).headers
    )
    got = call(port_of(opened), "/v1/GetModelInfo", method="GET", headers={"Origin": allowed})
    assert got.headers["Access-Control-Allow-Origin"] == allowed


def test_ui_page_served_with_a_strict_policy(start_http: Callable[..., ServerThread]) -> None:
    srv = start_http("--ui")
    request = urllib.request.Request(f"http://127.0.0.1:{port_of(srv)}/")
    with urllib.request.urlopen(request, timeout=30) as response:
        page = response.read().decode()
        policy = response.headers["Content-Security-Policy"]
    assert "<html" in page.lower()
    assert "script-src 'self'" in policy
    assert "default-src 'none'" in policy


def test_https_with_the_grpc_certificate(
    start_http: Callable[..., ServerThread],
    certificates: Path,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    d = certificates
    srv = start_http("--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key"))
    context = ssl.create_default_context(cafile=str(d / "ca.pem"))
    answer = call(
        port_of(srv), "/v1/Translate", {"texts": texts[:1]}, scheme="https", context=context
    )
    assert answer.status == 200
    assert answer.body["translations"][0]["hypotheses"]
    with pytest.raises(OSError):  # plain HTTP is not served on the TLS port (reset or URLError)
        urllib.request.urlopen(f"http://127.0.0.1:{port_of(srv)}/v1/GetModelInfo", timeout=5)
