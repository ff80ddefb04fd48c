"""The model bundle refuses missing, altered and foreign files with messages that name them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.decode.engine.engine import Engine
from service.model.bundle import BundleError, load_bundle, sha256_of
from service.model.graph_contract import check_graph
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


def resealed(bundle: Path, name: str, change: Callable[[Path], None]) -> Path:
    """Change one file, then recompute its checksum in the manifest, as a careless repack would."""
    change(bundle / name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if name in manifest["files"]:
        manifest["files"][name] = sha256_of(bundle / name)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def scramble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(100, len(data), 997):
        data[i] ^= 0xA0
    path.write_bytes(bytes(data))


def edit_architecture(**changes: int) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        manifest = json.loads(path.read_text())
        manifest["architecture"].update(changes)
        path.write_text(json.dumps(manifest))

    return change


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("encoder.onnx", scramble, r"encoder\.onnx: ONNX Runtime cannot load this graph"),
        ("decoder.onnx", scramble, r"decoder\.onnx: ONNX Runtime cannot load this graph"),
        (
            "encoder.onnx",
            lambda p: shutil.copyfile(p.parent / "decoder.onnx", p),
            r"encoder\.onnx is not the encoder graph .*no input 'src'.*unexpected input 'tokens'",
        ),
        (
            "source.model",
            lambda p: shutil.copyfile(p.parent / "target.model", p),
            r"manifest\.json: .*src_vocab_size is \d+ but the source tokenizer has \d+ entries",
        ),
        (
            "manifest.json",
            edit_architecture(eos_id=5),
            r"manifest\.json: .*eos_id is 5 but the source tokenizer's is 2",
        ),
        (
            "manifest.json",
            edit_architecture(enc_hidden=24),
            r"encoder\.onnx is not the encoder graph .*output 'values' axis 2 is 32, .*enc_out_dim = 48",
        ),
    ],
)
def test_resealed_damage_is_refused_at_load_naming_the_file(
    bundle_copy: Path, name: str, change: Callable[[Path], None], message: str
) -> None:
    resealed(bundle_copy, name, change)
    load_bundle(bundle_copy)  # the checksums agree: only the load-time checks can tell
    with pytest.raises(BundleError, match=message):
        Engine.load(bundle_copy)


def test_graph_contract_names_types_ranks_and_fixed_sizes(tiny: TinyModel) -> None:
    @dataclass
    class Arg:
        name: str
        type: str
        shape: list[int | str | None]

    cfg = load_bundle(tiny.bundle).architecture
    good = [
        Arg("src", "tensor(int64)", ["batch", "src_len"]),
        Arg("src_lengths", "tensor(int64)", ["batch"]),
    ]
    outputs = [
        Arg("values", "tensor(float)", ["batch", "src_len", cfg.enc_out_dim]),
        Arg("keys", "tensor(float)", ["batch", "key_len", 16]),
        Arg("mask", "tensor(bool)", ["batch", "src_len"]),
        Arg("state", "tensor(float)", ["batch", cfg.state_dim]),
    ]
    check_graph(Path("e.onnx"), "encoder", good, outputs, cfg)
    bad = [Arg("src", "tensor(int32)", ["batch"]), Arg("src_lengths", "tensor(int64)", ["batch"])]
    with pytest.raises(
        BundleError,
        match=r"e\.onnx.*'src' is tensor\(int32\), expected tensor\(int64\); input 'src' has rank 1",
    ):
        check_graph(Path("e.onnx"), "encoder", bad, outputs, cfg)
