"""The work a front sends to an engine's worker: a `Job` (one request's sentences, or an Align
request's pairs, for one model version) and what comes back for each of its sentences.

Plain types only: a front builds jobs without loading ONNX Runtime (the worker that decodes them is
service/serve/worker.py; the channel carries them between processes, service/serve/channel.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from service.decode.align.forced import AlignedPair, AlignOptions, Forced
from service.decode.shared.controls import Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Settled
from service.decode.text.preparation import Prepared, RawParts
from service.decode.text.sides import PreparedPair
from service.decode.text.translation import AlignmentMode, Translation
from service.serve.request_trace import NO_TRACE, RequestTrace

if TYPE_CHECKING:  # a ModelVersion holds an Engine: keep onnxruntime out of a front's jobs
    from service.serve.repository import ModelVersion


Result = Translation | AlignedPair  # a Translate sentence's, an Align pair's
RawResult = RawParts | tuple[Forced, np.ndarray | None]  # a raw job's result per sentence or pair


@dataclass(eq=False)
class Job:
    """One request's sentences; `on_done(results, error)` is called once, from the worker thread.
    An Align job (`Job.align`) holds its pairs, and their sources as its sentences (what is encoded)."""

    request_id: str
    sentences: Sequence[Prepared]
    options: SearchOptions
    alignment: AlignmentMode
    on_done: Callable[[list[Any] | None, Exception | None], None]
    deadline: float | None = None  # clock reading
    model: ModelVersion | None = None  # None: the worker's default model
    results: dict[int, Result | RawResult] = field(default_factory=dict)
    finished: bool = False
    trace: RequestTrace = NO_TRACE  # the request's spans (service/serve/tracing.py)
    pairs: Sequence[PreparedPair] = ()  # Align: teacher-forced, one result per pair
    align_options: AlignOptions | None = None  # set for an Align job
    # results left as the search gives them (an engine process's: its front converts them):
    # a sentence's RawParts, a pair's (Forced, link head scores or None)
    raw: bool = False
    # each sentence's parts' controls, computed by the front (None: the batch computes them)
    controls: Sequence[tuple[Controls, ...]] | None = None
    # the link head reads its sources next (markup): their encoder rows are kept for it
    # (Engine.kept_rows) instead of encoded again
    keep_rows: bool = False
    # a streamed request's: `on_progress(index, settled)` as a sentence's settled prefix grows
    # (RunningBatch.settled), from the worker thread; a segmented sentence reports none
    on_progress: Settled | None = None

    @classmethod
    def align(
        cls,
        request_id: str,
        pairs: Sequence[PreparedPair],
        options: AlignOptions,
        on_done: Callable[[list[Any] | None, Exception | None], None],
        deadline: float | None = None,
        model: ModelVersion | None = None,
    ) -> Job:
        """An Align request's job: its pairs decode in the forced batches, one row each."""
        sources = [p.source for p in pairs]
        single_row = SearchOptions(beam_size=1, n_best=1)
        return cls(
            request_id, sources, single_row, "none", on_done, deadline, model,
            pairs=pairs, align_options=options,
        )  # fmt: skip

    @property
    def forced(self) -> bool:
        return self.align_options is not None

    def complete(self, error: Exception | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.trace.decoded(error)
        if error is not None:
            self.on_done(None, error)
        else:
            self.on_done([self.results[i] for i in range(len(self.sentences))], None)


@dataclass(frozen=True)
class SentenceKey:
    """Sentence `index` of a job: the key of a queued or decoding sentence."""

    job: Job
    index: int
