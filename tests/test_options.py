"""service/decode/options.py: each decoding option declared once, and every form derived from it agrees
(the wire's DecodingOptions, the server's settings and parsing, the client, both CLIs)."""

from __future__ import annotations

from typing import Any

import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.cli import client, translate
from service.decode.config import EngineLimits, RuntimeConfig
from service.decode.engine import Engine
from service.decode.errors import InvalidInput
from service.decode.options import OPTIONS, SearchOptions, problems
from service.serve.config import load_settings
from service.serve.protocol import decoding_options_to_pb, default_options, parse_options
from tests.conftest import TinyModel

# A value inside every option's range, different from its default.
OTHER: dict[str, Any] = {
    "beam_size": 3,
    "n_best": 2,
    "max_length_a": 1.5,
    "max_length_b": -3,
    "max_length": 40,
    "length_penalty": 0.5,
    "coverage_penalty": 0.25,
}


def test_every_option_is_a_decoding_options_field_of_its_type() -> None:
    fields = pb.DecodingOptions.DESCRIPTOR.fields_by_name
    assert {spec.name for spec in OPTIONS} == set(fields) - {"alignment"}
    for spec in OPTIONS:
        assert (fields[spec.name].cpp_type == fields[spec.name].CPPTYPE_FLOAT) == (
            spec.kind is float
        ), spec.name
        assert fields[spec.name].has_presence, f"{spec.name} must be optional on the wire"
    assert set(OTHER) == {spec.name for spec in OPTIONS}


def test_defaults_are_valid_and_each_default_lies_in_its_range() -> None:
    defaults = SearchOptions()
    assert defaults.problems(EngineLimits()) == []
    for spec in OPTIONS:
        assert getattr(defaults, spec.name) == spec.default
        assert spec.low <= spec.default <= spec.high, spec.name


def test_the_limits_cap_the_ranges() -> None:
    limits = EngineLimits(max_beam_size=4, max_length=50)
    assert problems(SearchOptions(beam_size=4, max_length=50).values(), limits) == []
    found = problems(SearchOptions(beam_size=5, max_length=51, max_length_b=-51).values(), limits)
    assert found == [
        "beam_size must be between 1 and 4, got 5",
        "max_length_b must be within ±50, got -51",
        "max_length must be between 1 and 50, got 51",
    ]


def test_server_parsing_takes_every_set_field_and_defaults_the_rest() -> None:
    settings = load_settings([], {})
    for spec in OPTIONS:
        options = parse_options(pb.DecodingOptions(**{spec.name: OTHER[spec.name]}), settings)
        expected = {**default_options(settings), spec.name: OTHER[spec.name]}
        assert options.values() == pytest.approx(expected), spec.name
    assert parse_options(pb.DecodingOptions(**OTHER), settings).values() == OTHER


def test_server_and_engine_report_the_same_problems(tiny: TinyModel) -> None:
    """Options within the static ranges but over the engine's limits: the server refuses them as
    the engine does, with the same message."""
    settings = load_settings(["--max-beam-size", "8", "--max-length", "100"], {})
    engine = Engine.load(
        tiny.bundle, RuntimeConfig(providers=("CPUExecutionProvider",)), settings.limits
    )
    over: dict[str, Any] = {"beam_size": 9, "max_length": 101, "max_length_b": -101}
    with pytest.raises(InvalidInput) as by_server:
        parse_options(pb.DecodingOptions(**over), settings)
    with pytest.raises(InvalidInput) as by_engine:
        engine.check_options(SearchOptions(**{**default_options(settings), **over}), "none")
    assert (
        str(by_server.value)
        == str(by_engine.value)
        == (
            "beam_size must be between 1 and 8, got 9; max_length_b must be within ±100, got -101; "
            "max_length must be between 1 and 100, got 101"
        )
    )


def test_server_defaults_come_from_flags_and_the_environment() -> None:
    flags = [f"--default-{spec.name.replace('_', '-')}={OTHER[spec.name]}" for spec in OPTIONS]
    assert load_settings(flags, {}).decoding.values() == OTHER
    environ = {f"S2S_DEFAULT_{spec.name.upper()}": str(OTHER[spec.name]) for spec in OPTIONS}
    assert load_settings([], environ).decoding.values() == OTHER
    with pytest.raises(ValueError, match=r"n_best \(6\) must be between 1 and beam_size \(5\)"):
        load_settings(["--default-n-best", "6"], {})


def test_former_environment_names_still_work() -> None:
    environ = {
        "S2S_MAX_TARGET_TOKENS": "300",
        "S2S_DEFAULT_MAX_LEN_A": "1.5",
        "S2S_DEFAULT_MAX_LEN_B": "7",
    }
    settings = load_settings([], environ)
    assert settings.limits.max_length == 300
    assert (settings.decoding.max_length_a, settings.decoding.max_length_b) == (1.5, 7)


def test_client_keyword_arguments_are_the_options() -> None:
    message = decoding_options_to_pb("word", **OTHER)
    for spec in OPTIONS:
        assert getattr(message, spec.name) == pytest.approx(OTHER[spec.name]), spec.name
    assert message.alignment == pb.ALIGNMENT_MODE_WORD
    unset = decoding_options_to_pb(beam_size=None)
    assert not any(unset.HasField(spec.name) for spec in OPTIONS)
    with pytest.raises(TypeError, match=r"unknown decoding options \['beam'\]"):
        decoding_options_to_pb(beam=3)


def test_both_clis_have_a_flag_per_option() -> None:
    flags = [f"{spec.flags[0]}={OTHER[spec.name]}" for spec in OPTIONS]
    args = client.parse_args([*flags, "text"])
    assert {spec.name: getattr(args, spec.name) for spec in OPTIONS} == OTHER
    unset = client.parse_args(["text"])
    assert all(getattr(unset, spec.name) is None for spec in OPTIONS)  # the server's defaults
    args = translate.parse_args(flags)
    assert {spec.name: getattr(args, spec.name) for spec in OPTIONS} == OTHER
    defaults = translate.parse_args([])
    assert {spec.name: getattr(defaults, spec.name) for spec in OPTIONS} == SearchOptions().values()
    assert translate.parse_args(["--max-len-a", "0.5"]).max_length_a == 0.5  # the former flag
