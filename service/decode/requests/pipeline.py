"""A Translate request's path, once: markup taken out → the texts prepared (input rule, tokens,
segments, glossary terms) → the memory's plan → the decode and the memory's forced pass → the
answers assembled → the markup put back by the link head's or the attention's links.

The server's translator (service/serve/translator.py) and s2s-translate (in_process.py) both run
it; what differs is where the decode runs, a `Decoding`: the engines behind the front's channel
(jobs), or an engine in this process. Each step's concept lives in its module: marked.py (markup),
recall.py (the memory), the text side (preparation, controls, answers from raw results).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.decode.align.forced import AlignedPair
from service.decode.engine.text_side import TextSide
from service.decode.requests import documents, marked, recall
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis, Settled
from service.decode.text.preparation import DecodeRequest, Prepared
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation
from service.model.markup import Marked


class Decoding(Protocol):
    """Where a request's sentences decode: its model's engines (a server's) or an engine here."""

    async def decode(
        self,
        sentences: list[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        keep_rows: bool,
        progress: Settled | None = None,
    ) -> list[Translation]:
        """The sentences decoded (options per sentence by `options.for_text`); keep_rows: their
        encoder rows kept for the link head that reads them next; progress: told each
        sentence's settled prefix as it grows, where the decoding can (a running batch's)."""
        ...

    async def force(self, pairs: list[PreparedPair]) -> list[AlignedPair]:
        """The memory's (source, target) pairs through the model's forced pass."""
        ...

    async def link_head_weights(self, texts: marked.HeadTexts) -> marked.HeadWeights:
        """The link head's weights of each (plain source, its hypotheses), from the rows kept."""
        ...

    def remembered(self, hits: int, misses: int) -> None:
        """The memory consulted: how many texts it answered whole, and how many it did not."""
        ...


@dataclass(frozen=True)
class Decoded:
    """A request's texts decoded, their markup not yet put back (`Pipeline.finish`)."""

    marks: list[Marked]  # each text's markup (none where the request asked for no markup)
    translations: list[Translation]  # of the plain texts
    options: SearchOptions
    heads_next: bool  # the link head reads the texts with markup next (their rows kept)


@dataclass(frozen=True)
class Read:
    """A request's texts read for decoding (`Pipeline.read`)."""

    marks: list[Marked]  # each text's markup
    cut: documents.Cut  # the plain texts cut into sentences (or whole)
    each: SearchOptions  # the sentences' options (documents.sentence_options)
    prepared: list[Prepared]  # each sentence prepared, with its glossary terms
    heads_next: bool  # the link head reads the texts with markup next (their rows kept)
    mode: AlignmentMode  # the alignment the decode returns (markup may need one)


def no_check(prepared: list[list[Prepared]]) -> None:
    """`Pipeline.decode`'s default check of the prepared texts (each text's sentences): none."""


def text_at(i: int) -> str:
    """How an error names the i-th text."""
    return f"texts[{i}]"


class Pipeline:
    """One request's path over a model's text side and a `Decoding` (the module docstring)."""

    def __init__(
        self, side: TextSide, decoding: Decoding, max_sentences: int | None = None
    ) -> None:
        """max_sentences: the most sentences of a request, its texts cut (None: no limit)."""
        self.side = side
        self.decoding = decoding
        self.max_sentences = max_sentences

    def prepare(
        self,
        texts: Sequence[str],
        options: SearchOptions,
        where: Callable[[int], str] = text_at,
        languages: Sequence[str] | None = None,
    ) -> list[Prepared]:
        """Each text prepared with its glossary terms (computed once: the memory's plan and the
        controls read them), errors naming the text (`where`); languages: each text's target
        language (None: the options')."""
        prepared = []
        for i, text in enumerate(texts):
            language = options.target_language if languages is None else languages[i]
            try:
                sentence = self.side.prepare(text, language)
            except InvalidInput as err:
                raise InvalidInput(f"{where(i)}: {err}") from err
            prepared.append(self.side.with_terms(sentence, options.for_text(i), where(i)))
        return prepared

    async def decode(
        self,
        texts: Sequence[str],
        options: SearchOptions,
        alignment: AlignmentMode,
        check: Callable[[list[list[Prepared]]], None] = no_check,
    ) -> Decoded:
        """The texts' options checked by the caller: markup out, cut into sentences where options
        ask (documents.py), prepared (`check` sees each text's before any decode: a server's
        response bound), decoded with the memory first, each text's sentences joined."""
        read = self.read(texts, options, alignment, check)
        results = await self.with_memory(
            read.cut.sentences, read.prepared, read.each, read.mode, read.heads_next
        )
        return Decoded(read.marks, documents.join(read.cut, results), options, read.heads_next)

    def read(
        self,
        texts: Sequence[str],
        options: SearchOptions,
        alignment: AlignmentMode,
        check: Callable[[list[list[Prepared]]], None],
    ) -> Read:
        """What `decode` and `stream` decode: markup out, cut into sentences, each prepared, and
        `check` run on each text's sentences."""
        marks = marked.read_texts(texts, options)  # the model reads the plain text
        the_cut = self.cut([m.plain for m in marks], options)
        each = documents.sentence_options(options, the_cut)
        prepared = self.prepare(
            the_cut.sentences, each, the_cut.where, self.languages(the_cut, options)
        )
        check([[prepared[j] for j in the_cut.sentences_of(i)] for i in range(len(texts))])
        # the link head reads each text with markup next: the decode keeps its encoder rows for
        # it (service/decode/engine/kept_rows.py) and it reads them instead of encoding again
        heads_next = self.side.link_head is not None and any(m.nodes for m in marks)
        mode = marked.decode_alignment(self.side, options, alignment)
        return Read(marks, the_cut, each, prepared, heads_next, mode)

    def languages(self, the_cut: documents.Cut, options: SearchOptions) -> list[str] | None:
        """Each sentence's target language where texts were cut: the options', else the one whose
        token its text begins with (a multilingual model's `>>spa<<` asks it of every sentence)."""
        if not the_cut.split or options.target_language:
            return None
        firsts = [self.side.leading_language(text) for text in the_cut.texts]
        return [firsts[owner] for owner in the_cut.owners]

    def cut(self, texts: Sequence[str], options: SearchOptions) -> documents.Cut:
        """The texts cut into sentences as options say (documents.py), the model's source
        language choosing the splitter."""
        return documents.cut(
            texts, options.split_sentences, self.side.source_language, self.max_sentences
        )

    async def with_memory(
        self,
        texts: list[str],
        prepared: list[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        keep_rows: bool,
        progress: Settled | None = None,
    ) -> list[Translation]:
        """The texts the model's memory knows answered from it (their forced pass), the others,
        and an n_best the memory cannot fill, decoded, side by side (recall.py); progress: the
        settled prefixes of the texts decoded whole (by their index in `texts`)."""
        side, decoding = self.side, self.decoding
        todo = recall.plan(side, texts, prepared, options)
        if recall.consulted(side, options):
            hits = len(texts) - len(todo.whole)
            decoding.remembered(hits, len(texts) - hits)
        sentences = [prepared[i] for i in todo.whole]
        parts, pairs = todo.segment_sentences(prepared), [f.pair for f in todo.forced]
        whole_options = options.for_texts(todo.whole)
        settled = None
        if progress is not None:
            report = progress

            def settled(k: int, prefix: Hypothesis) -> None:
                report(todo.whole[k], prefix)

        whole, segments, aligned = await together(
            (bool(sentences),
             lambda: decoding.decode(sentences, whole_options, alignment, keep_rows, settled)),
            (bool(parts),
             lambda: decoding.decode(parts, options, recall.raw(alignment), keep_rows)),
            (bool(pairs), lambda: decoding.force(pairs)),
        )  # fmt: skip
        return recall.assemble(
            side, todo, texts, prepared, whole, segments, aligned, options, alignment
        )

    async def finish(self, decoded: Decoded, alignment: AlignmentMode) -> list[Translation]:
        """The decoded texts' markup put back (marked.restore), by the link head's links where
        the model has one, else by each hypothesis's attention."""
        if not decoded.options.marked:
            return decoded.translations
        weights = None
        if decoded.heads_next:  # a text with markup, on a model with a link head
            texts_read = marked.head_texts(decoded.marks, decoded.translations)
            weights = await self.decoding.link_head_weights(texts_read)
        return await asyncio.to_thread(
            marked.restore, self.side, decoded.marks, decoded.translations, alignment, weights
        )

    async def stream(
        self,
        texts: Sequence[str],
        options: SearchOptions,
        alignment: AlignmentMode,
        check: Callable[[list[list[Prepared]]], None] = no_check,
    ) -> AsyncIterator[SentenceDone | list[Translation]]:
        """`translate`, each sentence sent the moment it and those before it are final, then the
        translations (`translate`'s answer). Before a sentence is final, the part of its best
        translation no later step can change is sent each time its text grows (`final` False).
        Each sentence decodes as a job of its own, all in the running batch at once; closing the
        stream cancels those not done (their rows freed)."""
        read = self.read(texts, options, alignment, check)
        sentences, prepared = read.cut.sentences, read.prepared
        updates: asyncio.Queue[tuple[int, Hypothesis]] = asyncio.Queue()
        latest: dict[int, Hypothesis] = {}  # the settled prefixes of sentences ahead
        sending = [0]  # the sentence being sent: only its prefixes wake the stream

        def reporter(j: int) -> Settled:
            def report(_: int, prefix: Hypothesis) -> None:
                if j == sending[0]:
                    updates.put_nowait((j, prefix))
                elif j > sending[0]:
                    latest[j] = prefix

            return report

        def translated(j: int, prefix: Hypothesis) -> Translation:
            """A settled prefix as its sentence's answer reads (only the one sent is made)."""
            request = DecodeRequest(j, prepared[j], read.each.for_text(j), read.mode)
            return self.side.translation_of(request, [[prefix]])

        pending = [
            asyncio.ensure_future(
                self.with_memory(
                    [sentences[j]], [prepared[j]], read.each.for_texts([j]), read.mode,
                    read.heads_next, reporter(j),
                )
            )
            for j in range(len(sentences))
        ]  # fmt: skip
        try:
            results = []
            for j, task in enumerate(pending):
                sending[0], shown = j, ""
                if j in latest and not task.done():
                    partial = translated(j, latest.pop(j))
                    shown = best_text(partial)
                    yield sentence_done(read.cut, j, partial, final=False)
                async for k, prefix in settled_until(task, updates):
                    if k != j:
                        continue  # a sentence final already: its late prefix
                    partial = translated(j, prefix)
                    if best_text(partial) != shown:  # sent as its text grows
                        shown = best_text(partial)
                        yield sentence_done(read.cut, j, partial, final=False)
                results.extend(task.result())
                latest.pop(j, None)
                yield sentence_done(read.cut, j, results[-1])
            joined = documents.join(read.cut, results)
            decoded = Decoded(read.marks, joined, options, read.heads_next)
            yield await self.finish(decoded, alignment)
        finally:
            for task in pending:
                task.cancel()

    async def translate(
        self,
        texts: Sequence[str],
        options: SearchOptions,
        alignment: AlignmentMode,
        check: Callable[[list[list[Prepared]]], None] = no_check,
    ) -> list[Translation]:
        """`decode`, then `finish`."""
        return await self.finish(await self.decode(texts, options, alignment, check), alignment)


@dataclass(frozen=True)
class SentenceDone:
    """`Pipeline.stream`'s event: a sentence of text `text` final (its markup not yet put back),
    or, `final` False, the settled prefix of its best translation so far."""

    text: int
    index: int  # its index among its text's sentences
    span: tuple[int, int]  # where it lies in the text the model read (its markup taken out)
    separator: str  # the source's whitespace before it
    translation: Translation
    final: bool = True


def sentence_done(
    the_cut: documents.Cut, j: int, translation: Translation, final: bool = True
) -> SentenceDone:
    """Sentence j of the cut, decoded (or its settled prefix), as the stream sends it."""
    text = the_cut.owners[j]
    index = j - the_cut.first_sentence(text)
    spans = the_cut.spans[text]
    if spans is None:  # a text decoded whole
        return SentenceDone(text, 0, (0, len(the_cut.texts[text])), "", translation, final)
    start = spans[index][0]
    before = spans[index - 1][1] if index else 0
    separator = the_cut.texts[text][before:start]
    return SentenceDone(text, index, spans[index], separator, translation, final)


def best_text(translation: Translation) -> str:
    return translation.hypotheses[0].text if translation.hypotheses else ""


async def settled_until(
    task: asyncio.Future[Any], updates: asyncio.Queue[tuple[int, Hypothesis]]
) -> AsyncIterator[tuple[int, Hypothesis]]:
    """The settled prefixes that come (sentence, its prefix) until `task` ends."""
    while not task.done():
        getter = asyncio.ensure_future(updates.get())
        try:
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            yield getter.result()


async def together(*jobs: tuple[bool, Callable[[], Awaitable[list[Any]]]]) -> list[list[Any]]:
    """The results of the jobs that have work (the flag), in order ([] for the others), decoding
    at once: awaited in place when only one has work (asyncio.gather would make a task of each,
    a tenth of a request's time on a front)."""
    busy = [make for has_work, make in jobs if has_work]
    if len(busy) == 1:
        done = [await busy[0]()]
    else:
        done = list(await asyncio.gather(*(make() for make in busy)))
    results = iter(done)
    return [next(results) if has_work else [] for has_work, _ in jobs]
