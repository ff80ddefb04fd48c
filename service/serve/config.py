"""Typed configuration, one dataclass per concern, validated when built.

Values come from command-line flags and environment variables (`S2S_*`), read once at start-up by
`load_settings`. The server reads the environment nowhere else; service/cli/healthcheck.py, a separate
probe process, reads S2S_PORT itself for its default target. The decoding defaults are a
`SearchOptions` (service/decode/shared/options.py declares the options): flags `--default-<option>`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, fields
from typing import Any

from service.decode.shared.config import EngineLimits, RuntimeConfig, setting
from service.decode.shared.options import SearchOptions, Terms
from service.serve.logs import LOG_FORMATS
from service.serve.scheduler import BatchingConfig

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of each model are served: "latest" or "all", and pinned versions
    (`NAME:VERSION`) that override it for the models they name."""

    policy: str = "latest"
    pinned: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in ("latest", "all"):
            raise ValueError(f"version policy must be 'latest' or 'all', got {self.policy!r}")
        bad = [p for p in self.pinned if p.count(":") != 1 or "" in p.split(":")]
        if bad:
            raise ValueError(f"pinned versions must be NAME:VERSION, got {bad}")

    def select(self, name: str, versions: Iterable[str]) -> list[str]:
        """The versions of model `name` to serve, oldest first."""
        ordered = sorted(versions, key=lambda v: (1, int(v)) if v.isdigit() else (0, v))
        pins = [p.split(":")[1] for p in self.pinned if p.split(":")[0] == name]
        if pins:
            return [v for v in ordered if v in pins]
        return ordered if self.policy == "all" else ordered[-1:]


@dataclass(frozen=True)
class ServerConfig:
    # One bundle (--bundle PATH), else a model repository folder (--models DIR: DIR/NAME/VERSION/,
    # or bundle folders such as the embedded models/default): service/serve/repository.py.
    bundle: str = setting("", "serve this one model bundle directory (instead of --models)")
    models: str = setting(
        "models",
        "model repository: DIR/NAME/VERSION/ bundles, or bundle folders as one-version models "
        "(the embedded models/ by default)",
    )
    default_model: str = setting(
        "", "the model of requests that name none (default: the only one, or models/default's)"
    )
    memory_dir: str = setting(
        "",
        "a folder of memory files, DIR/<model name>.tsv: source<TAB>target entries answered before "
        "the model, over the bundle's own (docs/memory.md); re-read on reload",
    )
    glossary_dir: str = setting(
        "",
        "a folder of glossary files, DIR/<model name>.tsv: source<TAB>target terms every "
        "translation of that model keeps, over the bundle's own (docs/markup.md); re-read on reload",
    )
    version_policy: str = setting(
        "latest", "which versions of each model to serve", ("latest", "all")
    )
    pinned_versions: tuple[str, ...] = setting(
        (), "NAME:VERSION,... to serve instead of the policy's, for the models named"
    )
    reload_interval_s: float = setting(
        30.0, "re-read the repository every this many seconds (also on SIGHUP); 0 = only SIGHUP"
    )
    host: str = setting("0.0.0.0", "address the gRPC server listens on")
    port: int = setting(50051, "gRPC port; 0 picks a free one")
    metrics_host: str = setting("0.0.0.0", "address of the Prometheus /metrics endpoint")
    metrics_port: int = setting(9090, "Prometheus port; 0 picks a free one, -1 disables metrics")
    grace_s: float = setting(
        20.0, "on SIGTERM, seconds to finish the accepted requests before stopping"
    )
    max_connection_age_s: float = setting(
        300.0,
        "close client connections after this many seconds (clients reconnect and re-resolve "
        "DNS, reaching new replicas); 0 = never",
    )
    max_texts: int = setting(64, "the most texts in one request")
    max_text_chars: int = setting(2000, "the most characters of one text")
    max_document_chars: int = setting(
        20000, "the most characters of one text cut into sentences (split_sentences)"
    )
    max_sentences: int = setting(
        256, "the most sentences of a request, all its texts cut (split_sentences)"
    )
    max_message_bytes: int = setting(
        4 * 1024 * 1024,
        "the largest request or response in bytes; requests whose worst-case response is "
        "larger are refused before decoding",
    )
    tls_cert: str = setting("", "PEM server certificate (with --tls-key; enables TLS)")
    tls_key: str = setting("", "PEM private key of --tls-cert")
    tls_client_ca: str = setting(
        "", "PEM CA certificates; set, clients must present a certificate they signed (mTLS)"
    )
    log_level: str = setting("INFO", "logging level of the log lines", LOG_LEVELS)
    log_format: str = setting(
        "auto",
        "the log lines: json (one object a line, for collectors), text (for a person), or auto: "
        "text when stderr is a terminal, else json",
        LOG_FORMATS,
    )
    fronts: int = setting(
        -1,
        "front processes (gRPC and HTTP, parsing, tokenizing, responses), sharing the ports; "
        "0 = one process for fronts and engine (the single-process mode); -1 = by the cores: "
        "the single-process mode on one core, else one front per 4 cores (at least 1)",
    )
    engines: int = setting(
        0,
        "engine processes (the decode loop; 0 = one): one per GPU (engine i decodes on "
        "--device-id + i); on a CPU host, engines x --intra-op-threads split its cores",
    )
    engine_hang_s: float = setting(
        30.0,
        "an engine whose decode loop spends this many seconds in one iteration is hung: its "
        "requests are answered UNAVAILABLE and it is restarted",
    )
    engine_restart_wait_s: float = setting(
        60.0,
        "a request that comes while its engine process is down and being started again waits for "
        "it this many seconds at most (its deadline first), then UNAVAILABLE; 0 = none waits "
        "(UNAVAILABLE at once). One whose start fails again ends the wait at once, saying why",
    )
    warmup: bool = setting(True, "decode a few sentences before reporting SERVING")
    reflection: bool = setting(
        True, "gRPC server reflection (lists the services and their schemas, as grpcurl uses)"
    )
    http_port: int = setting(
        -1,
        "HTTP/JSON port for the same API (service/serve/http_api.py), on --host with the TLS files of "
        "gRPC; 0 picks a free one, -1 turns it off",
    )
    ui: bool = setting(
        False, "serve the attention explorer page at / of the HTTP port (needs --http-port)"
    )
    http_cors_origins: tuple[str, ...] = setting(
        (),
        "origins whose browser pages may call the HTTP API (CORS), comma-separated; none by default",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or not -1 <= self.metrics_port <= 65535:
            raise ValueError("ports must be in 0..65535 (metrics_port -1 disables metrics)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("mutual TLS (tls_client_ca) needs tls_cert and tls_key too")
        if not -1 <= self.http_port <= 65535:
            raise ValueError("http_port must be in 0..65535, or -1 to turn the HTTP face off")
        if self.ui and self.http_port < 0:
            raise ValueError("ui needs the HTTP face: set http_port (0 picks a free port)")
        VersionPolicy(self.version_policy, self.pinned_versions)  # raises on a bad one
        if not 0 <= self.reload_interval_s < math.inf:
            raise ValueError("reload_interval_s must be a finite number >= 0 (0: no polling)")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {self.log_format!r}")
        if self.fronts < -1 or self.engines < 0 or not self.engine_hang_s > 0:
            raise ValueError("fronts must be >= -1, engines >= 0, engine_hang_s > 0")
        if not 0 <= self.engine_restart_wait_s < math.inf:
            raise ValueError("engine_restart_wait_s must be a finite number >= 0 (0: none waits)")
        if (
            min(self.max_texts, self.max_text_chars, self.max_document_chars, self.max_sentences)
            < 1
            or self.grace_s < 0
        ):
            raise ValueError("max_texts and max_text_chars must be >= 1, grace_s >= 0")


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry tracing (service/serve/tracing.py); the OTEL_* variables configure the rest."""

    tracing: bool = setting(
        False, "OpenTelemetry traces of every request, exported over OTLP (see docs/tracing.md)"
    )
    trace_text: bool = setting(
        False, "with --tracing, record the input and output texts on the spans (off: lengths only)"
    )


@dataclass(frozen=True)
class Settings:
    """Everything the server is configured with."""

    server: ServerConfig
    runtime: RuntimeConfig
    limits: EngineLimits
    batching: BatchingConfig
    decoding: SearchOptions  # what a request gets for each option it leaves unset
    tracing: TracingConfig = TracingConfig()


SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("server", ServerConfig, ""),
    ("runtime", RuntimeConfig, ""),
    ("limits", EngineLimits, ""),
    ("batching", BatchingConfig, ""),
    ("decoding", SearchOptions, "default_"),
    ("tracing", TracingConfig, ""),
)
ENV_PREFIX = "S2S_"
# Settings renamed when the decoding options got one name each; the environment still takes the
# former names (deployments set them there).
FORMER_NAMES: dict[str, str] = {
    "max_length": "max_target_tokens",
    "default_max_length_a": "default_max_len_a",
    "default_max_length_b": "default_max_len_b",
}


def settable_fields(cls: type) -> list[Field[Any]]:
    """The fields of a section that flags and the environment set (SearchOptions: its options)."""
    if cls is SearchOptions:  # a glossary is the model's (--glossary-dir), not a server default
        return [
            f
            for f in fields(cls)
            if "option" in f.metadata and f.metadata["option"].kind is not Terms
        ]
    return list(fields(cls))


def parse_value(raw: str | bool, default: Any, name: str) -> Any:
    """A flag or environment string → the type of the field's default."""
    if isinstance(raw, bool):  # a --NAME/--no-NAME flag
        return raw
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, tuple):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        return type(default)(raw)
    except ValueError as err:
        raise ValueError(f"{name}: cannot read {raw!r} as {type(default).__name__}") from err


def field_help(f: Field[Any]) -> tuple[str, tuple[str, ...]]:
    """A settable field's help text and choices, from its declaration."""
    if "option" in f.metadata:  # a decoding option: service/decode/shared/options.py's spec
        return "default for requests that leave it unset: " + f.metadata["option"].help, ()
    return f.metadata.get("help", ""), tuple(f.metadata.get("choices", ()))


def build_parser() -> argparse.ArgumentParser:
    """One flag per settable field, described by the field's declaration; booleans are
    --NAME/--no-NAME (the environment takes true/false, 1/0, yes/no, on/off)."""
    parser = argparse.ArgumentParser(
        prog="s2s-serve",
        description="Serve an attention seq2seq model bundle over gRPC.",
        epilog=f"Every flag can also be set by an environment variable: {ENV_PREFIX}<FLAG NAME IN CAPITALS>, "
        f"e.g. {ENV_PREFIX}PORT=50051, {ENV_PREFIX}POLICY=iteration, {ENV_PREFIX}WARMUP=false. "
        "Flags win over the environment.",
    )
    for section, cls, prefix in SECTIONS:
        group = parser.add_argument_group(section)
        for f in settable_fields(cls):
            name = prefix + f.name
            default = f.default
            shown = ",".join(default) if isinstance(default, tuple) else default
            text, choices = field_help(f)
            text = text.replace("%", "%%")  # argparse formats help with %
            if choices:
                text += f"; one of {', '.join(choices)}"
            flag = "--" + name.replace("_", "-")
            if isinstance(default, bool):
                group.add_argument(
                    flag,
                    dest=name,
                    default=None,
                    action=argparse.BooleanOptionalAction,
                    help=f"{text} (default: {'on' if default else 'off'})",
                )
                continue
            group.add_argument(
                flag,
                dest=name,
                default=None,
                metavar=(name.upper() if not choices else "{" + ",".join(choices) + "}"),
                help=f"{text} (default: {shown})",
            )
    return parser


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Flags, then environment variables, then defaults; every value validated by its dataclass."""
    args = vars(build_parser().parse_args(argv))
    environ = os.environ if environ is None else environ
    built: dict[str, Any] = {}
    for section, cls, prefix in SECTIONS:
        values: dict[str, Any] = {}
        for f in settable_fields(cls):
            name = prefix + f.name
            raw = args.get(name)
            if raw is None:
                raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None and name in FORMER_NAMES:
                raw = environ.get(ENV_PREFIX + FORMER_NAMES[name].upper())
            if raw is not None:
                values[f.name] = parse_value(raw, f.default, "--" + name.replace("_", "-"))
        built[section] = cls(**values)
    return Settings(**built)
