"""Typed configuration, one dataclass per concern, validated when built.

Values come from command-line flags and environment variables (`S2S_*`), read once at start-up by
`load_settings`. The server reads the environment nowhere else; service/healthcheck.py, a separate
probe process, reads S2S_PORT itself for its default target. The decoding defaults are a
`SearchOptions` (service/options.py declares the options): flags `--default-<option>`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, fields
from typing import Any

from service.options import SearchOptions
from service.scheduler import BatchingConfig


@dataclass(frozen=True)
class RuntimeConfig:
    """ONNX Runtime: which execution providers, which device, how many threads."""

    providers: tuple[str, ...] = ("CUDAExecutionProvider", "CPUExecutionProvider")
    device_id: int = 0
    intra_op_threads: int = 0  # decoder-step session; 0 = onnxruntime's default (one per core)
    # The encoder session runs beside the decoder's (service/encode_ahead.py), so by default it
    # takes one thread rather than competing for every core; 0 = onnxruntime's default.
    encoder_threads: int = 1
    inter_op_threads: int = 0
    int8_decoder: bool = False
    # ONNX Runtime's intra-op threads spin while waiting for work by default: good for a dedicated
    # core, bad when the gRPC loop and the search share the cores with them. Off unless asked for.
    spin_wait: bool = False

    def __post_init__(self) -> None:
        if not self.providers:
            raise ValueError("providers must name at least one execution provider")
        if (
            min(self.device_id, self.intra_op_threads, self.encoder_threads, self.inter_op_threads)
            < 0
        ):
            raise ValueError("device_id and thread counts must be >= 0")


@dataclass(frozen=True)
class EngineLimits:
    """Input limits the engine enforces (the server reports them in ModelInfo)."""

    max_source_tokens: int = 256
    max_length: int = 512  # the most target tokens a request may ask for (its max_length)
    max_beam_size: int = 16

    def __post_init__(self) -> None:
        if min(self.max_source_tokens, self.max_length, self.max_beam_size) < 1:
            raise ValueError("engine limits must be >= 1")


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
    # or bundle folders such as the embedded models/default): service/repository.py.
    bundle: str = ""
    models: str = "models"
    default_model: str = ""  # the model of requests that name none ("": see Repository.default)
    version_policy: str = "latest"  # or "all"
    pinned_versions: tuple[str, ...] = ()  # NAME:VERSION,... served instead of the policy's
    reload_interval_s: float = 30.0  # poll the repository folder for new versions; 0 = only SIGHUP
    host: str = "0.0.0.0"
    port: int = 50051
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090  # 0 picks a free port; -1 disables the metrics endpoint
    grace_s: float = 20.0  # SIGTERM: time to finish accepted requests
    # Clients reconnect (and re-resolve DNS) after this; 0 = never.
    max_connection_age_s: float = 300.0
    max_texts: int = 64
    max_text_chars: int = 2000
    max_message_bytes: int = 4 * 1024 * 1024
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""  # set to require client certificates (mutual TLS)
    log_level: str = "INFO"
    warmup: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or not -1 <= self.metrics_port <= 65535:
            raise ValueError("ports must be in 0..65535 (metrics_port -1 disables metrics)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("mutual TLS (tls_client_ca) needs tls_cert and tls_key too")
        VersionPolicy(self.version_policy, self.pinned_versions)  # raises on a bad one
        if not 0 <= self.reload_interval_s < math.inf:
            raise ValueError("reload_interval_s must be a finite number >= 0 (0: no polling)")
        if self.max_texts < 1 or self.max_text_chars < 1 or self.grace_s < 0:
            raise ValueError("max_texts and max_text_chars must be >= 1, grace_s >= 0")


@dataclass(frozen=True)
class Settings:
    """Everything the server is configured with."""

    server: ServerConfig
    runtime: RuntimeConfig
    limits: EngineLimits
    batching: BatchingConfig
    decoding: SearchOptions  # what a request gets for each option it leaves unset


SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("server", ServerConfig, ""),
    ("runtime", RuntimeConfig, ""),
    ("limits", EngineLimits, ""),
    ("batching", BatchingConfig, ""),
    ("decoding", SearchOptions, "default_"),
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
    if cls is SearchOptions:
        return [f for f in fields(cls) if "option" in f.metadata]
    return list(fields(cls))


def parse_value(raw: str, default: Any, name: str) -> Any:
    """A flag or environment string → the type of the field's default."""
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve an attention seq2seq model bundle over gRPC.",
        epilog=f"Every flag can also be set by an environment variable: {ENV_PREFIX}<FLAG NAME IN CAPITALS>, "
        f"e.g. {ENV_PREFIX}PORT=50051, {ENV_PREFIX}POLICY=iteration. Flags win over the environment.",
    )
    for section, cls, prefix in SECTIONS:
        group = parser.add_argument_group(section)
        for f in settable_fields(cls):
            name = prefix + f.name
            default = f.default
            shown = ",".join(default) if isinstance(default, tuple) else default
            group.add_argument(
                "--" + name.replace("_", "-"), dest=name, default=None, help=f"(default: {shown})"
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
