"""The transport-neutral core of the Translator API: protobuf request in, protobuf response out.

Both faces call it, the gRPC servicer (service/serve/grpc_api.py) and the HTTP/JSON one (service/serve/http_api.py),
so both validate, decode, limit and account for requests (`finish`: metrics and the log line) the same way. It raises only the domain errors of
service/decode/shared/errors.py; each face maps them to its own status codes and counts them in the metrics.

A face acquires the request's model version (`acquire`) before `translate_request` (or `align`) and releases it when the
answer is out: a reload meanwhile does not unload the version a request is decoding on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from proto.translation.v1 import translation_pb2 as pb
from service.decode.align import pair_documents
from service.decode.align.forced import AlignedPair
from service.decode.align.pair_answers import ForcedRequest, aligned_of, check_aligner, prepare_pair
from service.decode.engine.text_side import TextSide
from service.decode.requests import marked, recall
from service.decode.requests.pipeline import Pipeline, SentenceDone
from service.decode.shared.errors import InvalidInput, NotReady
from service.decode.shared.options import SPLIT_MODES, SearchOptions
from service.decode.shared.search_types import Hypothesis, Settled
from service.decode.text.preparation import DecodeRequest, Prepared
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation
from service.serve.config import Settings
from service.serve.engine_link import EngineLink
from service.serve.jobs import Job
from service.serve.metrics import Metrics
from service.serve.protocol import (
    MalformedRequest,
    ParsedRequest,
    aligned_pair_to_pb,
    model_info,
    parse_align_request,
    parse_request,
    translation_to_pb,
)
from service.serve.repository import ModelVersion, Repository
from service.serve.request_trace import RequestTrace, current_trace
from service.serve.response_bound import align_response_bytes, check_response_bound, text_shape
from service.serve.status import reject_reason
from service.serve.tracing import Tracing

log = logging.getLogger("s2s.server")

OnDone = Callable[[list[Any] | None, Exception | None], None]  # a Job's completion callback


class TranslatorCore:
    """Built before the server starts; raises NotReady until `attach` gives it the models."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.tracing = Tracing(settings.tracing)
        self._repository: Repository | None = None
        self._worker: EngineLink | None = None
        self.checked: set[tuple[TextSide, SearchOptions, str, int]] = set()

    def attach(self, repository: Repository, worker: EngineLink) -> None:
        """The front's versions (service/serve/mirror.py) and its link to the engines."""
        self._repository, self._worker = repository, worker

    def use_tracing(self, tracing: Tracing) -> None:
        """Trace with this tracer from now on (tests: an in-memory exporter's)."""
        self.tracing = tracing

    @property
    def repository(self) -> Repository:
        if self._repository is None:
            raise NotReady("the model is still loading: retry in a few seconds")
        return self._repository

    @property
    def engine(self) -> TextSide:
        """The default model's engine."""
        return self.repository.get().engine

    @property
    def worker(self) -> EngineLink:
        if self._worker is None:
            raise NotReady("the model is still loading: retry in a few seconds")
        return self._worker

    def acquire(
        self, request: pb.TranslateRequest | pb.AlignRequest | MalformedRequest
    ) -> ModelVersion:
        """The version the request names (empty: the default model), held until `release`;
        ModelNotFound names the models served."""
        return self.repository.acquire(request.model.name, request.model.version)

    def release(self, model: ModelVersion) -> None:
        self.repository.release(model)

    async def translate_request(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        remaining: float | None,
        model: ModelVersion,
    ) -> pb.TranslateResponse:
        """Validate, queue on the worker, wait, convert; `remaining` is the client's deadline in
        seconds from now (None: no deadline). Cancelling the awaiting task cancels the job."""
        run = self.begin(request, request_id, remaining, model)
        results = await run.pipeline.translate(
            run.parsed.texts, run.parsed.options, run.parsed.alignment, run.check
        )
        return self.response_of(results, request_id, model)

    async def translate_stream(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        remaining: float | None,
        model: ModelVersion,
    ) -> AsyncIterator[pb.TranslateStreamResponse]:
        """TranslateStream: each sentence the moment it is final, then Translate's answer. The
        request is checked before the first message (an invalid one raises there); closing the
        stream cancels the sentences not yet decoded."""
        started = time.perf_counter()
        run = self.begin(request, request_id, remaining, model)
        parsed, first = run.parsed, True
        stream = run.pipeline.stream(parsed.texts, parsed.options, parsed.alignment, run.check)
        async for event in stream:
            if first:
                self.metrics.observe_first_chunk(time.perf_counter() - started, model.name)
                first = False
            if isinstance(event, SentenceDone):
                yield pb.TranslateStreamResponse(sentence=chunk_of(event), request_id=request_id)
            else:
                response = self.response_of(event, request_id, model)
                yield pb.TranslateStreamResponse(response=response, request_id=request_id)

    def begin(
        self,
        request: pb.TranslateRequest | MalformedRequest,
        request_id: str,
        remaining: float | None,
        model: ModelVersion,
    ) -> TranslateRun:
        """A Translate request parsed and checked, on its model's pipeline."""
        if isinstance(request, MalformedRequest):
            raise InvalidInput(
                f"the request is not a valid {pb.TranslateRequest.DESCRIPTOR.full_name}: {request.error}"
            )
        engine = model.engine
        trace = current_trace()
        trace.set(model_name=model.name, model_version=model.version, request_id=request_id)
        parsed = parse_request(request, self.settings, engine.decoding_defaults)
        trace.set(texts=len(parsed.texts), input_chars=sum(len(t) for t in parsed.texts))
        trace.texts("input.texts", parsed.texts)
        self.check_options(engine, parsed.options, parsed.alignment, len(parsed.texts))
        deadline = None if remaining is None else self.worker.clock() + remaining

        def check(prepared: list[list[Prepared]]) -> None:
            """Refused at once if the response could exceed the message limit."""
            check_response_bound(
                [text_shape(sentences) for sentences in prepared],
                parsed.options,
                parsed.alignment,
                engine.max_piece_bytes,
                self.settings.server.max_message_bytes,
            )
            trace.set(
                input_tokens=sum(len(p.ids) for text in prepared for p in text),
                beam_size=parsed.options.beam_size,
            )

        decoding = EnginesDecoding(self, model, request_id, deadline)
        pipeline = Pipeline(engine, decoding, self.settings.server.max_sentences)
        return TranslateRun(pipeline, parsed, check)

    def response_of(
        self, results: list[Translation], request_id: str, model: ModelVersion
    ) -> pb.TranslateResponse:
        """The translations as Translate's answer, refused if over the message limit."""
        self.record_output(current_trace(), results)
        response = pb.TranslateResponse(
            translations=[translation_to_pb(t) for t in results],
            request_id=request_id,
            model_version=model.version,
            model=model.name,
        )
        size, limit = response.ByteSize(), self.settings.server.max_message_bytes
        if size > limit:  # grpc would refuse to send it, after the metrics counted it OK
            raise InvalidInput(
                f"the response would be {size} bytes, over the server's message limit of {limit}: "
                "send fewer texts, or ask for a smaller n_best or no alignment"
            )
        return response

    def record_output(self, trace: RequestTrace, results: list[Translation]) -> None:
        """The low-confidence count, and on the request's trace its best hypotheses' tokens and
        texts."""
        self.metrics.add_low_confidence(
            sum(1 for t in results if t.hypotheses and t.hypotheses[0].low_confidence)
        )
        best = [t.hypotheses[0] for t in results if t.hypotheses]
        trace.set(output_tokens=sum(len(h.token_ids) for h in best))
        trace.texts("output.texts", [h.text for h in best])

    def check_options(
        self, engine: TextSide, options: SearchOptions, alignment: str, texts: int
    ) -> None:
        """engine.check_options, remembered for options it passed (they pass again: a model's
        controls and limits do not change while it is loaded)."""
        key = (engine, options, alignment, texts)
        if key in self.checked:
            return
        engine.check_options(options, alignment, texts)
        if len(self.checked) >= 1024:
            self.checked.clear()
        self.checked.add(key)

    async def align(
        self,
        request: pb.AlignRequest | MalformedRequest,
        request_id: str,
        remaining: float | None,
        model: ModelVersion,
    ) -> pb.AlignResponse:
        """Align: validate the pairs (errors name the pair), queue them on the worker's forced
        batches, wait, convert; as `translate_request` for deadlines and cancellation."""
        if isinstance(request, MalformedRequest):
            raise InvalidInput(
                f"the request is not a valid {pb.AlignRequest.DESCRIPTOR.full_name}: {request.error}"
            )
        engine = model.engine
        trace = current_trace()
        trace.set(model_name=model.name, model_version=model.version, request_id=request_id)
        parsed = parse_align_request(request, self.settings)
        trace.set(pairs=len(parsed.pairs))
        trace.texts("input.pairs", [f"{s} ||| {t}" for s, t in parsed.pairs])
        check_aligner(engine, parsed.options)
        cut = pair_documents.cut_pairs(
            parsed.pairs,
            self.align_split(request.options, engine, parsed.options.markup),
            (engine.source_language, engine.target_language),
            self.settings.server.max_sentences,
        )
        pairs: list[PreparedPair] = []
        for j, (source, target) in enumerate(cut.pairs):
            try:
                pairs.append(prepare_pair(engine, source, target, parsed.options))
            except InvalidInput as err:
                raise InvalidInput(f"pairs[{cut.owners[j]}]: {err}") from err
        bound_texts = cut.pairs
        if parsed.options.markup != "none":  # the tagged target: the target and the markup again
            bound_texts = [(s + s, t + t) for s, t in parsed.pairs]
        self.check_align_bound(pairs, engine.max_piece_bytes, bound_texts)
        deadline = None if remaining is None else self.worker.clock() + remaining
        raw = await self.run_job(
            lambda done: Job.align(request_id, pairs, parsed.options, done, deadline, model)
        )
        answers = [
            aligned_of(engine, ForcedRequest(i, pair, parsed.options), forced, logits)
            for i, (pair, (forced, logits)) in enumerate(zip(pairs, raw, strict=True))
        ]
        results = pair_documents.join_cut(cut, answers, len(parsed.pairs))
        response = pb.AlignResponse(
            alignments=[aligned_pair_to_pb(a) for a in results],
            request_id=request_id,
            model_version=model.version,
            model=model.name,
        )
        size, limit = response.ByteSize(), self.settings.server.max_message_bytes
        if size > limit:
            raise InvalidInput(
                f"the response would be {size} bytes, over the server's message limit of {limit}: "
                "send fewer pairs, or ask for alignment NONE (links and scores only)"
            )
        return response

    @staticmethod
    def align_split(options: pb.AlignOptions, engine: TextSide, markup: str) -> str:
        """How Align cuts its pairs into sentences: the request's, else the model's default
        split_sentences; off with markup."""
        mode = (
            options.split_sentences
            if options.HasField("split_sentences")
            else str(engine.decoding_defaults.get("split_sentences", "off"))
        )
        if mode not in SPLIT_MODES:
            raise InvalidInput(
                f"split_sentences must be one of {', '.join(SPLIT_MODES)}, got {mode!r}"
            )
        return "off" if markup != "none" else mode

    def check_align_bound(
        self, pairs: list[PreparedPair], piece_bytes: int, texts: list[tuple[str, str]]
    ) -> None:
        """Refuse before decoding an Align request whose response could exceed the message limit."""
        shapes = [
            (
                len(p.src.ids),
                len(p.tgt.ids),
                len(p.src.words),
                len(p.tgt.words),
                len(s.encode()) + len(t.encode()),
            )
            for p, (s, t) in zip(pairs, texts, strict=True)
        ]
        bound, limit = (
            align_response_bytes(shapes, piece_bytes),
            self.settings.server.max_message_bytes,
        )
        if bound > limit:
            raise InvalidInput(
                f"the response could reach {bound} bytes ({len(pairs)} pairs with their attention "
                f"matrices), over the server's message limit of {limit}: send fewer or shorter "
                "pairs, or ask for alignment NONE (links and scores only)"
            )

    async def run_job(
        self, make_job: Callable[[OnDone], Job], on_progress: Settled | None = None
    ) -> list[Any]:
        """Submit the job `make_job` builds around its completion callback to the engines and wait
        for its raw results (a sentence's parts' hypotheses, a pair's forced pass); cancelling the
        awaiting task cancels the job. `on_progress` hears, on this loop, each sentence's settled
        prefix as it grows."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        future: asyncio.Future[list[Any]] = loop.create_future()

        def on_done(results: list[Any] | None, error: Exception | None) -> None:
            if threading.get_ident() == loop_thread:  # the engine link answers on the loop
                resolve(future, results, error)
            else:
                loop.call_soon_threadsafe(resolve, future, results, error)

        job = make_job(on_done)
        if on_progress is not None:
            job.on_progress = on_loop(loop, loop_thread, future, on_progress)
        job.trace = current_trace()  # the request's spans (service/serve/tracing.py)
        job.trace.queued()
        self.worker.submit(job)
        try:
            return await future
        except asyncio.CancelledError:
            self.worker.cancel(job)
            raise

    def model_info(self, spec: pb.ModelSpec | None = None) -> pb.ModelInfo:
        """The named model version (None or empty: the default model); ModelNotFound otherwise."""
        repository = self.repository
        name, version = ("", "") if spec is None else (spec.name, spec.version)
        model = repository.get(name, version)
        return model_info(model, self.settings, model.name == repository.default())

    def list_models(self) -> pb.ListModelsResponse:
        repository = self.repository
        default = repository.default()
        return pb.ListModelsResponse(
            models=[model_info(m, self.settings, m.name == default) for m in repository.loaded()],
            default_model=default,
        )

    def finish(
        self,
        method: str,
        request_id: str,
        code: grpc.StatusCode,
        started: float,
        texts: int,
        message: str = "",
        error: Exception | None = None,
        protocol: str = "grpc",
        model: ModelVersion | None = None,
    ) -> None:
        seconds = time.perf_counter() - started
        self.metrics.observe_request(method, code.name, seconds, protocol)
        if model is not None:
            self.metrics.observe_model_request(model.name, model.version, code.name, seconds)
        if code != grpc.StatusCode.OK:
            self.metrics.reject(reject_reason(code, error))
        trace = current_trace()
        trace.finish(code.name, message)
        log.info(
            "request done",
            extra={
                "request_id": request_id,
                "method": method,
                "protocol": protocol,
                "code": code.name,
                "texts": texts,
                "model": "" if model is None else str(model),
                "ms": round(seconds * 1000, 2),
                "error": message,
                **({"trace_id": trace.trace_id} if trace.trace_id else {}),
            },
        )


@dataclass(frozen=True)
class TranslateRun:
    """A Translate request parsed and checked: its pipeline, and the response bound's check."""

    pipeline: Pipeline
    parsed: ParsedRequest
    check: Callable[[list[list[Prepared]]], None]


def chunk_of(done: SentenceDone) -> pb.SentenceChunk:
    """A sentence final (or its settled prefix: `partial`), as TranslateStream sends it: its best
    hypothesis."""
    best = translation_to_pb(replace(done.translation, hypotheses=done.translation.hypotheses[:1]))
    a, b = done.span
    return pb.SentenceChunk(
        text_index=done.text,
        sentence_index=done.index,
        source_span=pb.Span(start=a, end=b),
        separator=done.separator,
        hypothesis=best.hypotheses[0] if best.hypotheses else None,
        partial=not done.final,
    )


class EnginesDecoding:
    """A `Pipeline`'s decode on the model's engines: the sentences and the memory's pairs as jobs
    over the front's channel (both in the same decode loop at once), the link head's weights
    read where the decode kept their rows, the memory's lookups counted."""

    def __init__(
        self, core: TranslatorCore, model: ModelVersion, request_id: str, deadline: float | None
    ) -> None:
        self.core, self.model = core, model
        self.request_id, self.deadline = request_id, deadline

    async def decode(
        self,
        sentences: list[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        keep_rows: bool,
        progress: Settled | None = None,
    ) -> list[Translation]:
        if not sentences:
            return []
        engine, model = self.model.engine, self.model
        requests = [
            DecodeRequest(i, s, options.for_text(i), alignment) for i, s in enumerate(sentences)
        ]
        controls = [tuple(engine.sentence_controls(r.sentence, r.options)) for r in requests]
        raw = await self.core.run_job(
            lambda done: Job(
                self.request_id, sentences, options, alignment, done, self.deadline, model,
                controls=controls, keep_rows=keep_rows,
            ),
            progress,
        )  # fmt: skip
        return [engine.translation_of(r, parts) for r, parts in zip(requests, raw, strict=True)]

    async def force(self, pairs: list[PreparedPair]) -> list[AlignedPair]:
        if not pairs:
            return []
        model = self.model
        raw = await self.core.run_job(
            lambda done: Job.align(
                self.request_id, pairs, recall.FORCED, done, self.deadline, model
            )
        )
        return [
            aligned_of(model.engine, ForcedRequest(i, pair, recall.FORCED), forced, logits)
            for i, (pair, (forced, logits)) in enumerate(zip(pairs, raw, strict=True))
        ]

    async def link_head_weights(self, texts: marked.HeadTexts) -> marked.HeadWeights:
        return await self.core.worker.link_head_weights(self.model, texts, self.deadline)

    def remembered(self, hits: int, misses: int) -> None:
        self.core.metrics.memory_lookups(self.model.name, hits, misses)


def on_loop(
    loop: asyncio.AbstractEventLoop,
    loop_thread: int,
    future: asyncio.Future[list[Any]],
    report: Settled,
) -> Settled:
    """`report`, called on the loop (the worker's thread hops to it) while the job is open."""

    def here(index: int, prefix: Hypothesis) -> None:
        if not future.done():
            report(index, prefix)

    def hop(index: int, prefix: Hypothesis) -> None:
        if threading.get_ident() == loop_thread:
            here(index, prefix)
        else:
            loop.call_soon_threadsafe(here, index, prefix)

    return hop


def resolve(
    future: asyncio.Future[list[Any]],
    results: list[Any] | None,
    error: Exception | None,
) -> None:
    if future.done():  # the request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results or [])
