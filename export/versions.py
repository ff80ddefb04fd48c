"""A record of every released version of the bundles in models/: a name and version always mean the
same bytes.

`models/versions.json` holds, for each model name and each version released, the sha256 of each of
the bundle's files (those its manifest lists, hashed on disk) and of its manifest's settings (every
section but `info`, `files` and `version`: decoding defaults, the input rule, segmentation and the
link head's thresholds change answers as files do; `info` is documentation and figures). Clients pin
versions, caches key on them and a rollback names one, so a bundle whose bytes differ from its
recorded version fails the check (tests/test_versions.py, run by CI), which says how to release it:

    python -m export.versions                        # check every bundle in models/ (exit 1 if not)
    python -m export.versions --release models/grc-en-nt --change "what changed, in a sentence"
        # after changing a bundle's bytes: the next version (minor; --part major or patch) in its
        # manifest, the change in its info.changes, and the new version in the record
    python -m export.versions --record models/NAME   # record the version the manifest already has

A recorded version is never rewritten: recording other bytes under it is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.model.bundle import BundleError, add_files, read_manifest, sha256_of
from service.model.manifest import as_format_1

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
RECORD = MODELS / "versions.json"
NOT_SETTINGS = ("info", "files", "version")  # the manifest's sections that are not its settings
PARTS = ("major", "minor", "patch")


@dataclass(frozen=True)
class Release:
    """One version's bytes: each file's sha256 and the manifest settings' sha256."""

    files: dict[str, str]
    settings: str
    note: str = field(default="", compare=False)  # about its history (the record's reader's)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"files": dict(sorted(self.files.items())), "settings": self.settings}
        return {**out, "note": self.note} if self.note else out

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Release:
        return cls(dict(entry["files"]), str(entry["settings"]), str(entry.get("note", "")))


def settings_sha256(manifest: dict[str, Any], where: Path = Path("manifest.json")) -> str:
    """The sha256 of the manifest's settings: every section but info, files and version, as format
    1 wrote them (a manifest rewritten in a later format changes no answer, so no version)."""
    settings = {k: v for k, v in as_format_1(manifest, where).items() if k not in NOT_SETTINGS}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()


def release_of(bundle: Path) -> tuple[str, str, Release]:
    """(name, version, bytes) of a bundle folder, its files hashed as they are on disk."""
    manifest = read_manifest(bundle)
    files = {name: sha256_of(bundle / name) for name in sorted(manifest["files"])}
    return (
        str(manifest["name"]),
        str(manifest["version"]),
        Release(files, settings_sha256(manifest, bundle / "manifest.json")),
    )


def version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError as err:
        raise ValueError(f"version {version!r} is not MAJOR.MINOR.PATCH") from err


def next_version(version: str, part: str = "minor") -> str:
    """1.0.0 → 1.1.0 (minor), 2.0.0 (major), 1.0.1 (patch)."""
    major, minor, patch = [*version_key(version), 0, 0, 0][:3]
    bumped = {
        "major": (major + 1, 0, 0),
        "minor": (major, minor + 1, 0),
        "patch": (major, minor, patch + 1),
    }
    return ".".join(str(n) for n in bumped[part])


@dataclass
class Record:
    """name → version → Release, read from and written to models/versions.json."""

    models: dict[str, dict[str, Release]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path = RECORD) -> Record:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return cls(
            {
                name: {v: Release.from_dict(e) for v, e in versions.items()}
                for name, versions in data.get("models", {}).items()
            }
        )

    def save(self, path: Path = RECORD) -> None:
        data = {
            "about": "Every released version of the bundles in models/: a name and version always "
            "mean these bytes (each file's sha256, and the sha256 of the manifest's settings: "
            "every section but info, files and version). Checked by tests/test_versions.py; "
            "after changing a bundle: python -m export.versions --release models/NAME "
            '--change "what changed" (export/versions.py).',
            "models": {
                name: {
                    v: self.models[name][v].to_dict()
                    for v in sorted(self.models[name], key=version_key)
                }
                for name in sorted(self.models)
            },
        }
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def add(self, name: str, version: str, release: Release) -> bool:
        """Record a version; False when it is recorded with these bytes already. A version
        recorded with other bytes raises ValueError."""
        versions = self.models.setdefault(name, {})
        recorded = versions.get(version)
        if recorded is not None:
            if recorded == release:
                return False
            raise ValueError(
                f"{name} {version} is recorded with other bytes ({differences(recorded, release)}): "
                "a released version is never rewritten; give the bundle its next version"
            )
        versions[version] = release
        return True

    def latest(self, name: str) -> str | None:
        versions = self.models.get(name, {})
        return max(versions, key=version_key) if versions else None


def differences(recorded: Release, actual: Release) -> str:
    """What differs, in a few words: the files changed, added or gone, and the settings."""
    changed = [
        f for f in actual.files if f in recorded.files and actual.files[f] != recorded.files[f]
    ]
    added = [f for f in actual.files if f not in recorded.files]
    gone = [f for f in recorded.files if f not in actual.files]
    parts = [f"{', '.join(names)} {what}" for names, what in (
        (changed, "changed"), (added, "added"), (gone, "gone"),
    ) if names]  # fmt: skip
    if actual.settings != recorded.settings:
        parts.append("the manifest's settings changed")
    return "; ".join(parts) or "nothing"


def problem(record: Record, bundle: Path) -> str | None:
    """Why `bundle` breaks the promise that a name and version mean the same bytes; None if not."""
    name, version, actual = release_of(bundle)
    how = (
        f'python -m export.versions --release {display(bundle)} --change "what changed" '
        "(its next version, the change in its manifest, the version recorded)"
    )
    recorded = record.models.get(name, {}).get(version)
    if recorded is None:
        return f"{display(bundle)}: {name} {version} is not in {display(RECORD)}: release it with {how}"
    if recorded != actual:
        return (
            f"{display(bundle)}: {name} {version} was released with other bytes "
            f"({differences(recorded, actual)}): a name and version always mean the same bytes. "
            f"Release the new bytes as a new version: {how}"
        )
    return None


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def bundles(root: Path = MODELS) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "manifest.json").is_file())


def check(record: Record, folders: Iterable[Path]) -> list[str]:
    return [p for p in (problem(record, b) for b in folders) if p is not None]


def release(record: Record, bundle: Path, change: str, part: str = "minor") -> str:
    """Give `bundle` the next version after its recorded latest, say what changed in its manifest
    (info.changes), and record it; returns the new version. Refused when its bytes are those of
    its recorded version (nothing to release) or when no change is said."""
    if not change.strip():
        raise ValueError(
            "say what changed: --change TEXT (it goes into the manifest's info.changes)"
        )
    name, version, actual = release_of(bundle)
    recorded = record.models.get(name, {})
    if recorded.get(version) == actual:
        raise ValueError(f"{name} {version}: its bytes are the recorded ones, nothing to release")
    latest = record.latest(name)
    if version not in recorded and (latest is None or version_key(version) > version_key(latest)):
        new = version  # a version the manifest was given already, not yet recorded
    else:
        new = next_version(max(version, latest or version, key=version_key), part)
    changes = read_manifest(bundle).get("info", {}).get("changes", {})
    add_files(
        bundle, [], info={"changes": {new: change.strip(), **changes}}, sections={"version": new}
    )
    record.add(name, new, release_of(bundle)[2])
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.versions",
        description="Check or extend models/versions.json, the record of every released version.",
    )
    p.add_argument("--release", type=Path, metavar="BUNDLE", help="release a changed bundle")
    p.add_argument("--change", default="", help="with --release: what changed, in a sentence")
    p.add_argument("--part", choices=PARTS, default="minor", help="with --release: which part")
    p.add_argument("--record", type=Path, nargs="+", metavar="BUNDLE", help="record as they are")
    p.add_argument("--file", type=Path, default=RECORD, help="the record (default: %(default)s)")
    p.add_argument("--models", type=Path, default=MODELS, help="the bundles to check")
    args = p.parse_args(argv)
    record = Record.load(args.file)
    try:
        if args.release:
            new = release(record, args.release, args.change, args.part)
            record.save(args.file)
            print(f"{display(args.release)}: released as {new}, recorded in {display(args.file)}")
            return 0
        if args.record:
            for bundle in args.record:
                name, version, actual = release_of(bundle)
                added = record.add(name, version, actual)
                print(f"{name} {version}: {'recorded' if added else 'already recorded'}")
            record.save(args.file)
            return 0
    except (ValueError, BundleError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    found = check(record, bundles(args.models))
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
