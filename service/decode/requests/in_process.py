"""The request's pipeline (pipeline.py) with its decode on an engine in this process: s2s-translate,
the tests and the benchmarks. The server runs the same pipeline with its engines' decode
(service/serve/translator.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from service.decode.align.aligner import align_prepared, head_weights_for
from service.decode.align.forced import AlignedPair
from service.decode.engine.engine import Engine
from service.decode.engine.kept_rows import KeptRows
from service.decode.requests import marked, recall
from service.decode.requests.pipeline import Decoded as PipelineDecoded
from service.decode.requests.pipeline import Pipeline
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Settled
from service.decode.text.preparation import Prepared
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation

T = TypeVar("T")


class EngineHere:
    """A `pipeline.Decoding` on an engine in this process: its sentences decoded as one static
    batch (`Engine.decode_prepared`), the memory's pairs as one forced batch, the link head
    reading the encoder rows the decode kept."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.kept = KeptRows() if engine.link_head is not None else None

    async def decode(
        self,
        sentences: list[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        keep_rows: bool,
        progress: Settled | None = None,
    ) -> list[Translation]:
        """A static batch here: each sentence comes when the batch is done (no `progress`)."""
        kept = self.kept if keep_rows else None
        encode = kept.keeping(self.engine.encode) if kept is not None else None
        return self.engine.decode_prepared(sentences, options, alignment, encode)

    async def force(self, pairs: list[PreparedPair]) -> list[AlignedPair]:
        return align_prepared(self.engine, pairs, recall.FORCED)

    async def link_head_weights(self, texts: marked.HeadTexts) -> marked.HeadWeights:
        return head_weights_for(self.engine, texts, self.kept)

    def remembered(self, hits: int, misses: int) -> None:
        """(s2s-translate counts nothing.)"""


def run_here(steps: Coroutine[Any, Any, T]) -> T:
    """The pipeline's steps run to their end on an event loop of their own, without asyncio.run:
    its SIGINT handler, put back at the end, has the finished task (and every array of its result)
    written out by repr (2.7 s of 5 on 200 Greek verses)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(steps)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def pipeline_of(engine: Engine) -> Pipeline:
    return Pipeline(engine, EngineHere(engine))


def checked(engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: str) -> None:
    if not texts:
        raise InvalidInput("no texts to translate")
    engine.check_options(options, alignment, len(texts))


@dataclass(frozen=True)
class Decoded:
    """A batch's texts decoded on its own pipeline (which holds the rows its link head reads),
    their markup not yet put back (`finish`)."""

    run: Pipeline
    decoded: PipelineDecoded


def decode(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> Decoded:
    """The texts' options checked, then the pipeline's decode: markup out, the memory first."""
    checked(engine, texts, options, alignment)
    run = pipeline_of(engine)
    return Decoded(run, run_here(run.decode(texts, options, alignment)))


def finish(decoded: Decoded, alignment: AlignmentMode) -> list[Translation]:
    """The decoded texts' markup put back: s2s-translate runs it on a thread of its own while the
    next batch decodes."""
    return run_here(decoded.run.finish(decoded.decoded, alignment))


def translate(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> list[Translation]:
    """The texts translated with their markup taken out before and put back after, the memory
    consulted first."""
    return finish(decode(engine, texts, options, alignment), alignment)


def translate_with_memory(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> list[Translation]:
    """The texts (their markup not read) translated with the memory consulted first."""
    checked(engine, texts, options, alignment)
    run = pipeline_of(engine)
    prepared = run.prepare(texts, options)
    return run_here(run.with_memory(list(texts), prepared, options, alignment, False))
