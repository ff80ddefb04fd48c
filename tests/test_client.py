"""Tests for service/cli/client.py: pb converters, CLI parsing, and the client and CLI against a fake servicer.

The fake `Translator` reverses each text's words and aligns target word t to source word S-1-t, so
every answer is computed from the request and checkable without a model.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.client import (
    TranslatorClient,
    alignment_mode,
    channel_credentials,
    main,
    parse_args,
)
from service.decode.shared.alignment import pharaoh, render_text_heatmap
from service.serve.protocol import alignment_from_pb, decoding_options_to_pb, translation_from_pb

# --- a fake servicer ----------------------------------------------------------------------------


def reversed_translation(text: str, n_best: int, with_alignment: bool) -> pb.Translation:
    """Target = source words reversed; hypothesis i scores -i - 0.5; anti-diagonal alignment."""
    source = text.split()
    target = source[::-1]
    S = len(source)
    matrix = np.eye(S, dtype=np.float32)[::-1]  # (T=S, S): target t attends to source S-1-t
    hypotheses = []
    for i in range(n_best):
        hypothesis = pb.Hypothesis(
            text=" ".join(target), tokens=target, score=-i - 0.5, log_prob=-(i + 1.0), finished=True
        )
        if with_alignment:
            hypothesis.alignment.CopyFrom(
                pb.Alignment(
                    rows=S,
                    cols=S,
                    weights=matrix.ravel().tolist(),
                    source_tokens=source,
                    target_tokens=target,
                    pharaoh=pharaoh(matrix),
                )
            )
        hypotheses.append(hypothesis)
    return pb.Translation(hypotheses=hypotheses, source_tokens=source)


class FakeTranslator(pb_grpc.TranslatorServicer):
    def __init__(self) -> None:
        self.requests: list[pb.TranslateRequest] = []
        self.time_remaining: list[float | None] = []

    def Translate(
        self, request: pb.TranslateRequest, context: grpc.ServicerContext
    ) -> pb.TranslateResponse:
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        if any(not text.strip() for text in request.texts):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text is empty")
        options = request.options
        n_best = options.n_best if options.HasField("n_best") else 1
        with_alignment = options.alignment in (pb.ALIGNMENT_MODE_SUBWORD, pb.ALIGNMENT_MODE_WORD)
        return pb.TranslateResponse(
            translations=[reversed_translation(t, n_best, with_alignment) for t in request.texts],
            request_id=request.request_id or "generated",
            model_version="0.0.1",
        )

    def GetModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.ServicerContext
    ) -> pb.ModelInfo:
        return pb.ModelInfo(
            name="fake",
            version="0.0.1",
            architecture_json=json.dumps({"attention": "additive", "hidden": 8}),
            limits=pb.Limits(max_texts=4, max_beam_size=8),
            defaults=pb.DecodingOptions(beam_size=5, n_best=1),
            execution_providers=["CPUExecutionProvider"],
        )


def start_fake(
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, FakeTranslator, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = FakeTranslator()
    pb_grpc.add_TranslatorServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, servicer, port


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeTranslator, str]]:
    """A running fake server; yields (servicer, target)."""
    server, servicer, port = start_fake()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


# --- converters ---------------------------------------------------------------------------------


def test_alignment_from_pb_reshapes_row_major() -> None:
    message = pb.Alignment(
        rows=2,
        cols=3,
        weights=[0, 1, 2, 3, 4, 5],
        source_tokens=["a", "b", "c"],
        target_tokens=["x", "y"],
        pharaoh="2-0 2-1",
    )
    alignment = alignment_from_pb(message)
    assert alignment is not None
    assert alignment.matrix.shape == (2, 3)
    assert alignment.matrix.dtype == np.float32
    assert alignment.matrix[1].tolist() == [3, 4, 5]
    assert alignment.source_tokens == ["a", "b", "c"]
    assert alignment.target_tokens == ["x", "y"]
    assert alignment.pharaoh == "2-0 2-1"


def test_empty_alignment_is_none() -> None:
    assert alignment_from_pb(pb.Alignment()) is None
    assert alignment_from_pb(pb.Alignment(rows=3, cols=0)) is None


def test_alignment_with_wrong_weight_count_is_refused() -> None:
    with pytest.raises(ValueError, match="5 weights, expected 2 x 3"):
        alignment_from_pb(pb.Alignment(rows=2, cols=3, weights=[0.2] * 5))


def test_translation_from_pb() -> None:
    message = reversed_translation("a b c", n_best=2, with_alignment=True)
    message.hypotheses[1].ClearField("alignment")
    t = translation_from_pb(message, "a b c")
    assert t.source == "a b c"
    assert t.source_tokens == ["a", "b", "c"]
    assert [h.score for h in t.hypotheses] == [-0.5, -1.5]
    assert t.best.text == "c b a"
    assert t.best.tokens == ["c", "b", "a"]
    assert t.best.log_prob == -1.0
    assert t.best.finished
    assert t.best.alignment is not None
    np.testing.assert_array_equal(t.best.alignment.matrix, np.eye(3)[::-1])
    assert t.best.alignment.pharaoh == "2-0 1-1 0-2"
    assert t.hypotheses[1].alignment is None


def test_decoding_options_set_only_what_is_given() -> None:
    options = decoding_options_to_pb(beam_size=4, length_penalty=0.6, alignment="word")
    assert options.HasField("beam_size") and options.beam_size == 4
    assert options.length_penalty == pytest.approx(0.6)
    assert not options.HasField("n_best")
    assert not options.HasField("max_length")
    assert not options.HasField("coverage_penalty")
    assert options.alignment == pb.ALIGNMENT_MODE_WORD
    assert decoding_options_to_pb().alignment == pb.ALIGNMENT_MODE_NONE
    with pytest.raises(ValueError, match="alignment must be one of"):
        decoding_options_to_pb(alignment="phrase")


def test_channel_credentials() -> None:
    assert channel_credentials(None, None, None) is None
    with pytest.raises(ValueError, match="both tls_cert and tls_key"):
        channel_credentials(None, "client.pem", None)


# --- CLI parsing --------------------------------------------------------------------------------


def test_parse_args_defaults() -> None:
    args = parse_args(["hello"])
    assert args.texts == ["hello"]
    assert args.server == "localhost:50051"
    assert args.beam_size is None and args.n_best is None
    assert args.timeout == 30.0
    assert not args.json and not args.round_robin
    assert alignment_mode(args) == "none"


def test_parse_args_all_flags() -> None:
    argv = "--server dns:///s2s:50051 --beam 4 --nbest 2 --align word --heatmap h.png --json --timeout 2.5"
    argv += " --round-robin --tls-ca ca.pem --tls-cert c.pem --tls-key c.key a b"
    args = parse_args(argv.split())
    assert (args.server, args.beam_size, args.n_best, args.align) == (
        "dns:///s2s:50051",
        4,
        2,
        "word",
    )
    assert args.heatmap == Path("h.png")
    assert args.json and args.round_robin
    assert args.timeout == 2.5
    assert (args.tls_ca, args.tls_cert, args.tls_key) == ("ca.pem", "c.pem", "c.key")
    assert args.texts == ["a", "b"]
    assert alignment_mode(args) == "word"


def test_heatmap_alone_asks_for_subword_alignment() -> None:
    assert alignment_mode(parse_args(["--heatmap", "h.png", "x"])) == "subword"


@pytest.mark.parametrize(
    "argv", [["--align", "phrase", "x"], ["--tls-cert", "c.pem", "x"], ["--beam", "two"]]
)
def test_parse_args_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


# --- client against the fake server ---------------------------------------------------------------


def test_translate_returns_plain_results_in_order(fake: tuple[FakeTranslator, str]) -> None:
    servicer, target = fake
    with TranslatorClient(target, timeout=7.0) as client:
        results = client.translate(
            ["hello world", "a b c"], beam_size=3, n_best=2, alignment="subword", request_id="r1"
        )
    assert [t.source for t in results] == ["hello world", "a b c"]
    assert [t.best.text for t in results] == ["world hello", "c b a"]
    assert len(results[0].hypotheses) == 2
    alignment = results[1].best.alignment
    assert alignment is not None
    np.testing.assert_array_equal(alignment.matrix, np.eye(3)[::-1])
    assert alignment.source_tokens == ["a", "b", "c"]
    request = servicer.requests[-1]
    assert request.request_id == "r1"
    assert request.options.beam_size == 3 and request.options.n_best == 2
    assert not request.options.HasField("max_length")
    # The wire carries the timeout, not the deadline, and gRPC may round it up a little,
    # so the server can see slightly more than 7 s left; it must not see the default or none.
    remaining = servicer.time_remaining[-1]
    assert remaining is not None and 0 < remaining <= 7.5


def test_translate_without_alignment(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with TranslatorClient(target) as client:
        (result,) = client.translate(["one two"])
    assert result.best.text == "two one"
    assert result.best.alignment is None


def test_model_info_is_a_dict(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with TranslatorClient(target) as client:
        info = client.model_info()
    assert info["name"] == "fake"
    assert info["architecture"] == {"attention": "additive", "hidden": 8}
    assert info["limits"]["max_texts"] == 4
    assert info["limits"]["max_length"] == 0
    assert info["execution_providers"] == ["CPUExecutionProvider"]


def test_grpc_errors_propagate(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with TranslatorClient(target) as client, pytest.raises(grpc.RpcError) as caught:
        client.translate(["fine", "   "])
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "text is empty"


def test_round_robin_over_dns_target(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with TranslatorClient(f"dns:///{target}", round_robin=True, timeout=5.0) as client:
        assert client.translate(["x y"])[0].best.text == "y x"


# --- CLI against the fake server ------------------------------------------------------------------


def test_cli_prints_translations(
    fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = fake
    assert main(["--server", target, "hello world", "a b"]) == 0
    assert capsys.readouterr().out == "world hello\nb a\n"


def test_cli_align_prints_pharaoh_and_text_heatmap(
    fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = fake
    assert main(["--server", target, "--align", "word", "hello world"]) == 0
    heatmap = render_text_heatmap(np.eye(2)[::-1], ["hello", "world"], ["world", "hello"])
    assert capsys.readouterr().out == f"world hello\n1-0 0-1\n{heatmap}\n"


def test_cli_nbest_prints_scores(
    fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = fake
    assert main(["--server", target, "--nbest", "2", "p q"]) == 0
    assert capsys.readouterr().out == "-0.5000\tq p\n-1.5000\tq p\n"


def test_cli_json_reads_stdin(
    fake: tuple[FakeTranslator, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, target = fake
    monkeypatch.setattr("sys.stdin", io.StringIO("one two\n\nthree\n"))
    assert main(["--server", target, "--json", "--align", "subword"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["source"] for line in lines] == ["one two", "three"]
    best = lines[0]["hypotheses"][0]
    assert best["text"] == "two one"
    assert best["alignment"]["matrix"] == [[0.0, 1.0], [1.0, 0.0]]
    assert best["alignment"]["pharaoh"] == "1-0 0-1"


def test_cli_saves_heatmap_png(
    fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    _, target = fake
    out = tmp_path / "first.png"
    assert main(["--server", target, "--heatmap", str(out), "a b", "c d"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"heatmap saved to {out}" in capsys.readouterr().err


def test_cli_reports_grpc_errors(
    fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = fake
    assert main(["--server", target, " "]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: INVALID_ARGUMENT: text is empty\n"


def test_cli_without_texts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["--server", "127.0.0.1:1"]) == 2
    assert "no texts" in capsys.readouterr().err


# --- mutual TLS -----------------------------------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificate(name: str, san: str, cwd: Path) -> None:
    """name.key and name.pem signed by ca.pem, valid for `san`."""
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all P-256."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH: cannot make test certificates")
    cwd = tmp_path_factory.mktemp("tls")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        cwd=cwd,
    )
    make_certificate("server", "IP:127.0.0.1,DNS:localhost", cwd)
    make_certificate("client", "DNS:client", cwd)
    return cwd


def test_mutual_tls(certificates: Path) -> None:
    d = certificates
    credentials = grpc.ssl_server_credentials(
        [((d / "server.key").read_bytes(), (d / "server.pem").read_bytes())],
        root_certificates=(d / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server, _, port = start_fake(credentials)
    target = f"127.0.0.1:{port}"
    try:
        tls: dict[str, Any] = {
            "tls_ca": str(d / "ca.pem"),
            "tls_cert": str(d / "client.pem"),
            "tls_key": str(d / "client.key"),
        }
        with TranslatorClient(target, timeout=5.0, **tls) as client:
            assert client.translate(["secure channel"])[0].best.text == "channel secure"
        with (
            TranslatorClient(target, timeout=5.0, tls_ca=tls["tls_ca"]) as client,
            pytest.raises(grpc.RpcError),
        ):
            client.translate(["no client certificate"])
    finally:
        server.stop(None)
