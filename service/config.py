"""Typed configuration, one dataclass per concern, validated when built.

Values come from command-line flags and environment variables (`S2S_*`), read once at start-up by
`from_env_and_args`; no other module reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeConfig:
    """ONNX Runtime: which execution providers, which device, how many threads."""

    providers: tuple[str, ...] = ("CUDAExecutionProvider", "CPUExecutionProvider")
    device_id: int = 0
    intra_op_threads: int = 0  # 0 = onnxruntime's default (one per core)
    inter_op_threads: int = 0
    int8_decoder: bool = False

    def __post_init__(self) -> None:
        if not self.providers:
            raise ValueError("providers must name at least one execution provider")
        if self.device_id < 0 or self.intra_op_threads < 0 or self.inter_op_threads < 0:
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
