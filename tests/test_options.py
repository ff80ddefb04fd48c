"""service/decode/shared/options.py: each decoding option declared once, and every form derived from it agrees
(the wire's DecodingOptions, the server's settings and parsing, the client, both CLIs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.cli import client, translate
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import (
    OPTIONS,
    SearchOptions,
    Terms,
    merge_options,
    options_from_args,
    problems,
)
from service.model.bundle import BundleError
from service.serve.config import load_settings
from service.serve.protocol import (
    decoding_options_to_pb,
    default_options,
    parse_options,
    parse_request,
)
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
    "stopping": "patience",
    "normalize": 0.5,
    "word_penalty": 0.25,
    "max_length_factor": 2.5,
    "patience": 1.5,
    "no_repeat_ngram_size": 3,
    "repetition_penalty": 1.25,
    "min_length": 2,
    "target_prefix": ("un",),
    "return_alternatives": 2,
    "sampling_topk": 5,
    "sampling_topp": 0.5,
    "sampling_temperature": 0.75,
    "seed": 7,
    "force_eos": True,
    "replace_unknowns": True,
    "suppress": ("deux", "trois"),
    "use_memory": False,
    "markup": "html",
    "invalid_markup": "text",
    "protect": ("url", "${…}"),
    "glossary": (("λόγος", "Word"), ("", "Jesus")),
    "use_glossary": False,
    "split_sentences": "nonewlines",
    "target_language": "fra",
}
SERVER_WIDE = {s.name for s in OPTIONS if s.kind is not Terms}  # a glossary is per model


def as_pb(values: dict[str, Any]) -> pb.DecodingOptions:
    """Option values as DecodingOptions (the glossary's pairs as GlossaryTerm messages)."""
    given = dict(values)
    if "glossary" in given:
        given["glossary"] = [pb.GlossaryTerm(source=s, target=t) for s, t in given["glossary"]]
    return pb.DecodingOptions(**given)


def assert_values(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Option values equal, floats as float32 carries them."""
    assert set(got) == set(expected)
    for name, value in expected.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value), name
        else:
            assert got[name] == value, name


def cli_args(flag: str, value: Any) -> list[str]:
    """An option's value as command-line arguments: a bool's bare flag, a list's flag repeated."""
    if isinstance(value, bool):
        return [flag] if value else [flag.replace("--", "--no-", 1)]
    if isinstance(value, tuple):
        return [f"{flag}={' ||| '.join(v) if isinstance(v, tuple) else v}" for v in value]
    return [f"{flag}={value}"]


def test_every_option_is_a_decoding_options_field_of_its_type() -> None:
    fields = pb.DecodingOptions.DESCRIPTOR.fields_by_name
    assert {spec.name for spec in OPTIONS} == set(fields) - {"alignment"}
    for spec in OPTIONS:
        field = fields[spec.name]
        assert (field.cpp_type == field.CPPTYPE_FLOAT) == (spec.kind is float), spec.name
        assert (field.cpp_type == field.CPPTYPE_BOOL) == (spec.kind is bool), spec.name
        assert (field.cpp_type == field.CPPTYPE_STRING) == (spec.kind in (str, tuple)), spec.name
        assert (field.cpp_type == field.CPPTYPE_MESSAGE) == (spec.kind is Terms), spec.name
        if spec.kind in (tuple, Terms):  # repeated: empty is unset
            assert field.is_repeated, spec.name
        else:
            assert field.has_presence, f"{spec.name} must be optional on the wire"
    assert set(OTHER) == {spec.name for spec in OPTIONS}


def test_defaults_are_valid_and_each_default_lies_in_its_range() -> None:
    defaults = SearchOptions()
    assert defaults.problems(EngineLimits()) == []
    for spec in OPTIONS:
        assert getattr(defaults, spec.name) == spec.default
        if spec.kind in (int, float):
            assert spec.low <= spec.default <= spec.high, spec.name
        elif spec.kind is str:
            assert spec.default in spec.choices or not spec.choices, spec.name


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
        options = parse_options(as_pb({spec.name: OTHER[spec.name]}), settings)
        expected = {**default_options(settings), spec.name: OTHER[spec.name]}
        assert_values(options.values(), expected)
    assert parse_options(as_pb(OTHER), settings).values() == OTHER


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
    def server_arg(spec: Any) -> list[str]:
        value = OTHER[spec.name]
        flag = f"--default-{spec.name.replace('_', '-')}"
        return [f"{flag}={','.join(value)}"] if isinstance(value, tuple) else cli_args(flag, value)

    server_wide = {name: v for name, v in OTHER.items() if name in SERVER_WIDE}
    expected = {**SearchOptions().values(), **server_wide}
    flags = [arg for spec in OPTIONS if spec.name in SERVER_WIDE for arg in server_arg(spec)]
    assert load_settings(flags, {}).decoding.values() == expected

    def env_value(value: Any) -> str:
        return ",".join(value) if isinstance(value, tuple) else str(value)

    environ = {
        f"S2S_DEFAULT_{spec.name.upper()}": env_value(OTHER[spec.name])
        for spec in OPTIONS
        if spec.name in SERVER_WIDE
    }
    assert load_settings([], environ).decoding.values() == expected
    with pytest.raises(SystemExit):  # no server-wide glossary: --glossary-dir, per model
        load_settings(["--default-glossary", "a ||| b"], {})
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
        got = getattr(message, spec.name)
        if spec.kind is Terms:
            assert tuple((t.source, t.target) for t in got) == OTHER[spec.name]
            continue
        assert (tuple(got) if spec.kind is tuple else got) == pytest.approx(OTHER[spec.name])
    assert message.alignment == pb.ALIGNMENT_MODE_WORD
    unset = decoding_options_to_pb(beam_size=None)
    assert not any(
        unset.HasField(spec.name) for spec in OPTIONS if spec.kind not in (tuple, Terms)
    ) and not any(getattr(unset, spec.name) for spec in OPTIONS if spec.kind in (tuple, Terms))
    with pytest.raises(TypeError, match="suppress takes a list of strings"):
        decoding_options_to_pb(suppress="deux")
    with pytest.raises(TypeError, match=r"unknown decoding options \['beam'\]"):
        decoding_options_to_pb(beam=3)


def test_both_clis_have_a_flag_per_option() -> None:
    flags = [arg for spec in OPTIONS for arg in cli_args(spec.flags[0], OTHER[spec.name])]
    args = client.parse_args([*flags, "text"])
    assert options_from_args(args) == OTHER
    unset = client.parse_args(["text"])
    assert all(getattr(unset, spec.name) is None for spec in OPTIONS)  # the server's defaults
    args = translate.parse_args(flags)
    assert options_from_args(args) == OTHER
    unset = translate.parse_args([])  # the model's defaults (its manifest's "decoding"), else ours
    assert all(getattr(unset, spec.name) is None for spec in OPTIONS)
    assert translate.parse_args(["--max-len-a", "0.5"]).max_length_a == 0.5  # the former flag


# --- a model's own defaults (the manifest's "decoding") ------------------------------------------


def bundle_with_decoding(tiny: TinyModel, tmp_path: Path, decoding: object) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["decoding"] = decoding
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_models_decoding_defaults_sit_between_the_servers_and_the_request(
    tiny: TinyModel, tmp_path: Path
) -> None:
    bundle = bundle_with_decoding(tiny, tmp_path, {"length_penalty": 1.0, "beam_size": 3})
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    assert engine.decoding_defaults == {"length_penalty": 1.0, "beam_size": 3}
    settings = load_settings(["--default-n-best", "2"], {})
    unset = parse_request(pb.TranslateRequest(texts=["x"]), settings, engine.decoding_defaults)
    assert (unset.options.length_penalty, unset.options.beam_size) == (1.0, 3)
    assert unset.options.n_best == 2  # the server's default where the model says nothing
    asked = pb.TranslateRequest(texts=["x"], options=pb.DecodingOptions(beam_size=5))
    assert parse_request(asked, settings, engine.decoding_defaults).options.beam_size == 5
    # s2s-translate (no server) applies them too
    args = translate.parse_args(["--bundle", str(bundle)])
    assert SearchOptions(**{**engine.decoding_defaults, **options_from_args(args)}).beam_size == 3


def test_a_default_stopping_rule_follows_the_penalties_in_force(
    tiny: TinyModel, tmp_path: Path
) -> None:
    """grc-en-nt's defaults pair its penalties with stopping=patience, a rule that cuts the
    search short where the exact bound is loose. A request that turns both penalties off gets the
    exact rule (tight, and the exact answer, without penalties) unless it asks for a rule itself;
    with a penalty left in force, or no penalty in the defaults, the default rule stays."""
    shipped = {"length_penalty": 1.0, "coverage_penalty": 0.05, "stopping": "patience"}
    bundle = bundle_with_decoding(tiny, tmp_path, {**shipped, "patience": 1.5})
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    settings = load_settings([], {})

    def served(**asked: Any) -> str:
        request = pb.TranslateRequest(texts=["x"], options=pb.DecodingOptions(**asked))
        return parse_request(request, settings, engine.decoding_defaults).options.stopping

    def offline(*flags: str) -> str:
        args = translate.parse_args(["--bundle", str(bundle), *flags])
        given = options_from_args(args)
        return SearchOptions(**merge_options(engine.decoding_defaults, given)).stopping

    off = {"length_penalty": 0.0, "coverage_penalty": 0.0}
    assert served() == offline() == "patience"
    assert served(**off) == offline("--length-penalty", "0", "--coverage-penalty", "0") == "exact"
    assert served(**off, stopping="first") == "first"  # asked for: kept
    assert served(length_penalty=0.0) == "patience"  # the coverage penalty is still in force
    # no penalty in the defaults: their rule was chosen without one, and stays
    plain = merge_options({"stopping": "patience"}, {"length_penalty": 0.0})
    assert plain["stopping"] == "patience"
    assert merge_options({"stopping": "narrowing", "length_penalty": 1.0}, off)["stopping"] == (
        "narrowing"  # Marian's rule is not a penalty's
    )


@pytest.mark.parametrize(
    ("decoding", "message"),
    [
        ({"lenght_penalty": 1.0}, "unknown options \\['lenght_penalty'\\]"),
        ({"beam_size": 0}, "beam_size must be >= 1, got 0"),
        ({"beam_size": "five"}, "beam_size must be an integer, got 'five'"),
        ({"beam_size": {"five": 5}}, "must map option names to numbers"),
    ],
)
def test_bad_decoding_defaults_are_refused_at_load(
    tiny: TinyModel, tmp_path: Path, decoding: object, message: str
) -> None:
    bundle = bundle_with_decoding(tiny, tmp_path, decoding)
    with pytest.raises(BundleError, match=message):
        Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
