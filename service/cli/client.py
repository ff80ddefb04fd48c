"""Python client and command line for the Translator gRPC service.

    python -m service.cli.client --server localhost:50051 "ninety-seven"
    echo "March 5, 2021" | python -m service.cli.client --server localhost:50051 --align word
    python -m service.cli.client --server dns:///s2s-headless:50051 --round-robin --json --nbest 3 "..."
    python -m service.cli.client --server s2s.example:443 --tls-ca ca.pem --tls-cert me.pem --tls-key me.key "..."
    python -m service.cli.client --server localhost:50051 --list-services --model-info
    python -m service.cli.client --align-pairs "dog ||| chien"          # forced alignment (Align)
    python -m service.cli.client --source-file corpus.grc --target-file corpus.en --out links.txt

`TranslatorClient` hides protobuf: it returns `ClientTranslation` dataclasses with numpy alignment
matrices. gRPC failures propagate as `grpc.RpcError` (use `.code()` and `.details()`); the CLI prints
them as `error: <CODE>: <details>` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.heatmap import save_heatmap_png
from service.cli.parallel import read_parallel
from service.cli.render import (
    add_column_flags,
    alternative_column,
    origin_column,
    translation_to_json,
)
from service.decode.align.forced import AlignedPair
from service.decode.align.links import LINK_MODES
from service.decode.shared.alignment import render_text_heatmap
from service.decode.shared.options import add_option_flags, options_from_args
from service.serve.protocol import (
    ClientAlignment,
    ClientHypothesis,
    ClientTranslation,
    align_options_to_pb,
    aligned_pair_from_pb,
    decoding_options_to_pb,
    model_info_from_pb,
    translation_from_pb,
)

__all__ = [
    "AlignedPair",
    "ClientAlignment",
    "ClientHypothesis",
    "ClientTranslation",
    "TranslatorClient",
]

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


def translate_request(
    texts: Sequence[str],
    alignment: str,
    request_id: str,
    model: str,
    version: str,
    options: dict[str, Any],
) -> pb.TranslateRequest:
    """Translate's (and TranslateStream's) request; one target_prefix (a string, or a list of
    one) is every text's start."""
    prefix = options.get("target_prefix")
    if isinstance(prefix, str) or (prefix is not None and len(prefix) == 1 < len(texts)):
        single = prefix if isinstance(prefix, str) else prefix[0]
        options = {**options, "target_prefix": [single] * len(texts)}
    return pb.TranslateRequest(
        texts=list(texts),
        options=decoding_options_to_pb(alignment, **options),
        request_id=request_id,
        model=pb.ModelSpec(name=model, version=version),
    )


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
        **options: Any,
    ) -> list[ClientTranslation]:
        """One translation per text, in order.

        options are the decoding options by name (service/decode/shared/options.py: beam_size, n_best,
        max_length, ..., no_repeat_ngram_size, target_prefix (a list: one per text, or one string
        for every text), return_alternatives, sampling_topk, seed, suppress (a list), ...); unset
        or None ones take the server's defaults. alignment is "none", "subword" or "word"; timeout
        (seconds) defaults to the client's. Raises grpc.RpcError (e.g. INVALID_ARGUMENT,
        RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, NOT_FOUND for a model not served), TypeError for
        an unknown option name. model (and version) pick a served model; empty: the default.
        """
        request = translate_request(texts, alignment, request_id, model, version, options)
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

    def translate_stream(
        self,
        texts: Sequence[str],
        *,
        alignment: str = "none",
        timeout: float | None = None,
        request_id: str = "",
        model: str = "",
        version: str = "",
        **options: Any,
    ) -> Iterator[pb.TranslateStreamResponse]:
        """TranslateStream's messages as they come: each sentence final (`.sentence`, a
        SentenceChunk), then the whole answer (`.response`, Translate's). Arguments as
        `translate`'s; closing the iterator (or leaving its loop) cancels the call."""
        request = translate_request(texts, alignment, request_id, model, version, options)
        call = self._stub.TranslateStream(
            request, timeout=self.timeout if timeout is None else timeout
        )
        try:
            yield from call
        finally:
            call.cancel()

    def align_request(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        links: str | None = None,
        threshold: float | None = None,
        matrices: str = "both",
        markup: str | None = None,
        invalid_markup: str | None = None,
        attention_layer: int | None = None,
        attention_head: int | None = None,
        request_id: str = "",
        model: str = "",
        version: str = "",
    ) -> pb.AlignRequest:
        options = align_options_to_pb(
            links, threshold, matrices, markup, invalid_markup, attention_layer, attention_head
        )
        return pb.AlignRequest(
            pairs=[pb.AlignPair(source=s, target=t) for s, t in pairs],
            options=options,
            request_id=request_id,
            model=pb.ModelSpec(name=model, version=version),
        )

    def align(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        links: str | None = None,
        threshold: float | None = None,
        matrices: str = "both",
        markup: str | None = None,
        invalid_markup: str | None = None,
        attention_layer: int | None = None,
        attention_head: int | None = None,
        timeout: float | None = None,
        request_id: str = "",
        model: str = "",
        version: str = "",
    ) -> list[AlignedPair]:
        """Forced alignment: one AlignedPair per (source, target) pair, in order.

        links is one of service/decode/align/links.py's LINK_MODES (None: the server's default);
        matrices "both", "none" (links and scores only), "subword" or "word"; markup "xml" or
        "html" reads the sources' markup and puts it back on the targets (`tagged_target`);
        attention_layer/attention_head: a Transformer's cross-attention to align by (None: the
        model's). Raises grpc.RpcError (INVALID_ARGUMENT naming the pair for an empty side, one over the
        limits or unreadable markup, or for a model without attention)."""
        request = self.align_request(
            pairs,
            links=links,
            threshold=threshold,
            matrices=matrices,
            markup=markup,
            invalid_markup=invalid_markup,
            attention_layer=attention_layer,
            attention_head=attention_head,
            request_id=request_id,
            model=model,
            version=version,
        )
        response = self._stub.Align(request, timeout=self.timeout if timeout is None else timeout)
        return aligned_from_response(response, len(pairs))

    def align_many(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        batch: int = 32,
        in_flight: int = 4,
        **options: Any,
    ) -> list[AlignedPair]:
        """`align` over any number of pairs: requests of `batch` pairs, `in_flight` at a time (so
        the server's running batch has company); results in order."""
        chunks = [pairs[i : i + batch] for i in range(0, len(pairs), batch)]
        timeout = options.pop("timeout", None)
        results: list[AlignedPair] = []
        pending: list[tuple[Any, int]] = []
        for chunk in chunks:
            request = self.align_request(chunk, **options)
            call = self._stub.Align.future(
                request, timeout=self.timeout if timeout is None else timeout
            )
            pending.append((call, len(chunk)))
            if len(pending) >= in_flight:
                future, n = pending.pop(0)
                results += aligned_from_response(future.result(), n)
        for future, n in pending:
            results += aligned_from_response(future.result(), n)
        return results

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


def aligned_from_response(response: pb.AlignResponse, n: int) -> list[AlignedPair]:
    if len(response.alignments) != n:
        raise ValueError(f"server returned {len(response.alignments)} alignments for {n} pairs")
    return [aligned_pair_from_pb(a) for a in response.alignments]


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
        "--document",
        type=Path,
        help="translate this file whole as one text (- for stdin), its lines and blank lines "
        "kept: with --split-sentences on, each sentence is decoded alone and the answer keeps "
        "the file's layout",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="TranslateStream: print each sentence as it settles and the moment it is final "
        "(with --json: each message as a JSON line)",
    )
    add_column_flags(p, "hypothesis line", "the server marked it low_confidence")
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
    align = p.add_argument_group("forced alignment (Align)")
    align.add_argument(
        "--align-pairs",
        action="store_true",
        help='align given translations: each TEXT (or stdin line) is "source ||| target", '
        "fast_align's input format; prints the Pharaoh links, the log-probability and a heatmap",
    )
    align.add_argument("--source-file", type=Path, help="file mode: source sentences, one a line")
    align.add_argument(
        "--target-file",
        type=Path,
        help="file mode: target sentences, line for line; writes one Pharaoh line per pair "
        "(an empty line for a pair with an empty side, as fast_align and eflomal do)",
    )
    align.add_argument("--out", type=Path, help="file mode: write the links here (default: stdout)")
    align.add_argument(
        "--links", choices=LINK_MODES, help="how hard links are read (default: the server's)"
    )
    align.add_argument("--threshold", type=float, help="--links threshold's cut, in (0, 1]")
    align.add_argument(
        "--attention-layer",
        type=int,
        help="a Transformer's decoder layer to align by, 0-based (default: the model's)",
    )
    align.add_argument(
        "--attention-head",
        type=int,
        help="one head of that layer, 0-based (default: its heads averaged)",
    )
    align.add_argument(
        "--scores",
        action="store_true",
        help="file mode: each line is 'log_prob<TAB>links' (log P(target | source), EOS included)",
    )
    align.add_argument(
        "--batch", type=int, default=32, help="pairs per Align request (default: %(default)s)"
    )
    p.add_argument("--tls-ca", help="PEM root certificate(s) that verify the server (enables TLS)")
    p.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM client private key for mutual TLS (with --tls-cert)")
    args = p.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    if (args.source_file is None) != (args.target_file is None):
        p.error("--source-file and --target-file go together")
    if args.batch < 1:
        p.error("--batch must be >= 1")
    return args


def alignment_mode(args: argparse.Namespace) -> str:
    """--align's mode; a --heatmap alone asks for subword alignments."""
    if args.align:
        return str(args.align)
    return "subword" if args.heatmap else "none"


def read_texts(args: argparse.Namespace) -> list[str]:
    """--document's whole text, else the TEXT arguments, else the non-blank stdin lines."""
    if args.document is not None:
        source = sys.stdin if str(args.document) == "-" else args.document.open(encoding="utf-8")
        with source:
            return [source.read()]
    if args.texts:
        return list(args.texts)
    return [line.rstrip("\n") for line in sys.stdin if line.strip()]


def format_hypothesis(
    h: ClientHypothesis,
    show_score: bool,
    show_alignment: bool,
    show_confidence: bool = False,
    show_origin: bool = False,
) -> str:
    first = alternative_column(h) + (f"{h.score:.4f}\t{h.text}" if show_score else h.text)
    if show_origin:
        first = origin_column(h) + first
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
        format_hypothesis(h, show_score, args.align is not None, args.confidence, args.origin)
        for h in t.hypotheses
    )


def save_first_heatmap(translations: list[ClientTranslation], path: Path) -> Path:
    """The first sentence's best alignment as a PNG; ValueError when the response has none."""
    first = translations[0].best if translations and translations[0].hypotheses else None
    if first is None or first.alignment is None:
        raise ValueError("the response has no alignment to draw (does the model have attention?)")
    a = first.alignment
    return save_heatmap_png(a.matrix, a.source_tokens, a.target_tokens, path, title=first.text)


def read_pair_lines(lines: Sequence[str]) -> list[tuple[str, str]]:
    """ "source ||| target" lines → pairs; ValueError naming the first line without the separator."""
    pairs = []
    for i, line in enumerate(lines, 1):
        source, sep, target = line.partition("|||")
        if not sep:
            raise ValueError(f'line {i} is not "source ||| target": {line[:60]!r}')
        pairs.append((source.strip(), target.strip()))
    return pairs


def align_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "links": args.links,
        "threshold": args.threshold,
        "markup": args.markup,
        "invalid_markup": args.invalid_markup,
        "attention_layer": args.attention_layer,
        "attention_head": args.attention_head,
        "model": args.model,
        "version": args.model_version,
    }


def align_files(client: TranslatorClient, args: argparse.Namespace) -> int:
    """File mode: one Pharaoh line per pair, like fast_align and eflomal (with --markup: the
    target with the source's markup put back); pairs with an empty side get an empty line
    (counted on stderr)."""
    pairs = read_parallel(args.source_file, args.target_file)
    todo = [i for i, (s, t) in enumerate(pairs) if s.strip() and t.strip()]
    aligned = client.align_many(
        [pairs[i] for i in todo], batch=args.batch, matrices="none", **align_options(args)
    )
    lines = [""] * len(pairs)
    for i, a in zip(todo, aligned, strict=True):
        line = a.tagged_target if args.markup not in (None, "none") else a.pharaoh
        lines[i] = f"{a.log_prob:.4f}\t{line}" if args.scores else line
    text = "".join(line + "\n" for line in lines)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    skipped = len(pairs) - len(todo)
    if skipped:
        print(f"{skipped} pairs with an empty side: empty lines written", file=sys.stderr)
    return 0


def format_aligned(a: AlignedPair, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(aligned_to_json(a), ensure_ascii=False)
    lines = [f"{a.log_prob:.4f}\t{a.pharaoh}"]
    if a.tagged_target:
        lines.append(a.tagged_target)
    if a.word is not None:
        lines.append(render_text_heatmap(a.word.matrix, a.source_words, a.target_words))
    unknown = [a.source_words[i] for i in a.unknown_source_words]
    unknown += [a.target_words[i] for i in a.unknown_target_words]
    if unknown:
        lines.append("unknown to the vocabulary: " + " ".join(unknown))
    return "\n".join(lines)


def aligned_to_json(a: AlignedPair) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in a.__dict__.items() if k not in ("subword", "word")}
    for level in ("subword", "word"):
        matrix = getattr(a, level)
        if matrix is not None:
            out[level] = matrix.matrix.round(4).tolist()
    return out


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
    if args.source_file is not None:
        with TranslatorClient(args.server, timeout=args.timeout, **client_options) as client:
            return align_files(client, args)
    texts = read_texts(args)
    if texts and args.align_pairs:
        with TranslatorClient(args.server, timeout=args.timeout, **client_options) as client:
            aligned = client.align(read_pair_lines(texts), matrices="word", **align_options(args))
        for a in aligned:
            print(format_aligned(a, args))
        return 0
    if not texts:
        print(
            "error: no texts to translate (give TEXT arguments or lines on stdin)", file=sys.stderr
        )
        return 2
    if args.stream:
        with TranslatorClient(
            args.server, timeout=args.timeout, round_robin=args.round_robin, **client_options
        ) as client:
            return print_stream(client, texts, args)
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


def print_stream(client: TranslatorClient, texts: list[str], args: argparse.Namespace) -> int:
    """--stream: each sentence printed as it settles (the part of its translation no later step
    can change, then the rest the moment it is final), after the source's whitespace before it,
    so that the texts take shape as they are translated; each text ends a line. With --json,
    every message as one JSON line."""
    messages = client.translate_stream(
        texts, alignment=alignment_mode(args), model=args.model, version=args.model_version,
        **options_from_args(args),
    )  # fmt: skip
    current, shown = 0, ""  # the text being printed, and what is printed of it
    sentence: tuple[int, int] | None = None  # the sentence being printed (partial chunks came)
    written = ""  # what is printed of it
    for message in messages:
        if args.json:
            line = json_format.MessageToJson(
                message, preserving_proto_field_name=True, indent=None, ensure_ascii=False
            )
            print(line, flush=True)
        elif message.HasField("sentence"):
            chunk = message.sentence
            if chunk.text_index != current:  # the texts before it are whole
                print("\n" * (chunk.text_index - current), end="")
                current, shown = chunk.text_index, ""
            if (chunk.text_index, chunk.sentence_index) != sentence:
                sentence, written = (chunk.text_index, chunk.sentence_index), ""
                print(chunk.separator, end="")
                shown += chunk.separator
            text = chunk.hypothesis.text
            if text.startswith(written):  # a settled prefix grows; the final text ends it
                part = text[len(written) :]
            elif chunk.partial:
                continue
            else:  # (a final text that does not extend what was shown: on a line of its own)
                part = "\n" + text
            print(part, end="", flush=True)
            shown, written = shown + part, text
            if not chunk.partial:
                sentence = None
        else:  # the whole answer: the last text's rest (its trailing whitespace, its markup)
            answers = [t.hypotheses[0].text for t in message.response.translations]
            last = answers[current] if answers else ""
            print(last[len(shown) :] if last.startswith(shown) else "\n" + last, flush=True)
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
