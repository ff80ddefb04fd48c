"""A name and version always mean the same bytes: models/versions.json records every released
version of the bundles in models/ (each file's sha256 and the manifest's settings), and every
bundle there is its recorded version, byte for byte (export/versions.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from export import versions
from service.model.bundle import add_files, load_bundle
from tests.conftest import REPO, TinyModel


@pytest.mark.parametrize("bundle", versions.bundles(), ids=lambda p: p.name)
def test_every_bundle_is_its_recorded_version_byte_for_byte(bundle: Path) -> None:
    record = versions.Record.load()
    assert versions.problem(record, bundle) is None, versions.problem(record, bundle)


def test_every_released_version_stays_in_the_record() -> None:
    """The versions of the embedded bundles released so far, which a client may have pinned, are
    in the record (those released before it with the bytes they had last, a note saying so where
    they changed under one number); each bundle in models/ is its model's latest version, and
    says in its manifest what changed in it."""
    record = versions.Record.load()
    released = {
        "g2p-en-cmudict": {"1.0.0", "1.1.0", "1.2.0", "1.3.0"},
        "grc-en-nt": {"1.0.0", "1.1.0", "1.2.0"},
        "grc-en-nt-silver": {"1.0.0", "1.1.0"},
        "grc-en-nt-transformer": {"1.0.0", "1.1.0"},
        "numbers-en-fr": {"1.0.0", "2.0.0", "2.1.0"},
    }
    for name, numbers in released.items():
        assert numbers <= set(record.models[name]), name
    assert "df76a81" in record.models["grc-en-nt"]["1.0.0"].note
    assert "98b8540" in record.models["g2p-en-cmudict"]["1.1.0"].note
    # the two-member link head of df76a81 is 1.1.0's, as first recorded; the distilled one 1.2.0's
    grc = record.models["grc-en-nt"]
    assert grc["1.1.0"].files["link_head.onnx"] != grc["1.2.0"].files["link_head.onnx"]
    for bundle in versions.bundles():
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["version"] == record.latest(manifest["name"]), bundle
        if manifest["name"] in ("grc-en-nt", "g2p-en-cmudict"):  # released by this record
            # the newest entry is its version's (the manifest is written with sorted keys: the
            # entries' order in the file says nothing)
            changes = manifest["info"]["changes"]
            assert max(changes, key=versions.version_key) == manifest["version"]


def with_memory(tiny: TinyModel, bundle: Path, target: str) -> Path:
    """A copy of the tiny bundle whose memory (a file the manifest lists) says `target`."""
    if not bundle.exists():
        shutil.copytree(tiny.bundle, bundle)
    (bundle / "memory.tsv").write_text(f"{tiny.sources[0]}\t{target}\n", "utf-8")
    add_files(bundle, ["memory.tsv"], sections={"memory": "memory.tsv"})
    return bundle


def test_changed_bytes_under_a_recorded_version_fail_and_say_how_to_release(
    tiny: TinyModel, tmp_path: Path
) -> None:
    bundle = with_memory(tiny, tmp_path / "tiny", "six")
    record = versions.Record()
    name, version, release = versions.release_of(bundle)
    assert record.add(name, version, release) and not record.add(name, version, release)
    assert versions.problem(record, bundle) is None
    with_memory(tiny, bundle, "sept")  # the manifest agrees: the bundle loads, other answers
    found = versions.problem(record, bundle)
    assert found is not None
    assert f"{name} {version} was released with other bytes (memory.tsv changed)" in found
    assert "python -m export.versions --release" in found and '--change "what changed"' in found
    with pytest.raises(ValueError, match="recorded with other bytes"):
        record.add(name, version, versions.release_of(bundle)[2])
    # a setting of the manifest counts as bytes too (decoding defaults change answers)
    new = versions.release(record, bundle, "the memory says sept")
    assert new == versions.next_version(version) and versions.problem(record, bundle) is None
    add_files(bundle, [], sections={"decoding": {"beam_size": 3}})
    assert "the manifest's settings changed" in (versions.problem(record, bundle) or "")
    # info is documentation: figures may change under a version
    add_files(bundle, [], sections={"decoding": {}}, info={"test": {"bleu": 1.0}})
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.pop("decoding")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert versions.problem(record, bundle) is None


def test_releasing_writes_the_next_version_and_what_changed(
    tiny: TinyModel, tmp_path: Path
) -> None:
    bundle, path = with_memory(tiny, tmp_path / "tiny", "six"), tmp_path / "versions.json"
    assert versions.main(["--record", str(bundle), "--file", str(path)]) == 0
    name, version, _ = versions.release_of(bundle)
    argv = ["--release", str(bundle), "--change", "nothing", "--file", str(path)]
    assert versions.main(argv) == 1  # the bytes are the recorded ones: nothing to release
    with_memory(tiny, bundle, "sept")
    argv = ["--release", str(bundle), "--change", "the memory says sept", "--file", str(path)]
    assert versions.main(argv) == 0
    manifest = json.loads((bundle / "manifest.json").read_text())
    new = versions.next_version(version)
    assert manifest["version"] == new
    assert manifest["info"]["changes"] == {new: "the memory says sept"}
    recorded = json.loads(path.read_text())["models"][name]
    assert list(recorded) == [version, new]
    assert load_bundle(bundle).version == new  # the bundle still loads: its files are as listed
    assert versions.next_version("1.2.3", "major") == "2.0.0"
    assert versions.next_version("1.2.3", "patch") == "1.2.4"


def test_the_check_runs_as_a_command() -> None:
    assert versions.main(["--models", str(REPO / "models")]) == 0
