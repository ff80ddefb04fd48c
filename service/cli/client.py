"""Python client and command line for the Translator gRPC service.

    python -m service.cli.client --server localhost:50051 "ninety-seven"
    echo "March 5, 2021" | python -m service.cli.client --server localhost:50051 --align word
    python -m service.cli.client --server dns:///s2s-headless:50051 --round-robin --json --nbest 3 "..."
    python -m service.cli.client --server s2s.example:443 --tls-ca ca.pem --tls-cert me.pem --tls-key me.key "..."
    python -m service.cli.client --server localhost:50051 --list-services --model-info

`TranslatorClient` hides protobuf: it returns `ClientTranslation` dataclasses with numpy alignment
matrices. gRPC failures propagate as `grpc.RpcError` (use `.code()` and `.details()`); the CLI prints
them as `error: <CODE>: <details>` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.heatmap import save_heatmap_png
from service.cli.render import translation_to_json
from service.decode.alignment import render_text_heatmap
from service.decode.options import add_option_flags, options_from_args
from service.serve.protocol import (
    ClientAlignment,
    ClientHypothesis,
    ClientTranslation,
    decoding_options_to_pb,
    model_info_from_pb,
    translation_from_pb,
)

__all__ = ["ClientAlignment", "ClientHypothesis", "ClientTranslation", "TranslatorClient"]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
ROUND_ROBIN_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


# --- the client -------------------------------------------------------------------------------


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def channel_credentials(
    tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials from PEM files (None = plaintext); a client cert and key give mutual TLS.

    Without tls_ca the system's root certificates verify the server.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("mutual TLS needs both tls_cert and tls_key")
    if tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca),
        private_key=_read(tls_key),
        certificate_chain=_read(tls_cert),
    )


def channel_options(max_message_bytes: int, round_robin: bool) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if round_robin:  # spread calls over every address the resolver returns (dns:/// + headless)
        options.append(("grpc.service_config", ROUND_ROBIN_SERVICE_CONFIG))
    return options


class TranslatorClient:
    """A channel to one Translator service. Every call raises grpc.RpcError on failure."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        round_robin: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self.timeout = timeout
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        options = channel_options(max_message_bytes, round_robin)
        if credentials is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            self.channel = grpc.secure_channel(target, credentials, options=options)
        self._stub = pb_grpc.TranslatorStub(self.channel)

    def translate(
        self,
        texts: Sequence[str],
        *,
        alignment: str = "none",
        timeout: float | None = None,
        request_id: str = "",
        model: str = "",
        version: str = "",
        **options: float | None,
    ) -> list[ClientTranslation]:
        """One translation per text, in order.

        options are the decoding options by name (service/decode/options.py: beam_size, n_best,
        max_length, max_length_a, max_length_b, length_penalty, coverage_penalty); unset or None
        ones take the server's defaults. alignment is "none", "subword" or "word"; timeout
        (seconds) defaults to the client's. Raises grpc.RpcError (e.g. INVALID_ARGUMENT,
        RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, NOT_FOUND for a model not served), TypeError for
        an unknown option name. model (and version) pick a served model; empty: the default.
        """
        request = pb.TranslateRequest(
            texts=list(texts),
            options=decoding_options_to_pb(alignment, **options),
            request_id=request_id,
            model=pb.ModelSpec(name=model, version=version),
        )
        response = self._stub.Translate(
            request, timeout=self.timeout if timeout is None else timeout
        )
        if len(response.translations) != len(texts):
            raise ValueError(
                f"server returned {len(response.translations)} translations for {len(texts)} texts"
            )
        return [
            translation_from_pb(t, s) for t, s in zip(response.translations, texts, strict=True)
        ]

    def model_info(
        self, *, model: str = "", version: str = "", timeout: float | None = None
    ) -> dict[str, Any]:
        """A served model's name, version, architecture, limits and defaults (empty model: the
        default one). Raises grpc.RpcError (NOT_FOUND for a model not served)."""
        info = self._stub.GetModelInfo(
            pb.ModelInfoRequest(model=pb.ModelSpec(name=model, version=version)),
            timeout=self.timeout if timeout is None else timeout,
        )
        return model_info_from_pb(info)

    def list_models(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every served model version (as `model_info`'s dicts), by name then version."""
        response = self._stub.ListModels(
            pb.ListModelsRequest(), timeout=self.timeout if timeout is None else timeout
        )
        return [model_info_from_pb(m) for m in response.models]

    def list_services(self) -> list[str]:
        """The services the server offers, through its reflection service (what `grpcurl list`
        shows). Raises grpc.RpcError UNIMPLEMENTED when the server runs with --no-reflection."""
        return sorted(ProtoReflectionDescriptorDatabase(self.channel).get_services())

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> TranslatorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m service.cli.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "texts", nargs="*", metavar="TEXT", help="texts to translate (default: one per stdin line)"
    )
    p.add_argument("--server", default="localhost:50051", help="gRPC target (default: %(default)s)")
    p.add_argument("--model", default="", help="the served model to use (default: the server's)")
    p.add_argument("--model-version", default="", help="its version (default: the latest served)")
    add_option_flags(p, None)  # unset: the server's defaults
    p.add_argument(
        "--align",
        choices=("subword", "word"),
        help="also print the Pharaoh alignment and a text heatmap",
    )
    p.add_argument(
        "--heatmap", type=Path, help="save the first sentence's alignment matrix as a PNG"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per text")
    p.add_argument(
        "--confidence",
        action="store_true",
        help="begin each hypothesis line with its confidence in [0, 1], followed by '?' when the "
        "server marked it low_confidence",
    )
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per call (default: %(default)s)"
    )
    p.add_argument(
        "--round-robin",
        action="store_true",
        help="balance over every resolved address (dns:///...)",
    )
    p.add_argument(
        "--list-services",
        action="store_true",
        help="print the server's services (by reflection) and exit, like `grpcurl list`",
    )
    p.add_argument(
        "--model-info", action="store_true", help="print the served model's info as JSON and exit"
    )
    p.add_argument("--tls-ca", help="PEM root certificate(s) that verify the server (enables TLS)")
    p.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM client private key for mutual TLS (with --tls-cert)")
    args = p.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    return args


def alignment_mode(args: argparse.Namespace) -> str:
    """--align's mode; a --heatmap alone asks for subword alignments."""
    if args.align:
        return str(args.align)
    return "subword" if args.heatmap else "none"


def read_texts(args: argparse.Namespace) -> list[str]:
    """The TEXT arguments, else the non-blank stdin lines."""
    if args.texts:
        return list(args.texts)
    return [line.rstrip("\n") for line in sys.stdin if line.strip()]


def format_hypothesis(
    h: ClientHypothesis, show_score: bool, show_alignment: bool, show_confidence: bool = False
) -> str:
    first = f"{h.score:.4f}\t{h.text}" if show_score else h.text
    if show_confidence:
        first = f"{h.confidence:.4f}{'?' if h.low_confidence else ''}\t{first}"
    lines = [first]
    if show_alignment and h.alignment is not None:
        a = h.alignment
        lines.append(a.pharaoh)
        lines.append(render_text_heatmap(a.matrix, a.source_tokens, a.target_tokens))
    return "\n".join(lines)


def format_translation(t: ClientTranslation, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(translation_to_json(t), ensure_ascii=False)
    show_score = len(t.hypotheses) > 1
    return "\n".join(
        format_hypothesis(h, show_score, args.align is not None, args.confidence)
        for h in t.hypotheses
    )


def save_first_heatmap(translations: list[ClientTranslation], path: Path) -> Path:
    """The first sentence's best alignment as a PNG; ValueError when the response has none."""
    first = translations[0].best if translations and translations[0].hypotheses else None
    if first is None or first.alignment is None:
        raise ValueError("the response has no alignment to draw (does the model have attention?)")
    a = first.alignment
    return save_heatmap_png(a.matrix, a.source_tokens, a.target_tokens, path, title=first.text)


def describe(client: TranslatorClient, args: argparse.Namespace) -> None:
    """--list-services and --model-info: what a server offers, without translating."""
    if args.list_services:
        print("\n".join(client.list_services()))
    if args.model_info:
        print(json.dumps(client.model_info(), indent=2, ensure_ascii=False))


def run(args: argparse.Namespace) -> int:
    client_options = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    if args.list_services or args.model_info:
        with TranslatorClient(args.server, timeout=args.timeout, **client_options) as client:
            describe(client, args)
        return 0
    texts = read_texts(args)
    if not texts:
        print(
            "error: no texts to translate (give TEXT arguments or lines on stdin)", file=sys.stderr
        )
        return 2
    with TranslatorClient(
        args.server, timeout=args.timeout, round_robin=args.round_robin, **client_options
    ) as client:
        translations = client.translate(
            texts,
            alignment=alignment_mode(args),
            model=args.model,
            version=args.model_version,
            **options_from_args(args),
        )
    for t in translations:
        print(format_translation(t, args))
    if args.heatmap:
        print(f"heatmap saved to {save_first_heatmap(translations, args.heatmap)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except grpc.RpcError as err:
        code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        print(f"error: {code}: {details}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
