"""The manifest's `architecture` section per model family, and the one loader of every format.

format 1 (every bundle written before format 2): the section is `ModelConfig.to_dict()`, the RNN's
fields in every bundle, a Transformer's beside its `transformer` shape (unused there: read as
ignored).
format 2: the section names its `family` and holds that family's fields only:
    rnn          the shared fields and the RNN's (rnn, enc_hidden, dec_hidden, bridge, ...)
    transformer  the shared fields and the `transformer` shape
    shared       vocabulary sizes, special ids, emb_dim, toolkit, attention, dropout (the
                 training's, a record), and `decoder_states` where there are some
A field of the other family's is refused at load, naming the file and the field; so is any
format_version but these. A field left out takes ModelConfig's default, as in format 1 (the oldest
manifests predate `bridge`, `toolkit`, ...). Both formats read to the same ModelConfig, a
Transformer's RNN fields at their defaults.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from service.model.architecture import ModelConfig

FORMAT_VERSION = 2  # what write_manifest writes
FORMAT_VERSIONS = (1, 2)  # what the loader reads
FAMILIES = ("rnn", "transformer")
SHARED_FIELDS = (
    "src_vocab_size",
    "tgt_vocab_size",
    "emb_dim",
    "pad_id",
    "bos_id",
    "eos_id",
    "unk_id",
    "toolkit",
    "attention",
    "dropout",
)
FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "rnn": (
        *SHARED_FIELDS,
        "rnn",
        "enc_hidden",
        "dec_hidden",
        "enc_layers",
        "dec_layers",
        "bidirectional",
        "decoder_style",
        "attn_dim",
        "bridge",
        "input_feed",
    ),
    "transformer": (*SHARED_FIELDS, "transformer"),
}
OPTIONAL_FIELDS = ("decoder_states",)  # written only where there are some
# The fields a Transformer's config holds at their defaults: format 2 does not write them.
RNN_ONLY = tuple(name for name in FAMILY_FIELDS["rnn"] if name not in FAMILY_FIELDS["transformer"])
RNN_DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.name in RNN_ONLY}


class ManifestError(ValueError):
    """A manifest of an unknown format, or an architecture section outside its family's schema."""


def family_of(cfg: ModelConfig) -> str:
    return "rnn" if cfg.transformer is None else "transformer"


def architecture_section(cfg: ModelConfig) -> dict[str, Any]:
    """The format-2 `architecture` of `cfg`: its family and that family's fields; a Transformer
    whose RNN fields are not their defaults is refused, since its manifest could not carry them."""
    family = family_of(cfg)
    if family == "transformer":
        changed = [name for name in RNN_ONLY if getattr(cfg, name) != RNN_DEFAULTS[name]]
        if changed:
            raise ManifestError(
                f"a Transformer's config sets RNN fields {changed}, which its manifest does not "
                "carry: leave them at their defaults"
            )
    keep = {*FAMILY_FIELDS[family], *OPTIONAL_FIELDS}
    return {"family": family, **{k: v for k, v in cfg.to_dict().items() if k in keep}}


def check_version(manifest: object, where: Path) -> int:
    """The manifest's format_version, one the loader reads."""
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if isinstance(version, bool) or version not in FORMAT_VERSIONS:
        raise ManifestError(
            f"{where}: unsupported bundle format: format_version {version!r} "
            f"(this version reads {list(FORMAT_VERSIONS)})"
        )
    return int(version)


def read_architecture(section: object, version: int, where: Path) -> ModelConfig:
    """The ModelConfig a manifest's `architecture` of format `version` describes."""
    if not isinstance(section, dict):
        raise ManifestError(f"{where}: 'architecture' must be an object")
    data = dict(section)
    if version == 1:
        if data.get("transformer") is not None:  # its RNN fields describe nothing
            data = {k: v for k, v in data.items() if k not in RNN_ONLY}
    elif version == 2:
        data = _family_fields(data, where)
    else:
        raise ManifestError(f"{where}: no architecture schema for format_version {version!r}")
    try:
        return ModelConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ManifestError(f"{where}: bad architecture: {err}") from err


def _family_fields(section: dict[str, Any], where: Path) -> dict[str, Any]:
    """A format-2 section's fields without `family`, checked against its family's schema."""
    family = section.pop("family", None)
    if family not in FAMILIES:
        raise ManifestError(
            f"{where}: architecture.family must be one of {list(FAMILIES)}, got {family!r}"
        )
    allowed = FAMILY_FIELDS[family]
    foreign = sorted(set(section) - {*allowed, *OPTIONAL_FIELDS})
    if foreign:
        raise ManifestError(
            f"{where}: architecture field{'s' if len(foreign) > 1 else ''} "
            f"{', '.join(map(repr, foreign))} {'are' if len(foreign) > 1 else 'is'} not of the "
            f"{family} family "
            f"(format_version 2: its fields are {sorted(allowed)}, and {list(OPTIONAL_FIELDS)})"
        )
    return section


def config_from(architecture: ModelConfig | dict[str, Any], where: Path) -> ModelConfig:
    """What write_manifest is given: a ModelConfig, its to_dict() (format 1's section) or a
    format-2 section (one with a `family`, read from another bundle's manifest)."""
    if isinstance(architecture, ModelConfig):
        return architecture
    version = 2 if isinstance(architecture, dict) and "family" in architecture else 1
    return read_architecture(architecture, version, where)


def to_format_2(manifest: dict[str, Any], where: Path) -> dict[str, Any]:
    """A format-1 manifest rewritten in format 2, every other section as it was: its architecture
    names its family, a Transformer's without the RNN fields format 1 gave it (read as ignored)."""
    if check_version(manifest, where) != 1:
        return manifest
    section = manifest["architecture"]
    cfg = read_architecture(section, 1, where)  # a section format 1 reads, or a clear error
    family = family_of(cfg)
    kept = {k: v for k, v in section.items() if family == "rnn" or k not in RNN_ONLY}
    architecture = dict(sorted({**kept, "family": family}.items()))
    return {**manifest, "architecture": architecture, "format_version": 2}


def as_format_1(manifest: dict[str, Any], where: Path) -> dict[str, Any]:
    """The manifest as format 1 wrote it (to_format_2's inverse; a Transformer's RNN fields at
    their defaults, as format 1 wrote them): what a release's settings are hashed over, so that
    rewriting a manifest in a later format, which changes no answer, keeps its recorded version
    (export/versions.py)."""
    if check_version(manifest, where) == 1:
        return manifest
    section = manifest.get("architecture")
    read_architecture(section, 2, where)  # a section of its family's schema, or a clear error
    assert isinstance(section, dict)
    architecture = {k: v for k, v in section.items() if k != "family"}
    if section["family"] == "transformer":
        architecture = {**RNN_DEFAULTS, **architecture}
    architecture = dict(sorted(architecture.items()))
    return {**manifest, "architecture": architecture, "format_version": 1}
