"""The model repository on its own: layouts, the version policy, lookups, reloads and retirement.

Loading is a spy (it records the paths and returns a stand-in engine), so these tests see what the
repository decides, not ONNX Runtime; tests/test_models.py serves real bundles.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from service.decode.engine.engine import Engine
from service.decode.shared.errors import ModelNotFound
from service.serve.config import VersionPolicy, load_settings
from service.serve.repository import Events, ModelVersion, Repository, scan
from tests.conftest import DEFAULT_BUNDLE


def fake_bundle(folder: Path, name: str = "m", version: str = "1") -> Path:
    """A folder with a manifest (enough for scanning; the spy loader reads nothing else)."""
    folder.mkdir(parents=True)
    manifest = {"format_version": 1, "name": name, "version": version}
    manifest |= {"architecture": {}, "files": {}, "special_ids": {}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


class Spy:
    """A loader that records the bundles it loads and refuses those marked broken."""

    def __init__(self) -> None:
        self.loaded: list[Path] = []

    def __call__(self, path: Path) -> Engine:
        if (path / "BROKEN").exists():
            raise ValueError(f"bundle file altered: {path}/decoder.onnx")
        self.loaded.append(path)
        return cast(Engine, object())


class Recorder(Events):
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def loaded(self, model: ModelVersion) -> None:
        self.log.append(("loaded", str(model)))

    def unloaded(self, model: ModelVersion) -> None:
        self.log.append(("unloaded", str(model)))

    def failed(self, name: str, version: str, error: Exception) -> None:
        self.log.append(("failed", f"{name}:{version}"))


def repo_at(root: Path, **kw: Any) -> tuple[Repository, Spy, Recorder]:
    spy, events = Spy(), Recorder()
    return Repository(root, spy, events=events, **kw), spy, events


# --- layouts and policy -----------------------------------------------------------------------


def test_scan_reads_numbered_versions_and_bundle_folders(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "numbers" / "1")
    fake_bundle(tmp_path / "numbers" / "10")
    fake_bundle(tmp_path / "numbers" / "2")
    (tmp_path / "numbers" / "notes").mkdir()  # not a number: not a version
    fake_bundle(tmp_path / "default", name="numbers-en-fr", version="1.0.0")  # embedded layout
    (tmp_path / "default.pt").write_bytes(b"")  # files beside the models are ignored
    found = scan(tmp_path)
    assert sorted(found) == ["numbers", "numbers-en-fr"]
    assert sorted(found["numbers"]) == ["1", "10", "2"]
    assert list(found["numbers-en-fr"]) == ["1.0.0"]


def test_the_embedded_models_folder_is_a_repository() -> None:
    found = scan(DEFAULT_BUNDLE.parent)
    manifest = json.loads((DEFAULT_BUNDLE / "manifest.json").read_text())
    assert found[manifest["name"]][manifest["version"]].path == DEFAULT_BUNDLE


@pytest.mark.parametrize(
    ("policy", "pinned", "expected"),
    [
        ("latest", (), ["10"]),
        ("all", (), ["1", "2", "10"]),
        ("latest", ("numbers:2", "numbers:1"), ["1", "2"]),
        ("latest", ("other:2",), ["10"]),  # a pin for another model changes nothing here
    ],
)
def test_version_policy(policy: str, pinned: tuple[str, ...], expected: list[str]) -> None:
    assert VersionPolicy(policy, pinned).select("numbers", ["2", "10", "1"]) == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--version-policy", "newest"], "version policy must be"),
        (["--pinned-versions", "numbers"], "NAME:VERSION"),
        (["--reload-interval-s", "-1"], "reload_interval_s"),
    ],
)
def test_bad_repository_settings_are_refused_at_load(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(flags, environ={})


# --- lookups ------------------------------------------------------------------------------------


def test_lookup_defaults_and_not_found_messages(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "numbers" / "1")
    fake_bundle(tmp_path / "numbers" / "2")
    fake_bundle(tmp_path / "other" / "7")
    repo, _, _ = repo_at(tmp_path, policy=VersionPolicy("all"))
    repo.load_all()
    assert repo.default() == "numbers"  # no folder named "default": the first by name
    assert str(repo.get()) == "numbers:2"  # the default model's latest version
    assert str(repo.get("numbers", "1")) == "numbers:1"
    assert str(repo.get("other")) == "other:7"
    with pytest.raises(ModelNotFound, match=r"'missing' is not served.*\['numbers', 'other'\]"):
        repo.get("missing")
    with pytest.raises(ModelNotFound, match=r"no version '3'.*\['1', '2'\]"):
        repo.get("numbers", "3")
    pinned, _, _ = repo_at(tmp_path, default_model="other")
    pinned.load_all()
    assert pinned.default() == "other"


# --- reloads ------------------------------------------------------------------------------------


def test_a_new_version_replaces_the_old_which_unloads_when_its_last_request_ends(
    tmp_path: Path,
) -> None:
    fake_bundle(tmp_path / "numbers" / "1")
    repo, spy, events = repo_at(tmp_path)
    repo.load_all()
    held = repo.acquire("numbers")  # a request admitted to version 1
    fake_bundle(tmp_path / "numbers" / "2")
    report = repo.reload()
    assert report.loaded == ["numbers:2"] and report.retired == ["numbers:1"]
    assert str(repo.get("numbers")) == "numbers:2"  # new requests get the new version
    with pytest.raises(ModelNotFound):
        repo.get("numbers", "1")
    assert held.retired and ("unloaded", "numbers:1") not in events.log  # still answering
    repo.release(held)
    assert events.log[-1] == ("unloaded", "numbers:1")
    assert repo.reload().changed is False and len(spy.loaded) == 2  # nothing new: nothing loaded
    assert events.log.count(("unloaded", "numbers:1")) == 1  # exactly once


def test_a_broken_version_is_refused_and_the_old_one_keeps_serving(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "numbers" / "1")
    repo, spy, events = repo_at(tmp_path)
    repo.load_all()
    broken = fake_bundle(tmp_path / "numbers" / "2")
    (broken / "BROKEN").touch()
    report = repo.reload()
    assert report.failed == ["numbers:2"] and not report.retired
    assert str(repo.get("numbers")) == "numbers:1"
    assert ("failed", "numbers:2") in events.log
    # refused once: not tried again on every poll, only when its manifest changes
    repo.reload()
    assert events.log.count(("failed", "numbers:2")) == 1
    (broken / "BROKEN").unlink()
    manifest = broken / "manifest.json"
    manifest.write_text(manifest.read_text() + "\n")  # fixed and rewritten
    assert repo.reload().loaded == ["numbers:2"]
    assert str(repo.get("numbers")) == "numbers:2" and spy.loaded[-1] == broken


def test_a_removed_model_is_retired_and_a_new_one_served(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "numbers" / "1")
    repo, _, events = repo_at(tmp_path)
    repo.load_all()
    shutil.rmtree(tmp_path / "numbers")
    fake_bundle(tmp_path / "g2p" / "3")
    report = repo.reload()
    assert report.loaded == ["g2p:3"] and report.retired == ["numbers:1"]
    assert repo.names() == ["g2p"] and ("unloaded", "numbers:1") in events.log


def test_nothing_loadable_is_an_error_at_start_with_the_bundles_own_message(
    tmp_path: Path,
) -> None:
    (fake_bundle(tmp_path / "numbers" / "1") / "BROKEN").touch()
    repo, _, _ = repo_at(tmp_path)
    with pytest.raises(ValueError, match="bundle file altered"):
        repo.load_all()
    empty, _, _ = repo_at(tmp_path / "nowhere")
    with pytest.raises(ModelNotFound, match="no model could be loaded"):
        empty.load_all()


def test_a_version_reports_at_least_its_graphs_bytes_when_the_process_did_not_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An allocator that reuses memory freed earlier (an unloaded version, a long-lived test
    # process) may load a version without growing the process: its size is then its graphs'.
    folder = fake_bundle(tmp_path / "m" / "1")
    (folder / "decoder.onnx").write_bytes(b"\0" * 3000)
    (folder / "encoder.onnx").write_bytes(b"\0" * 1000)
    monkeypatch.setattr("service.serve.repository.resident_bytes", lambda: 10**9)
    repo, _, _ = repo_at(tmp_path)
    repo.reload()
    assert repo.get("m").resident_bytes == 4000
