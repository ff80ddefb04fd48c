"""The request's path with the engine in this process (s2s-translate, the tests, the benchmarks):
markup taken out (marked.py), the memory consulted (recall.py), the rest decoded by the engine, the
markup put back by the link head's or the attention's links. The server runs the same steps around
its engines (service/serve/translator.py), with the decode and the link head's reading theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.decode.align.aligner import align_prepared, head_weights_for
from service.decode.engine.engine import Encoder, Engine
from service.decode.engine.kept_rows import KeptRows
from service.decode.requests.marked import decode_alignment, head_texts, read_texts, restore
from service.decode.requests.recall import FORCED, assemble, consulted, plan, raw
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import AlignmentMode, Translation
from service.model.markup import Marked


def translate_with_memory(
    engine: Engine,
    texts: Sequence[str],
    options: SearchOptions,
    alignment: AlignmentMode,
    encode: Encoder | None = None,
) -> list[Translation]:
    """`Engine.translate` with the memory consulted first. encode: what encodes the sentences the
    model decodes (default `Engine.encode`)."""
    if not texts or not consulted(engine, options):
        return engine.translate(texts, options, alignment, encode)  # (and its own refusals)
    engine.check_options(options, alignment, len(texts))
    prepared = [engine.prepare(t) for t in texts]
    todo = plan(engine, texts, prepared, options)
    whole: list[Translation] = []
    if todo.whole:  # (a memory is not consulted under a prefix: then every text is here)
        sentences = [prepared[i] for i in todo.whole]
        whole = engine.decode_prepared(sentences, options.for_texts(todo.whole), alignment, encode)
    segments: list[Translation] = []
    if todo.segments:
        sentences = todo.segment_sentences(prepared)
        segments = engine.decode_prepared(sentences, options, raw(alignment), encode)
    aligned = align_prepared(engine, [f.pair for f in todo.forced], FORCED) if todo.forced else []
    return assemble(engine, todo, texts, prepared, whole, segments, aligned, options, alignment)


@dataclass(frozen=True)
class Decoded:
    """A batch's texts decoded, their markup not yet put back (`finish`)."""

    marked: list[Marked] | None  # None: the texts asked for no markup
    translations: list[Translation]  # of the plain texts
    kept: KeptRows | None  # the decode's encoder rows, for the link head


def decode(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> Decoded:
    """`translate_with_memory` of the texts with their markup taken out."""
    if not options.marked:
        return Decoded(None, translate_with_memory(engine, texts, options, alignment), None)
    marks = read_texts(texts, options)
    mode = decode_alignment(engine, options, alignment)
    kept = KeptRows() if engine.link_head is not None else None
    encode = kept.keeping(engine.encode) if kept is not None else None
    results = translate_with_memory(engine, [m.plain for m in marks], options, mode, encode)
    return Decoded(marks, results, kept)


def finish(engine: Engine, decoded: Decoded, alignment: AlignmentMode) -> list[Translation]:
    """The decoded texts' markup put back (marked.restore), by the link head where the model has
    one (reading the decode's encoder rows where it kept them: service/decode/engine/kept_rows.py):
    s2s-translate runs it on a thread of its own while the next batch decodes."""
    if decoded.marked is None:
        return decoded.translations
    found = None
    if engine.link_head is not None:
        texts_read = head_texts(decoded.marked, decoded.translations)
        found = head_weights_for(engine, texts_read, decoded.kept)
    return restore(engine, decoded.marked, decoded.translations, alignment, found)


def translate(
    engine: Engine, texts: Sequence[str], options: SearchOptions, alignment: AlignmentMode
) -> list[Translation]:
    """The texts translated with their markup taken out before and put back after, the memory
    consulted first."""
    return finish(engine, decode(engine, texts, options, alignment), alignment)
