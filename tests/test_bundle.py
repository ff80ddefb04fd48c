"""The model bundle refuses missing, altered and foreign files with messages that name them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.bundle import BundleError, load_bundle
from service.engine import Engine
from tests.conftest import TinyModel


@pytest.fixture
def bundle_copy(tiny: TinyModel, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny.bundle, tmp_path / "bundle"))


def test_loads_and_describes_itself(bundle_copy: Path) -> None:
    bundle = load_bundle(bundle_copy)
    assert bundle.name == "tiny" and bundle.version == "0.0.1"
    assert bundle.architecture.attention == "additive"
    assert set(bundle.files) == {
        "encoder.onnx",
        "decoder.onnx",
        "decoder.int8.onnx",
        "source.model",
        "target.model",
    }


@pytest.mark.parametrize("name", ["encoder.onnx", "decoder.onnx", "source.model", "target.model"])
def test_missing_file_is_named(bundle_copy: Path, name: str) -> None:
    (bundle_copy / name).unlink()
    with pytest.raises(BundleError, match=f"missing: .*{name}"):
        load_bundle(bundle_copy)


@pytest.mark.parametrize("name", ["encoder.onnx", "decoder.onnx", "target.model"])
def test_altered_or_truncated_file_is_named(bundle_copy: Path, name: str) -> None:
    path = bundle_copy / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=f"altered: .*{name}"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match=name):
        Engine.load(bundle_copy)


def test_manifest_problems(bundle_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="not a directory"):
        load_bundle(tmp_path / "nowhere")
    manifest = bundle_copy / "manifest.json"
    data = json.loads(manifest.read_text())
    data["architecture"]["attention"] = "telepathy"
    manifest.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="bad architecture"):
        load_bundle(bundle_copy)
    manifest.write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(bundle_copy)
    manifest.unlink()
    with pytest.raises(BundleError, match=r"manifest\.json is missing"):
        load_bundle(bundle_copy)
