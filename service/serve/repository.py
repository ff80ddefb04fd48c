"""The model repository: (model name, version) → a loaded, warmed-up engine; scanning, policy, reloads.

A repository folder holds one folder per model, `DIR/NAME/VERSION/` with a bundle inside (versions
are numbered folders; the highest number is the latest). A folder that is itself a bundle
(`DIR/NAME/manifest.json`, as the embedded `models/default`) is a model with one version, named
and versioned by its manifest: so `models/` is the default repository and `--bundle PATH` a
repository of one. The version policy picks what is loaded: the latest version of each model
(default), every version ("all"), or pinned versions (`NAME:VERSION`, for the models named).

Reloads (SIGHUP, a polling interval) never stop serving: a new version is loaded and warmed up off
the serving threads, then swapped in for new requests; requests admitted to the old version hold
it (`acquire`/`release`) and finish on it, and it is unloaded when the last one is released. A
version that fails to load is refused with a log line and a metric, and the versions already
loaded go on serving; it is tried again only once its manifest changes.

The worker never sees files: it receives `ModelVersion`s, whose identity keys its batches.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.decode.engine.text_side import TextSide
from service.decode.shared.errors import ModelNotFound
from service.model.bundle import MANIFEST, read_manifest
from service.serve.config import VersionPolicy

log = logging.getLogger("s2s.repository")

LoadFn = Callable[[Path], TextSide]  # bundle folder → engine (or a front's text side), loaded


@dataclass(eq=False)
class ModelVersion:
    """One loaded version of a model; compared by identity (a reload of the same version is
    another object, so its batches never mix with the old one's)."""

    name: str
    version: str
    engine: TextSide
    path: Path | None = None
    resident_bytes: int = (
        0  # the process's resident memory growth while it loaded (at least its graphs' bytes)
    )
    in_flight: int = 0  # requests admitted to it and not yet answered (guarded by the repository)
    retired: bool = False  # no new requests: unloaded once in_flight reaches 0
    unloaded: bool = False

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


def single(engine: TextSide, name: str = "") -> ModelVersion:
    """An engine loaded elsewhere as a repository entry, named and versioned by its manifest."""
    return ModelVersion(
        name or engine.bundle.name, engine.bundle.version, engine, engine.bundle.path
    )


def version_order(version: str) -> tuple[int, int | str]:
    """Numbered versions by number, after any non-numbered one (compared as text)."""
    return (1, int(version)) if version.isdigit() else (0, version)


@dataclass(frozen=True)
class Found:
    """A bundle found on disk: which model and version it is, and a signature of its manifest
    (changes when the bundle is rewritten in place)."""

    name: str
    version: str
    path: Path
    signature: tuple[int, int]  # manifest (mtime_ns, size)


def signature(bundle: Path) -> tuple[int, int]:
    try:
        stat = (bundle / MANIFEST).stat()
    except OSError:
        return (0, 0)
    return (stat.st_mtime_ns, stat.st_size)


def scan(root: Path, single: bool = False) -> dict[str, dict[str, Found]]:
    """Every model and version in a repository folder (name → version → bundle), or of one bundle
    folder (`single`, or a folder with a manifest). An unreadable manifest in a flat bundle is a
    model named after its folder (its load then fails with the bundle's own message)."""
    if single or (root / MANIFEST).is_file():
        return {f.name: {f.version: f} for f in [flat_bundle(root)]}
    if not root.is_dir():
        raise ModelNotFound(f"model repository not found: {root} is not a directory")
    models: dict[str, dict[str, Found]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (folder / MANIFEST).is_file():
            found = flat_bundle(folder)
            models.setdefault(found.name, {})[found.version] = found
            continue
        versions = {
            v.name: Found(folder.name, v.name, v, signature(v))
            for v in folder.iterdir()
            if v.is_dir() and v.name.isdigit()
        }
        if versions:
            models[folder.name] = versions
    return models


def flat_bundle(folder: Path) -> Found:
    try:
        manifest = read_manifest(folder)
        name, version = str(manifest["name"]), str(manifest["version"])
    except ValueError:
        name, version = folder.name, "0"
    return Found(name, version, folder, signature(folder))


def graph_bytes(folder: Path) -> int:
    """The bytes of a bundle's ONNX graphs: what its sessions hold in memory at the least."""
    return sum(f.stat().st_size for f in folder.glob("*.onnx") if f.is_file())


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class ReloadReport:
    loaded: list[str] = field(default_factory=list)  # "name:version"
    failed: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.loaded or self.retired)


class Events:
    """What the repository tells the rest of the server (metrics, logs); the defaults do nothing."""

    def loaded(self, model: ModelVersion) -> None: ...

    def unloaded(self, model: ModelVersion) -> None: ...

    def failed(self, name: str, version: str, error: Exception) -> None: ...


class Repository:
    """The served model versions; `acquire` resolves a request's model, `reload` follows the disk."""

    def __init__(
        self,
        root: Path | None,
        load: LoadFn,
        policy: VersionPolicy | None = None,
        default_model: str = "",
        events: Events | None = None,
        single: bool = False,
    ) -> None:
        self.root = root
        self.single = single  # root is one bundle (--bundle), not a repository folder
        self.load_fn = load
        self.policy = policy or VersionPolicy()
        self.default_name = default_model
        self.events = events or Events()
        self.lock = threading.Lock()  # guards models, in_flight, retired
        self.reload_lock = threading.Lock()  # one reload at a time
        self.models: dict[str, dict[str, ModelVersion]] = {}  # name → version → loaded
        self.refused: dict[tuple[str, str], tuple[int, int]] = {}  # failed loads, by signature
        self.errors: list[Exception] = []  # the latest reload's load failures

    @classmethod
    def of(
        cls, *versions: ModelVersion, default_model: str = "", events: Events | None = None
    ) -> Repository:
        """A repository of versions loaded elsewhere (no folder: reload changes nothing; `follow`
        changes them)."""
        repo = cls(None, load_engine, default_model=default_model, events=events)
        for v in versions:
            repo.models.setdefault(v.name, {})[v.version] = v
        return repo

    # --- serving ------------------------------------------------------------------------------

    def names(self) -> list[str]:
        with self.lock:
            return sorted(self.models)

    def default(self) -> str:
        """The model of requests that name none: the configured one, else the only one, else the
        one from the folder named "default", else the first by name."""
        with self.lock:
            return self._default()

    def _default(self) -> str:
        if self.default_name:
            return self.default_name
        if len(self.models) == 1:
            return next(iter(self.models))
        for name, versions in sorted(self.models.items()):
            if any(v.path is not None and v.path.name == "default" for v in versions.values()):
                return name
        return min(self.models, default="")

    def get(self, name: str = "", version: str = "") -> ModelVersion:
        """The version a request for (name, version) gets (empty: the default model, its latest
        version); ModelNotFound names what exists."""
        with self.lock:
            return self._resolve(name, version)

    def acquire(self, name: str = "", version: str = "") -> ModelVersion:
        """As `get`, and hold the version until `release`: it is not unloaded meanwhile."""
        with self.lock:
            model = self._resolve(name, version)
            model.in_flight += 1
            return model

    def hold(self, model: ModelVersion) -> None:
        """Hold this very version (retired or not) until `release`: not unloaded meanwhile."""
        with self.lock:
            model.in_flight += 1

    def release(self, model: ModelVersion) -> None:
        with self.lock:
            model.in_flight -= 1
            unload = self._take_unload(model)
        if unload:
            self._unloaded(model)

    def _take_unload(self, model: ModelVersion) -> bool:
        """Whether to unload `model` now (retired, idle, not yet unloaded); under the lock, so
        exactly one caller (a release or the reload that retired it) unloads it."""
        if model.retired and model.in_flight == 0 and not model.unloaded:
            model.unloaded = True
            return True
        return False

    def _resolve(self, name: str, version: str) -> ModelVersion:
        name = name or self._default()
        versions = self.models.get(name)
        if not versions:
            raise ModelNotFound(
                f"model {name!r} is not served here; the models are {sorted(self.models)}"
            )
        if not version:
            return versions[max(versions, key=version_order)]
        if version not in versions:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r} loaded; its versions are "
                f"{sorted(versions, key=version_order)}"
            )
        return versions[version]

    def loaded(self) -> list[ModelVersion]:
        """Every served version, by name then version."""
        with self.lock:
            return [
                versions[v]
                for _, versions in sorted(self.models.items())
                for v in sorted(versions, key=version_order)
            ]

    # --- reloads ------------------------------------------------------------------------------

    def reload(self) -> ReloadReport:
        """Follow the folder: load and warm up what the policy wants and is not loaded, swap it in,
        retire what is no longer wanted. Runs off the serving threads; slow (loads and warm-ups)."""
        report = ReloadReport()
        if self.root is None:
            return report
        with self.reload_lock:
            try:
                found = scan(self.root, self.single)
            except ModelNotFound as err:
                log.error("reload skipped: %s", err)
                report.failed.append(str(self.root))
                self.events.failed("", "", err)
                return report
            wanted = {
                name: {v: versions[v] for v in self.policy.select(name, versions)}
                for name, versions in found.items()
            }
            self.errors = []
            fresh = self._load_new(wanted, report)
            retired = self._swap(wanted, fresh)
        self._retire(retired, report)
        return report

    def follow(
        self, wanted: dict[str, dict[str, Found]], make: Callable[[Found], ModelVersion]
    ) -> ReloadReport:
        """Serve exactly the versions `wanted` (another repository's: a front follows its engine
        processes'); a version not served yet is made by `make`, one that fails is refused and
        left out (logged, an event), the others as `reload` does."""
        report = ReloadReport()
        with self.reload_lock:
            fresh: dict[str, dict[str, ModelVersion]] = {}
            for name, versions in wanted.items():
                for version, found in versions.items():
                    with self.lock:
                        current = self.models.get(name, {}).get(version)
                    if current is not None and current.path == found.path:
                        continue
                    try:
                        model = make(found)
                    except Exception as err:
                        report.failed.append(f"{name}:{version}")
                        log.error("model version refused: %s", err, extra={"model": name})
                        self.events.failed(name, version, err)
                        continue
                    fresh.setdefault(name, {})[version] = model
                    report.loaded.append(str(model))
                    self.events.loaded(model)
            retired = self._swap(wanted, fresh)
        self._retire(retired, report)
        return report

    def _retire(self, retired: list[ModelVersion], report: ReloadReport) -> None:
        for model in retired:
            report.retired.append(str(model))
            log.info("model version retired", extra={"model": model.name, "version": model.version})
            with self.lock:
                unload = self._take_unload(model)
            if unload:
                self._unloaded(model)

    def _load_new(
        self, wanted: dict[str, dict[str, Found]], report: ReloadReport
    ) -> dict[str, dict[str, ModelVersion]]:
        fresh: dict[str, dict[str, ModelVersion]] = {}
        for name, versions in wanted.items():
            for version, bundle in versions.items():
                with self.lock:
                    current = self.models.get(name, {}).get(version)
                if current is not None and current.path == bundle.path:
                    continue
                if self.refused.get((name, version)) == bundle.signature:
                    continue  # refused before and unchanged since
                before = resident_bytes()
                try:
                    engine = self.load_fn(bundle.path)
                except Exception as err:
                    self.errors.append(err)
                    self.refused[(name, version)] = bundle.signature
                    report.failed.append(f"{name}:{version}")
                    log.error(
                        "model version refused: %s",
                        err,
                        extra={"model": name, "version": version, "path": str(bundle.path)},
                    )
                    self.events.failed(name, version, err)
                    continue
                self.refused.pop((name, version), None)
                # the process's growth, at least the graphs' bytes: an allocator that reuses memory
                # freed earlier (a reload, an unloaded version) may grow nothing for a new version
                grown = max(resident_bytes() - before, graph_bytes(bundle.path))
                model = ModelVersion(name, version, engine, bundle.path, grown)
                fresh.setdefault(name, {})[version] = model
                report.loaded.append(str(model))
                log.info(
                    "model version loaded",
                    extra={
                        "model": name,
                        "version": version,
                        "path": str(bundle.path),
                        "resident_bytes": model.resident_bytes,
                    },
                )
                self.events.loaded(model)
        return fresh

    def _swap(
        self, wanted: dict[str, dict[str, Found]], fresh: dict[str, dict[str, ModelVersion]]
    ) -> list[ModelVersion]:
        """The new map in one assignment under the lock; returns the versions it dropped. A model
        none of whose wanted versions loaded keeps the versions it had (they go on serving)."""
        with self.lock:
            models: dict[str, dict[str, ModelVersion]] = {}
            for name, versions in wanted.items():
                old = self.models.get(name, {})
                kept = {v: old[v] for v in versions if v in old and old[v].path == versions[v].path}
                now = {**kept, **fresh.get(name, {})}
                models[name] = now or old
            dropped = [
                model
                for name, versions in self.models.items()
                for version, model in versions.items()
                if models.get(name, {}).get(version) is not model
            ]
            models = {name: versions for name, versions in models.items() if versions}
            for model in dropped:
                model.retired = True
            self.models = models
            return dropped

    def _unloaded(self, model: ModelVersion) -> None:
        log.info("model version unloaded", extra={"model": model.name, "version": model.version})
        self.events.unloaded(model)

    def load_all(self) -> ReloadReport:
        """The first load: as a reload, but a repository with nothing to serve is an error."""
        report = self.reload()
        if self.root is not None and not self.models:
            if len(self.errors) == 1:  # one bundle: its own message (missing file, altered, ...)
                raise self.errors[0]
            detail = f": refused {report.failed}" if report.failed else ""
            raise ModelNotFound(f"no model could be loaded from {self.root}{detail}")
        return report


def load_engine(path: Path) -> TextSide:
    """An engine loaded from a bundle folder: imported here, as a front's repository never loads
    one (its versions are the engines' text sides: service/serve/mirror.py)."""
    from service.decode.engine.engine import Engine

    return Engine.load(path)
