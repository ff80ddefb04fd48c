"""The model bundle: one directory with the two ONNX graphs, the tokenizers and a manifest.

manifest.json records the architecture (its schema per model family and format_version:
service/model/manifest.py), the special ids, the model's name and version, and the sha256 of
every file. Loading verifies all of it and refuses a missing, altered or unexpected file with a message
that names the file: a server never starts on a model other than the one the manifest describes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from service.model.input_rule import InputRule
from service.model.languages import target_languages
from service.model.manifest import (
    FORMAT_VERSION,
    ManifestError,
    architecture_section,
    check_version,
    config_from,
    read_architecture,
)
from service.model.segment import Segmentation, SegmentationError

MANIFEST = "manifest.json"
REQUIRED_FILES = ("encoder.onnx", "decoder.onnx", "source.model", "target.model")
# decoder.int8.onnx: the int8 decoder (--int8); link_head.onnx and link_lexicon.json: the link head,
# a supervised word aligner for Align (service/decode/runtime/link_head.py, added by export/link_head.py).
# memory.tsv(.gz): the model's memory, consulted before it (service/model/memory.py);
# glossary.tsv(.gz): its standing glossary, terms its translations keep (service/model/glossary.py).
OPTIONAL_FILES = (
    "decoder.int8.onnx",
    "link_head.onnx",
    "link_lexicon.json",
    "memory.tsv",
    "memory.tsv.gz",
    "glossary.tsv",
    "glossary.tsv.gz",
)
LINK_HEAD_FILES = ("link_head.onnx", "link_lexicon.json")
# The manifest's "tokenizer" section says how text becomes ids; absent means SentencePiece (every
# bundle our trainer writes). "word": whitespace-split words looked up in vocabulary files, the
# convention of the toolkits whose checkpoints export/importers/ turns into bundles; "subword": the
# same vocabularies, fed by the toolkit's SentencePiece model or BPE codes (files the section names).
TOKENIZER_KINDS = ("sentencepiece", "word", "subword")
TOKENIZER_FILES = {
    "sentencepiece": ("source.model", "target.model"),
    "word": ("source.vocab", "target.vocab"),
}
SENTENCEPIECE = {"kind": "sentencepiece"}


def required_files(tokenizer: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The graphs plus the tokenizer files the manifest's tokenizer section asks for."""
    kind = (tokenizer or SENTENCEPIECE).get("kind")
    if kind == "subword":
        assert tokenizer is not None
        return ("encoder.onnx", "decoder.onnx", *subword_files(tokenizer))
    if kind not in TOKENIZER_FILES:
        raise BundleError(f"unknown tokenizer kind {kind!r} (known: {list(TOKENIZER_KINDS)})")
    return ("encoder.onnx", "decoder.onnx", *TOKENIZER_FILES[kind])


def subword_files(tokenizer: dict[str, Any]) -> tuple[str, ...]:
    """The vocabulary and segmenter files a "subword" section names, each once, each a plain file
    name inside the bundle."""
    names: list[str] = []
    for side in ("source", "target"):
        section = tokenizer.get(side)
        if not isinstance(section, dict):
            raise BundleError(f"the tokenizer section has no {side!r} object")
        for key in ("file", "model"):
            name = section.get(key)
            if (
                not isinstance(name, str)
                or not name
                or Path(name).name != name
                or name in (".", "..")
            ):
                raise BundleError(
                    f"the tokenizer section's {side}.{key} must name a file in the bundle, got {name!r}"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


class BundleError(ValueError):
    """The bundle is incomplete, altered, or not a bundle at all."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    name: str
    version: str
    architecture: ModelConfig
    files: dict[str, str]  # file name → sha256
    info: dict[str, Any]
    tokenizer: dict[str, Any] = field(default_factory=lambda: dict(SENTENCEPIECE))
    input_rule: InputRule | None = None  # the manifest's "input"; None: any text, as tokenized
    # The manifest's "segmentation" (service/model/segment.py); None: every input decoded whole.
    segmentation: Segmentation | None = None
    # The manifest's "confidence": {"threshold": x}: hypotheses below x are marked low_confidence
    # unless the server sets its own (--min-confidence); None: no threshold.
    confidence_threshold: float | None = None
    # The manifest's "link_head": {"row_threshold": r, "cell_threshold": c}: with the link head's
    # files, Align's "head" links (service/decode/runtime/link_head.py's head_links); None: no link head.
    link_head_thresholds: tuple[float, float] | None = None
    # The manifest's "decoding": the model's own defaults for decoding options (name → value, the
    # DecodingOptions names), chosen on its dev split; a request's own values override them, and
    # they override the server's --default-* (checked by the engine: service/decode/engine/engine.py).
    decoding: dict[str, Any] = field(default_factory=dict)
    # The manifest's "memory": a listed (hashed) file of known source → target entries, consulted
    # before the model (service/model/memory.py); None: no memory.
    memory: str | None = None
    # A multilingual model's target languages: its source vocabulary's >>xxx<< tokens' names,
    # sorted (service/model/languages.py), read at load; empty for a model with one.
    target_languages: tuple[str, ...] = ()
    # The manifest's "glossary": a listed (hashed) file of source → target terms the model's
    # translations keep (service/model/glossary.py); None: no standing glossary.
    glossary: str | None = None

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def has_int8(self) -> bool:
        return "decoder.int8.onnx" in self.files

    @property
    def has_link_head(self) -> bool:
        return self.link_head_thresholds is not None and all(
            name in self.files for name in LINK_HEAD_FILES
        )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(
    directory: Path,
    name: str,
    version: str,
    architecture: ModelConfig | dict[str, Any],
    info: dict[str, Any] | None = None,
    input_rule: InputRule | None = None,
    tokenizer: dict[str, Any] | None = None,
    segmentation: dict[str, Any] | None = None,
    confidence: dict[str, Any] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """Hash every bundle file present in `directory` and write manifest.json next to them.

    architecture: a ModelConfig, its to_dict() or a format-2 section; written in format 2, its
    family's fields only (service/model/manifest.py).
    tokenizer: the manifest's tokenizer section; None writes none (SentencePiece, as ever).
    segmentation, confidence: the manifest's sections of those names (checked here as the loader
    will read them); None writes none."""
    required = required_files(tokenizer)
    present = [f for f in (*required, *OPTIONAL_FILES) if (directory / f).is_file()]
    missing = [f for f in required if f not in present]
    if missing:
        raise BundleError(f"cannot write a manifest for {directory}: missing {missing}")
    try:
        section = architecture_section(config_from(architecture, directory / MANIFEST))
    except ManifestError as err:
        raise BundleError(str(err)) from err
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": version,
        "architecture": section,
        "special_ids": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID},
        "files": {f: sha256_of(directory / f) for f in present},
        "info": info or {},
    }
    if input_rule is not None:
        manifest["input"] = input_rule.to_dict()
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    if segmentation is not None:
        Segmentation.from_dict(segmentation)  # raises SegmentationError on a malformed one
        manifest["segmentation"] = segmentation
    if confidence is not None:
        parse_confidence(confidence, directory / MANIFEST)
        manifest["confidence"] = confidence
    if decoding:
        manifest["decoding"] = decoding
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def add_files(
    directory: Path,
    names: list[str],
    info: dict[str, Any] | None = None,
    sections: dict[str, Any] | None = None,
) -> Path:
    """List (or re-hash) `names`, files already in the bundle `directory`, in its manifest, merge
    `info` into the manifest's "info" and set its top-level `sections`; the rest is kept."""
    manifest = read_manifest(directory)
    if sections and "link_head" in sections:
        parse_link_head(sections["link_head"], directory / MANIFEST)
    manifest.update(sections or {})
    for name in names:
        if name not in OPTIONAL_FILES:
            raise BundleError(f"{name} is not a file a bundle may add (known: {OPTIONAL_FILES})")
        if not (directory / name).is_file():
            raise BundleError(f"cannot add {directory / name}: no such file")
        manifest["files"][name] = sha256_of(directory / name)
    manifest["info"] = {**manifest.get("info", {}), **(info or {})}
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise BundleError(f"model bundle not found: {directory} is not a directory")
    if not path.is_file():
        raise BundleError(f"{path} is missing: {directory} is not a model bundle")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BundleError(f"{path} is not valid JSON: {err}") from err
    try:
        check_version(manifest, path)
    except ManifestError as err:
        raise BundleError(str(err)) from err
    for key in ("name", "version", "architecture", "files", "special_ids"):
        if key not in manifest:
            raise BundleError(f"{path}: manifest has no {key!r}")
    return manifest


def verify_files(
    directory: Path, files: dict[str, str], tokenizer: dict[str, Any] | None = None
) -> None:
    """Every required file listed and present, and every listed file's sha256 as recorded."""
    unlisted = [f for f in required_files(tokenizer) if f not in files]
    if unlisted:
        raise BundleError(f"{directory / MANIFEST} does not list required files {unlisted}")
    for name, expected in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            raise BundleError(f"bundle file missing: {path}")
        actual = sha256_of(path)
        if actual != expected:
            raise BundleError(
                f"bundle file altered: {path} has sha256 {actual[:12]}…, the manifest says {expected[:12]}… "
                "(re-export the bundle, or restore the file)"
            )


def load_bundle(path: str | Path) -> Bundle:
    directory = Path(path)
    manifest = read_manifest(directory)
    tokenizer = manifest.get("tokenizer", SENTENCEPIECE)
    if not isinstance(tokenizer, dict):
        raise BundleError(f"{directory / MANIFEST}: 'tokenizer' must be an object")
    verify_files(directory, dict(manifest["files"]), tokenizer)
    expected_ids = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
    if manifest["special_ids"] != expected_ids:
        raise BundleError(
            f"{directory / MANIFEST}: special ids {manifest['special_ids']} differ from {expected_ids}"
        )
    try:
        architecture = read_architecture(
            manifest["architecture"], manifest["format_version"], directory / MANIFEST
        )
    except ManifestError as err:
        raise BundleError(str(err)) from err
    input_rule = None
    if "input" in manifest:
        try:
            input_rule = InputRule.from_dict(dict(manifest["input"]))
        except (TypeError, ValueError) as err:
            raise BundleError(f"{directory / MANIFEST}: bad input rule: {err}") from err
    segmentation = None
    if "segmentation" in manifest:
        try:
            segmentation = Segmentation.from_dict(manifest["segmentation"])
        except SegmentationError as err:
            raise BundleError(f"{directory / MANIFEST}: bad segmentation: {err}") from err
    threshold = None
    if "confidence" in manifest:
        threshold = parse_confidence(manifest["confidence"], directory / MANIFEST)
    head_thresholds = None
    if "link_head" in manifest:
        head_thresholds = parse_link_head(manifest["link_head"], directory / MANIFEST)
        missing = [f for f in LINK_HEAD_FILES if f not in manifest["files"]]
        if missing:
            raise BundleError(
                f"{directory / MANIFEST}: has a 'link_head' but does not list {missing}"
            )
    listed = {}
    for key in ("memory", "glossary"):
        name = manifest.get(key)
        if name is not None and (not isinstance(name, str) or name not in manifest["files"]):
            raise BundleError(
                f"{directory / MANIFEST}: '{key}' must name a file the manifest lists, got {name!r}"
            )
        listed[key] = name
    decoding = manifest.get("decoding", {})
    if not isinstance(decoding, dict) or not all(
        isinstance(k, str) and _is_option_value(v) for k, v in decoding.items()
    ):
        raise BundleError(
            f"{directory / MANIFEST}: 'decoding' must map option names to numbers, booleans, "
            "strings or lists of strings"
        )
    return Bundle(
        path=directory,
        name=str(manifest["name"]),
        version=str(manifest["version"]),
        architecture=architecture,
        files=dict(manifest["files"]),
        info=dict(manifest.get("info", {})),
        input_rule=input_rule,
        tokenizer=dict(tokenizer),
        segmentation=segmentation,
        confidence_threshold=threshold,
        link_head_thresholds=head_thresholds,
        decoding=dict(decoding),
        memory=listed["memory"],
        glossary=listed["glossary"],
        target_languages=read_target_languages(directory, tokenizer),
    )


def read_target_languages(directory: Path, tokenizer: dict[str, Any]) -> tuple[str, ...]:
    """The >>xxx<< tokens' names among the source vocabulary's pieces: its vocabulary file (line
    i is piece i), or a SentencePiece bundle's source.model pieces (a few milliseconds for
    OPUS-MT's 60,000). A file that does not read gives none: the tokenizer's loader names it."""
    kind = tokenizer.get("kind", "sentencepiece")
    section = tokenizer.get("source")
    if kind == "sentencepiece":
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(directory / "source.model"))
        except (OSError, RuntimeError):
            return ()
        return target_languages(processor.IdToPiece(i) for i in range(processor.GetPieceSize()))
    if not isinstance(section, dict) or not isinstance(section.get("file"), str):
        return ()
    try:
        text = (directory / section["file"]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ()
    return target_languages(text.split("\n"))


def parse_confidence(section: object, where: Path) -> float:
    """The threshold of a manifest's "confidence": {"threshold": x} section, x in [0, 1]."""
    if not isinstance(section, dict) or set(section) != {"threshold"}:
        raise BundleError(f"{where}: 'confidence' must be an object {{\"threshold\": x}}")
    value = section["threshold"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise BundleError(
            f"{where}: confidence.threshold must be a number in [0, 1], got {value!r}"
        )
    return float(value)


def parse_link_head(section: object, where: Path) -> tuple[float, float]:
    """(row, cell) thresholds of a manifest's "link_head": {"row_threshold": r, "cell_threshold":
    c} section, each a probability in [0, 1]."""
    keys = ("row_threshold", "cell_threshold")
    if not isinstance(section, dict) or set(section) != set(keys):
        raise BundleError(
            f'{where}: \'link_head\' must be an object {{"row_threshold": r, "cell_threshold": c}}'
        )
    values = []
    for key in keys:
        value = section[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise BundleError(f"{where}: link_head.{key} must be a number in [0, 1], got {value!r}")
        values.append(float(value))
    return values[0], values[1]


def _is_option_value(value: object) -> bool:
    """What a decoding option's default can be in a manifest (its type is checked at load)."""
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    return isinstance(value, int | float | str | bool)
