"""A front's model versions: the ones its engines published, each with its text side.

The engine processes own the versions (they load, reload and retire them: service/serve/
engine_host.py); a front follows what they publish (`Follower.follow`), so that it never names a
version its engines do not have. For each version it needs the model's text side: tokenizers, the
input rule, limits, memory and glossary, `translation_of`, but no ONNX Runtime session. A front
process loads it from the bundle (`text_sides`: `TextSide.of_bundle` with a `TextModel` standing in
for the graphs); the single-process mode shares the engine half's own Engine objects
(`shared_engines`), which hold the same text side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from service.decode.engine.text_side import TextSide
from service.decode.runtime.transfers import TransferLedger
from service.decode.shared.config import RuntimeConfig
from service.serve import glossary_files, memory_files
from service.serve.config import Settings
from service.serve.repository import Found, ModelVersion, Repository

log = logging.getLogger("s2s.front")

Entry = tuple[str, str, str, tuple[str, ...], int]  # name, version, path, providers, resident bytes
MakeVersion = Callable[[Found], ModelVersion]


class TextModel:
    """Stands in for the ONNX Runtime model in a front's TextSide: what the engine process reported
    of it (its providers), and no graph."""

    def __init__(self, providers: Sequence[str], config: RuntimeConfig) -> None:
        self.providers = list(providers)
        self.config = config
        self.transfers = TransferLedger()  # a front moves nothing to a device


def wanted(entries: Sequence[Entry]) -> dict[str, dict[str, Found]]:
    out: dict[str, dict[str, Found]] = {}
    for name, version, path, _, _ in entries:
        out.setdefault(name, {})[version] = Found(name, version, Path(path), (0, 0))
    return out


def text_sides(settings: Settings, entries: dict[tuple[str, str], Entry]) -> MakeVersion:
    """A front process's versions: each bundle's text side, with the server's memory and glossary
    files (refused as the engine refuses them)."""

    def make(found: Found) -> ModelVersion:
        _, _, _, providers, resident = entries[(found.name, found.version)]
        engine = TextSide.of_bundle(
            found.path, TextModel(providers, settings.runtime), settings.limits
        )
        memory_files.attach(engine, settings.server.memory_dir)
        glossary_files.attach(engine, settings.server.glossary_dir)
        return ModelVersion(found.name, found.version, engine, found.path, resident)

    return make


def shared_engines(engines: Repository, entries: dict[tuple[str, str], Entry]) -> MakeVersion:
    """The single-process mode's versions: the engine half's own engines (memory and glossary
    attached there already)."""

    def make(found: Found) -> ModelVersion:
        model = engines.get(found.name, found.version)
        resident = entries[(found.name, found.version)][4]
        return ModelVersion(found.name, found.version, model.engine, found.path, resident)

    return make


class Follower:
    """Takes up the versions an engine publishes into the front's repository, off the event loop
    (text sides load in a thread), then re-reads memory and glossaries (a reload's)."""

    def __init__(
        self,
        repository: Repository,
        settings: Settings,
        loader: Callable[[dict[tuple[str, str], Entry]], MakeVersion],
    ) -> None:
        self.repository = repository
        self.settings = settings
        self.loader = loader
        self.lock = asyncio.Lock()  # one generation at a time
        self.published: dict[int, Sequence[Entry]] = {}  # each engine's latest versions

    async def follow(self, index: int, entries: Sequence[Entry]) -> None:
        """Serve the versions engine `index` now publishes with every other engine's: the union
        (engines load the same repository; one that refused a version must not take it from the
        others, nor one a step behind in a reload undo it)."""
        self.published[index] = entries
        by_key = {(e[0], e[1]): e for each in self.published.values() for e in each}
        entries = list(by_key.values())
        loop = asyncio.get_running_loop()
        async with self.lock:
            await loop.run_in_executor(
                None, self.repository.follow, wanted(entries), self.loader(by_key)
            )
            engines = [m.engine for m in self.repository.loaded()]
            server = self.settings.server
            await loop.run_in_executor(None, memory_files.refresh, engines, server.memory_dir)
            await loop.run_in_executor(None, glossary_files.refresh, engines, server.glossary_dir)
