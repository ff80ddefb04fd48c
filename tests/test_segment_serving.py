"""Segmented inputs and confidence as served: gRPC (encoding ahead or not) and HTTP answer what the
engine answers, ModelInfo reports the segmentation and the threshold in use, --min-confidence marks
and counts, and both CLIs print the confidence."""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format

from proto.translation.v1 import translation_pb2 as pb
from service.cli import client as client_cli
from service.cli import translate
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.model.bundle import MANIFEST
from service.serve.protocol import hypothesis_from_pb
from service.serve.response_bound import input_shape, worst_case_response_bytes
from tests.conftest import DEFAULT_BUNDLE, REPO
from tests.test_http import call
from tests.test_server import ServerThread, base_args

LONG = "March 5, 2021 and forty-two, then $3.50, 12.5 and one thousand, two hundred and five"
TEXTS = [LONG, "ninety-seven", "the cat sat on the mat", "ten and eleven and twelve and 3:05 PM"]


@pytest.fixture(scope="module")
def seg_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/default with the numbers rules and a confidence threshold in its manifest."""
    out = tmp_path_factory.mktemp("served") / "bundle"
    shutil.copytree(DEFAULT_BUNDLE, out)
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    manifest["segmentation"] = json.loads(
        (REPO / "configs" / "numbers-segmentation.json").read_text(encoding="utf-8")
    )
    manifest["confidence"] = {"threshold": 0.95}
    (out / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def seg_engine(seg_bundle: Path) -> Engine:
    return Engine.load(seg_bundle)


@pytest.fixture(scope="module", params=["encode-ahead", "no-encode-ahead"])
def served(request: pytest.FixtureRequest, seg_bundle: Path) -> Iterator[ServerThread]:
    srv = ServerThread.start(
        [*base_args(seg_bundle), "--no-warmup", "--http-port", "0", f"--{request.param}"]
    )
    yield srv
    srv.close()


def grpc_request(alignment: pb.AlignmentMode = pb.ALIGNMENT_MODE_WORD) -> pb.TranslateRequest:
    return pb.TranslateRequest(
        texts=TEXTS, options=pb.DecodingOptions(beam_size=3, n_best=2, alignment=alignment)
    )


def test_grpc_and_http_answer_what_the_engine_answers(
    served: ServerThread, seg_engine: Engine
) -> None:
    response = served.stub.Translate(grpc_request(), timeout=60)
    want = seg_engine.translate(TEXTS, SearchOptions(beam_size=3, n_best=2), "word")
    assert len(response.translations) == len(TEXTS)
    for got, expected in zip(response.translations, want, strict=True):
        assert list(got.source_tokens) == expected.source_tokens
        assert len(got.hypotheses) == len(expected.hypotheses)
        for g, e in zip(got.hypotheses, expected.hypotheses, strict=True):
            assert g.text == e.text
            assert g.confidence == pytest.approx(e.confidence, rel=1e-6)
            assert g.low_confidence == (e.confidence < 0.95)
            h = hypothesis_from_pb(g)
            assert h.alignment is not None and e.alignment is not None
            np.testing.assert_allclose(h.alignment.matrix, e.alignment.matrix, atol=1e-6)
            assert h.alignment.source_tokens == e.alignment.source_tokens
    long = response.translations[0].hypotheses[0]
    assert long.text.count(", puis ") == 1 and long.text.count(" et ") >= 2
    body = json_format.MessageToDict(grpc_request(), preserving_proto_field_name=True)
    answer = call(served.r.http_port or 0, "/v1/Translate", body)
    assert answer.status == 200
    for t_json, t_pb in zip(answer.body["translations"], response.translations, strict=True):
        for h_json, h_pb in zip(t_json["hypotheses"], t_pb.hypotheses, strict=True):
            assert h_json["text"] == h_pb.text
            assert h_json["confidence"] == pytest.approx(h_pb.confidence)
            assert h_json["low_confidence"] == h_pb.low_confidence


def test_model_info_reports_the_segmentation_and_the_threshold(served: ServerThread) -> None:
    info = served.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert info.segmentation
    assert info.confidence_threshold == pytest.approx(0.95)


def test_min_confidence_overrides_the_manifest_and_counts_low_answers(
    seg_bundle: Path, seg_engine: Engine
) -> None:
    srv = ServerThread.start([*base_args(seg_bundle), "--no-warmup", "--min-confidence", "0.999"])
    try:
        info = srv.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
        assert info.confidence_threshold == pytest.approx(0.999)
        response = srv.stub.Translate(
            pb.TranslateRequest(texts=TEXTS, options=pb.DecodingOptions(beam_size=2)), timeout=60
        )
        best = [t.hypotheses[0] for t in response.translations]
        assert [h.low_confidence for h in best] == [h.confidence < 0.999 for h in best]
        low = sum(h.low_confidence for h in best)
        assert low >= 1  # the cat on the mat
        counted = srv.r.metrics.registry.get_sample_value("s2s_low_confidence_translations_total")
        assert counted == low
    finally:
        srv.close()


def test_the_response_bound_counts_every_segment_at_its_own_maximum(seg_engine: Engine) -> None:
    prepared = seg_engine.prepare(LONG)
    options = SearchOptions(beam_size=2, max_length_a=1.0, max_length_b=5)
    segmented = worst_case_response_bytes([input_shape(prepared)], options, "word", 8)
    whole = worst_case_response_bytes([len(prepared.ids)], options, "word", 8)
    assert segmented > whole  # five segments may each run to a * len + b


def test_translate_cli_prints_the_confidence(
    seg_bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("ninety-seven\nthe cat sat on the mat\n"))
    args = ["--bundle", str(seg_bundle), "--providers", "CPUExecutionProvider", "--threads", "1"]
    assert translate.main([*args, "--confidence", "--min-confidence", "0.9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    monkeypatch.setattr("sys.stdin", io.StringIO("ninety-seven\nthe cat sat on the mat\n"))
    assert translate.main([*args, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == len(records) == 2
    for line, record in zip(lines, records, strict=True):
        best = record["hypotheses"][0]
        column, text = line.split("\t")
        assert text == best["text"]
        assert float(column.rstrip("?")) == pytest.approx(best["confidence"], abs=1e-4)
        assert column.endswith("?") == (best["confidence"] < 0.9)
        n = len(best["tokens"]) + best["finished"]
        assert best["confidence"] == pytest.approx(math.exp(best["log_prob"] / n), abs=2e-4)
        assert best["low_confidence"] == (best["confidence"] < 0.95)  # the manifest's threshold


def test_client_cli_prints_the_confidence(
    served: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{served.r.port}"
    assert client_cli.main(["--server", target, "--confidence", "ninety-seven", "the cat sat"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert client_cli.main(["--server", target, "--json", "ninety-seven", "the cat sat"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for line, record in zip(lines, records, strict=True):
        best = record["hypotheses"][0]
        column, text = line.split("\t")
        assert text == best["text"]
        assert float(column.rstrip("?")) == pytest.approx(best["confidence"], abs=1e-4)
        assert column.endswith("?") == best["low_confidence"]
