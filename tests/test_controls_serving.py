"""The decoding controls over the wire: gRPC, HTTP/JSON and the client answer as the engine does,
requests with different controls share the server's running batch without changing each other's
answers, and bad values are INVALID_ARGUMENT naming the field and the allowed range."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import grpc
import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.cli.client import TranslatorClient
from service.decode.engine.engine import Engine
from service.decode.shared.options import SearchOptions
from tests.test_http import call, http, port_of  # noqa: F401  (the fixture)
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    bundle,
    engine,
    error_of,
    server,
    texts,
)

CONTROLS: list[dict[str, Any]] = [
    {"no_repeat_ngram_size": 2},
    {"repetition_penalty": 1.5},
    {"min_length": 3},
    {"target_prefix": ["un"]},
    {"return_alternatives": 3, "beam_size": 4, "target_prefix": ["un"]},
    {"sampling_topk": 4, "seed": 9, "n_best": 2, "beam_size": 2},
    {"suppress": ["deux"]},
    {"stopping": "patience", "patience": 2.0, "length_penalty": 1.0},
    {"stopping": "first", "length_penalty": 1.0},
    {"replace_unknowns": True},
]


def as_options(values: dict[str, Any]) -> SearchOptions:
    base: dict[str, Any] = {"beam_size": 3, **values}
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in base.items()}
    return SearchOptions(**given)


def texts_of(response: pb.TranslateResponse) -> list[list[str]]:
    return [[h.text for h in t.hypotheses] for t in response.translations]


@pytest.mark.parametrize("values", CONTROLS, ids=lambda v: ",".join(v))
def test_grpc_and_the_client_answer_as_the_engine(
    server: ServerThread,  # noqa: F811
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
    values: dict[str, Any],
) -> None:
    one = texts[:1]
    want = engine.translate(one, as_options(values), "none")
    message = pb.DecodingOptions(**{"beam_size": 3, **values})
    got = server.stub.Translate(pb.TranslateRequest(texts=one, options=message), timeout=30)
    assert texts_of(got) == [[h.text for h in t.hypotheses] for t in want]
    with TranslatorClient(f"127.0.0.1:{server.r.port}") as client:
        (translation,) = client.translate(one, **{"beam_size": 3, **values})
    assert [h.text for h in translation.hypotheses] == texts_of(got)[0]
    assert [h.token_log_probs for h in translation.hypotheses] == [
        tuple(h.token_log_probs) for h in got.translations[0].hypotheses
    ]


def test_mixed_controls_in_one_running_batch_answer_as_each_alone(
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    def send(values: dict[str, Any]) -> list[list[str]]:
        message = pb.DecodingOptions(**{"beam_size": 3, **values})
        request = pb.TranslateRequest(texts=texts[:3], options=message)
        if "target_prefix" in values:
            request.options.ClearField("target_prefix")
            request.options.target_prefix.extend(values["target_prefix"] * 3)
        return texts_of(server.stub.Translate(request, timeout=30))

    alone = [send(v) for v in CONTROLS]
    with concurrent.futures.ThreadPoolExecutor(len(CONTROLS)) as pool:
        together = list(pool.map(send, CONTROLS))
    assert together == alone


def test_http_json_takes_the_controls(
    http: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    body = {
        "texts": texts[:1],
        "options": {"beam_size": 4, "target_prefix": ["un"], "return_alternatives": 3},
    }
    answer = call(port_of(http), "/v1/Translate", body)
    assert answer.status == 200
    hyps = answer.body["translations"][0]["hypotheses"]
    assert all(h["text"].startswith("un") for h in hyps)
    assert all(h["alternative"]["position"] == 1 for h in hyps)
    refused = call(
        port_of(http), "/v1/Translate", {"texts": texts[:1], "options": {"stopping": "x"}}
    )
    assert refused.status == 400
    assert "stopping must be one of exact, first, patience, narrowing" in refused.body["message"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"no_repeat_ngram_size": 99}, "no_repeat_ngram_size must be between 0 and 16, got 99"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number in [0.01, 100]"),
        ({"sampling_topp": 1.5}, "sampling_topp must be a finite number in [0, 1], got 1.5"),
        (
            {"return_alternatives": 9, "beam_size": 3},
            "return_alternatives (9) must be between 0 and beam_size (3)",
        ),
        ({"target_prefix": ["un", "deux"]}, "target_prefix has 2 entries for 1 texts"),
        ({"suppress": [" "]}, "suppress[0] is empty"),
        ({"target_prefix": ["☃☃ ☃"]}, "cannot spell '☃' (U+2603 SNOWMAN)"),
        ({"suppress": ["un\x00"]}, "suppress[0] has control characters (U+0000)"),
        ({"target_prefix": ["And\x00 he"]}, "target_prefix[0] has control characters (U+0000"),
        (
            {"stopping": "later"},
            "stopping must be one of exact, first, patience, narrowing, heuristic, got 'later'",
        ),
    ],
)
def test_bad_controls_are_invalid_argument_naming_the_field(
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
    values: dict[str, Any],
    message: str,
) -> None:
    request = pb.TranslateRequest(texts=texts[:1], options=pb.DecodingOptions(**values))
    err = error_of(lambda: server.stub.Translate(request, timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.details() or "")


def test_model_info_reports_the_new_limits(server: ServerThread) -> None:  # noqa: F811
    info = server.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert (info.limits.max_prefix_tokens, info.limits.max_ngram_size) == (128, 16)
    assert (info.limits.max_alternatives, info.limits.max_suppress) == (16, 256)
    assert info.defaults.stopping == "exact" and info.defaults.sampling_topk == 1
