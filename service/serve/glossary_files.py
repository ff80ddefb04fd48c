"""The server's own glossary files (--glossary-dir): one per model, `DIR/<model name>.tsv` (or
`.tsv.gz`), its terms over the bundle's (docs/markup.md). Read as the memory's files are
(service/serve/memory_files.py): when a model version loads (a file that does not parse refuses
the version, as a damaged bundle does) and again on every reload when it changed; a changed file
that does not parse leaves the terms in force and is logged."""

from __future__ import annotations

import logging
from pathlib import Path

from service.decode.engine.text_side import TextSide
from service.model import glossary as gl
from service.serve.memory_files import memory_file as model_file
from service.serve.memory_files import signature

log = logging.getLogger("s2s.server")


def attach(engine: TextSide, directory: str) -> None:
    """Read the model's file into engine.terms.user_glossary (GlossaryFileError naming file and line)."""
    read_into(engine, model_file(directory, engine.bundle.name))


def read_into(engine: TextSide, path: Path | None) -> None:
    engine.terms.user_glossary = gl.EMPTY if path is None else engine.terms.read_glossary(path)
    engine.terms.user_glossary_signature = signature(path)


def refresh(engines: list[TextSide], directory: str) -> None:
    """Re-read each engine's file where it changed; a file that does not parse is logged and the
    terms in force kept."""
    for engine in engines:
        path = model_file(directory, engine.bundle.name)
        if signature(path) == engine.terms.user_glossary_signature:
            continue
        try:
            read_into(engine, path)
        except gl.GlossaryFileError as err:
            log.error("glossary file refused, the terms in force are kept: %s", err)
            continue
        log.info(
            "glossary reloaded",
            extra={"model": engine.bundle.name, "terms": len(engine.terms.user_glossary)},
        )
