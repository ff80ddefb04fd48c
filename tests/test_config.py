"""One typed configuration from flags and environment, validated at load."""

from __future__ import annotations

import pytest

from service.config import ServerConfig, load_settings


def test_defaults_env_and_flags_in_that_order() -> None:
    s = load_settings([], {})
    assert s.server.port == 50051 and s.batching.policy == "iteration" and s.decoding.beam_size == 5
    s = load_settings(
        [],
        {
            "S2S_PORT": "6000",
            "S2S_POLICY": "request",
            "S2S_PROVIDERS": "CPUExecutionProvider",
            "S2S_WARMUP": "false",
        },
    )
    assert (s.server.port, s.batching.policy, s.runtime.providers, s.server.warmup) == (
        6000,
        "request",
        ("CPUExecutionProvider",),
        False,
    )
    s = load_settings(
        ["--port", "7000", "--default-beam-size", "2", "--max-queue-delay-s", "0.01"],
        {"S2S_PORT": "6000"},
    )
    assert (s.server.port, s.decoding.beam_size, s.batching.max_queue_delay_s) == (7000, 2, 0.01)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "fastest"], "batching policy must be one of"),
        (["--port", "70000"], "ports must be in"),
        (["--port", "many"], "--port: cannot read 'many' as int"),
        (["--warmup", "maybe"], "--warmup: cannot read 'maybe' as bool"),
        (["--tls-cert", "a.pem"], "TLS needs both"),
        (["--max-beam-size", "0"], "engine limits must be >= 1"),
    ],
)
def test_impossible_values_fail_at_load(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(argv, {})


def test_mutual_tls_needs_a_server_certificate() -> None:
    with pytest.raises(ValueError, match="mutual TLS"):
        ServerConfig(tls_client_ca="ca.pem")
