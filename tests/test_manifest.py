"""The manifest's architecture schema per family and its one versioned loader
(service/model/manifest.py): format 2 writes a family's fields only, format 1 (every bundle written
before it, kept in tests/data/manifest-format-1/) still loads to the same ModelConfig, and anything
else is refused naming the file and the field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from export.versions import settings_sha256
from service.model.architecture import ModelConfig
from service.model.bundle import BundleError, load_bundle, write_manifest
from service.model.manifest import (
    FAMILY_FIELDS,
    FORMAT_VERSION,
    OPTIONAL_FIELDS,
    ManifestError,
    architecture_section,
    as_format_1,
    read_architecture,
    to_format_2,
)
from tests.conftest import REPO

FORMAT_1 = Path(__file__).parent / "data" / "manifest-format-1"
WHERE = Path("bundle/manifest.json")
RNN_FIELDS = {"rnn", "enc_hidden", "dec_hidden", "bridge", "bidirectional", "decoder_style"}


def format_1(name: str) -> dict[str, Any]:
    """The manifest models/NAME had in format 1 (its text before the rewrite to format 2)."""
    return json.loads((FORMAT_1 / f"{name}.json").read_text(encoding="utf-8"))


def transformer_config() -> ModelConfig:
    return read_architecture(format_1("grc-en-nt-transformer")["architecture"], 1, WHERE)


def rnn_config() -> ModelConfig:
    return read_architecture(format_1("default")["architecture"], 1, WHERE)


def test_every_config_field_has_a_place_in_the_schema() -> None:
    """A ModelConfig field no family writes would be lost in format 2."""
    placed = {*FAMILY_FIELDS["rnn"], *FAMILY_FIELDS["transformer"], *OPTIONAL_FIELDS}
    assert placed == {f.name for f in fields(ModelConfig)}
    assert "transformer" not in FAMILY_FIELDS["rnn"]
    assert not RNN_FIELDS & set(FAMILY_FIELDS["transformer"])


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_a_new_manifest_holds_only_its_familys_fields(family: str, tmp_path: Path) -> None:
    cfg = rnn_config() if family == "rnn" else transformer_config()
    for name in ("encoder.onnx", "decoder.onnx", "source.model", "target.model"):
        (tmp_path / name).write_bytes(name.encode())
    write_manifest(tmp_path, "m", "1", cfg.to_dict())  # what the exporters pass
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    section = manifest["architecture"]
    assert manifest["format_version"] == FORMAT_VERSION == 2
    assert section["family"] == family
    expected = {"family", *FAMILY_FIELDS[family]} | (
        {"decoder_states"} if cfg.decoder_states else set()
    )
    assert set(section) == expected
    if family == "transformer":
        assert not RNN_FIELDS & set(section) and section["transformer"]["d_model"] == 256
    else:
        assert "transformer" not in section and section["decoder_style"] == "cgru"
    assert read_architecture(section, 2, WHERE) == cfg
    # a format-2 section read from a manifest is written back the same, as is the config itself
    write_manifest(tmp_path, "m", "1", section)
    assert json.loads((tmp_path / "manifest.json").read_text())["architecture"] == section
    assert architecture_section(cfg) == section


@pytest.mark.parametrize("name", ["default", "grc-en-nt-transformer"])
def test_format_1_loads_to_the_config_of_its_format_2_rewrite(name: str, tmp_path: Path) -> None:
    """The committed bundle is its format-1 manifest rewritten (to_format_2), every other section
    as it was; both load to one ModelConfig, and the rewrite keeps the release's settings hash."""
    old = format_1(name)
    committed = REPO / "models" / name
    new = json.loads((committed / "manifest.json").read_text(encoding="utf-8"))
    # the languages were written into info later (documentation: outside the settings hash)
    languages = {k: new["info"].pop(k) for k in ("source_language", "target_language")}
    assert all(languages.values())
    assert (old["format_version"], new["format_version"]) == (1, 2)
    assert to_format_2(old, WHERE) == new
    assert {k: v for k, v in new.items() if k not in ("architecture", "format_version")} == {
        k: v for k, v in old.items() if k not in ("architecture", "format_version")
    }
    assert as_format_1(new, WHERE) == old
    assert settings_sha256(new) == settings_sha256(old)
    # the whole bundle, loaded from either manifest (its files linked, not copied)
    for file in committed.iterdir():
        if file.name != "manifest.json":
            (tmp_path / file.name).symlink_to(file)
    (tmp_path / "manifest.json").write_text(json.dumps(old), encoding="utf-8")
    assert load_bundle(tmp_path).architecture == load_bundle(committed).architecture
    assert read_architecture(old["architecture"], 1, WHERE) == load_bundle(committed).architecture


def test_format_1_ignores_a_transformers_rnn_fields_and_checks_the_rest() -> None:
    section = {**format_1("grc-en-nt-transformer")["architecture"], "rnn": "lstm", "enc_hidden": 7}
    assert read_architecture(section, 1, WHERE) == transformer_config()
    with pytest.raises(ManifestError, match=r"unknown model config keys: \['family'\]"):
        read_architecture({**section, "family": "transformer"}, 1, WHERE)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: {**s, "rnn": "gru"},
            r"bundle/manifest\.json: architecture field 'rnn' is not of the transformer family",
        ),
        (
            lambda s: {**s, "bridge": "linear_tanh", "dec_hidden": 256},
            r"manifest\.json: architecture fields 'bridge', 'dec_hidden' are not of the transformer",
        ),
        (lambda s: {k: v for k, v in s.items() if k != "family"}, r"family must be one of .* None"),
        (lambda s: {**s, "family": "cnn"}, r"architecture\.family must be one of .*'cnn'"),
        (lambda s: {**s, "heads": 4}, r"architecture field 'heads' is not of the transformer"),
    ],
)
def test_a_field_outside_its_family_is_refused_naming_it(
    change: Callable[[dict[str, Any]], dict[str, Any]], message: str
) -> None:
    section = architecture_section(transformer_config())
    with pytest.raises(ManifestError, match=message):
        read_architecture(change(section), 2, WHERE)


def test_an_rnn_section_with_a_transformer_shape_is_refused() -> None:
    section = {**architecture_section(rnn_config()), "transformer": {"d_model": 8}}
    with pytest.raises(ManifestError, match="field 'transformer' is not of the rnn family"):
        read_architecture(section, 2, WHERE)


@pytest.mark.parametrize("version", [0, 3, "2", None, True])
def test_an_unknown_format_version_is_refused_naming_the_file(
    version: object, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(
        json.dumps({**format_1("default"), "format_version": version})
    )
    with pytest.raises(
        BundleError,
        match=rf"bundle/manifest\.json: unsupported bundle format: format_version {version!r}",
    ):
        load_bundle(bundle)


def test_the_loaders_refusal_names_the_bundles_manifest(tmp_path: Path) -> None:
    committed = REPO / "models" / "grc-en-nt-transformer"
    for file in committed.iterdir():
        if file.name != "manifest.json":
            (tmp_path / file.name).symlink_to(file)
    manifest = json.loads((committed / "manifest.json").read_text())
    manifest["architecture"]["decoder_style"] = "bahdanau"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        BundleError,
        match=re.escape(f"{tmp_path}/manifest.json: architecture field 'decoder_style'"),
    ):
        load_bundle(tmp_path)


def test_a_transformer_with_rnn_settings_is_not_written() -> None:
    """Its manifest could not carry them: what is written must load to the same config."""
    with pytest.raises(ManifestError, match=r"sets RNN fields \['enc_hidden'\]"):
        architecture_section(replace(transformer_config(), enc_hidden=64))
