"""The server's own memory files (--memory-dir): one per model, `DIR/<model name>.tsv` (or
`.tsv.gz`), its entries over the bundle's (docs/memory.md). Read when a model version loads (a file
that does not parse refuses the version, as a damaged bundle does) and again on every reload
(SIGHUP, the poller) when it changed; a changed file that does not parse leaves the entries in force
and is logged. An entry the model cannot use is left out and logged with its file and line, and
the rest of the file serves."""

from __future__ import annotations

import logging
from pathlib import Path

from service.decode.engine.text_side import TextSide
from service.model import memory as mem

log = logging.getLogger("s2s.server")


def memory_file(directory: str, name: str) -> Path | None:
    """The model's file in the memory directory, if there is one."""
    if not directory:
        return None
    for suffix in (".tsv", ".tsv.gz"):
        path = Path(directory) / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def signature(path: Path | None) -> tuple[str, int, int] | None:
    if path is None:
        return None
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)


def attach(engine: TextSide, directory: str) -> None:
    """Read the model's file into engine.user_memory (MemoryFileError naming file and line), and
    log the entries refused in it and in the bundle's own memory."""
    log_refused(engine.bundle.name, engine.bundle_memory)
    read_into(engine, memory_file(directory, engine.bundle.name))


def read_into(engine: TextSide, path: Path | None) -> None:
    memory = mem.EMPTY if path is None else engine.read_memory(path)
    log_refused(engine.bundle.name, memory)
    engine.user_memory = memory
    engine.user_memory_signature = signature(path)


def log_refused(model: str, memory: mem.Memory) -> None:
    """One warning per entry the model refused (file, line, why): the rest of the file serves."""
    for refusal in memory.refused:
        log.warning("memory entry refused: %s", refusal, extra={"model": model})


def refresh(engines: list[TextSide], directory: str) -> None:
    """Re-read each engine's file where it changed; a file that does not parse is logged and the
    entries in force kept."""
    for engine in engines:
        path = memory_file(directory, engine.bundle.name)
        if signature(path) == engine.user_memory_signature:
            continue
        try:
            read_into(engine, path)
        except mem.MemoryFileError as err:
            log.error("memory file refused, the entries in force are kept: %s", err)
            continue
        log.info(
            "memory reloaded",
            extra={"model": engine.bundle.name, "entries": len(engine.user_memory)},
        )
