"""One typed configuration from flags and environment, validated at load."""

from __future__ import annotations

import pytest

from service.serve.config import ServerConfig, build_parser, load_settings
from service.serve.scheduler import POLICIES


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


def test_a_boolean_from_the_environment_must_read_as_one() -> None:
    with pytest.raises(ValueError, match="--warmup: cannot read 'maybe' as bool"):
        load_settings([], {"S2S_WARMUP": "maybe"})


def test_every_server_flag_has_a_description_and_its_choices() -> None:
    """Issue 16 point 10: --help described none of the ~40 flags, --policy did not list its
    choices, booleans took a value (--warmup WARMUP), and usage said server.py."""
    parser = build_parser()
    text = parser.format_help()
    assert parser.prog == "s2s-serve" and text.startswith("usage: s2s-serve")
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 35
    for action in flags:
        assert action.help and not action.help.startswith("(default"), action.option_strings
    policy = next(a for a in flags if "--policy" in a.option_strings)
    assert all(choice in str(policy.help) for choice in POLICIES)
    assert "{none,request,iteration}" in text
    assert "--warmup, --no-warmup" in text and "WARMUP" not in text.split("environment")[0]


def test_booleans_are_switches_on_the_command_line_and_words_in_the_environment() -> None:
    assert load_settings(["--no-warmup"], {}).server.warmup is False
    assert load_settings(["--warmup"], {"S2S_WARMUP": "false"}).server.warmup is True
    assert load_settings([], {"S2S_WARMUP": "false"}).server.warmup is False
    assert load_settings([], {"S2S_SPIN_WAIT": "on"}).runtime.spin_wait is True
    with pytest.raises(SystemExit):
        load_settings(["--warmup", "false"], {})
