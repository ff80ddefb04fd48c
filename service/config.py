"""Typed configuration, one dataclass per concern, validated when built.

Values come from command-line flags and environment variables (`S2S_*`), read once at start-up by
`from_env_and_args`; no other module reads the environment.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from service.scheduler import BatchingConfig

CUDA_ARENA_EXTEND: tuple[str, ...] = ("kSameAsRequested", "kNextPowerOfTwo")


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
    # CUDA execution provider (service/runtime.py's cuda_provider_options says why each is set so).
    cuda_arena_extend: str = "kSameAsRequested"  # or "kNextPowerOfTwo"
    cuda_mem_limit_mb: int = 0  # cap on the CUDA memory arena; 0 = no cap
    cuda_copy_in_default_stream: bool = True  # False: host↔device copies on their own stream
    cuda_tf32: bool = False  # TF32 matrix products (faster on Ampere+, not the CPU's fp32 rounding)

    def __post_init__(self) -> None:
        if not self.providers:
            raise ValueError("providers must name at least one execution provider")
        if self.cuda_arena_extend not in CUDA_ARENA_EXTEND:
            raise ValueError(
                f"cuda_arena_extend must be one of {CUDA_ARENA_EXTEND}, got {self.cuda_arena_extend!r}"
            )
        if self.cuda_mem_limit_mb < 0:
            raise ValueError("cuda_mem_limit_mb must be >= 0 (0: no cap)")
        if (
            min(self.device_id, self.intra_op_threads, self.encoder_threads, self.inter_op_threads)
            < 0
        ):
            raise ValueError("device_id and thread counts must be >= 0")


@dataclass(frozen=True)
class EngineLimits:
    """Input limits the engine enforces (the server reports them in ModelInfo)."""

    max_source_tokens: int = 256
    max_target_tokens: int = 512
    max_beam_size: int = 16

    def __post_init__(self) -> None:
        if min(self.max_source_tokens, self.max_target_tokens, self.max_beam_size) < 1:
            raise ValueError("engine limits must be >= 1")


@dataclass(frozen=True)
class DecodingDefaults:
    """What a request gets for each option it leaves unset."""

    beam_size: int = 5
    n_best: int = 1
    max_len_a: float = 2.0
    max_len_b: int = 10
    max_length: int = 256
    length_penalty: float = 0.0
    coverage_penalty: float = 0.0


@dataclass(frozen=True)
class ServerConfig:
    bundle: str = "models/default"
    host: str = "0.0.0.0"
    port: int = 50051
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090  # 0 picks a free port; -1 disables the metrics endpoint
    grace_s: float = 20.0  # SIGTERM: time to finish accepted requests
    max_connection_age_s: float = (
        300.0  # clients reconnect (and re-resolve DNS) after this; 0 = never
    )
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
        if self.max_texts < 1 or self.max_text_chars < 1 or self.grace_s < 0:
            raise ValueError("max_texts and max_text_chars must be >= 1, grace_s >= 0")


@dataclass(frozen=True)
class Settings:
    """Everything the server is configured with."""

    server: ServerConfig
    runtime: RuntimeConfig
    limits: EngineLimits
    batching: BatchingConfig
    decoding: DecodingDefaults


SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("server", ServerConfig, ""),
    ("runtime", RuntimeConfig, ""),
    ("limits", EngineLimits, ""),
    ("batching", BatchingConfig, ""),
    ("decoding", DecodingDefaults, "default_"),
)
ENV_PREFIX = "S2S_"


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
        for f in fields(cls):
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
        for f in fields(cls):
            name = prefix + f.name
            raw = args.get(name)
            if raw is None:
                raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[f.name] = parse_value(raw, f.default, "--" + name.replace("_", "-"))
        built[section] = cls(**values)
    return Settings(**built)
