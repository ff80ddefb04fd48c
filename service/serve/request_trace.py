"""A request's trace as the serving code sees it: what happened to the request (queued, admitted,
encoded, a decoder step, answered) and its attributes. service/serve/tracing.py records it as
OpenTelemetry spans; with tracing off every call is a no-op on NO_TRACE. This module imports no
OpenTelemetry (and so no grpc): the worker reports through it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any


class RequestTrace:
    """One request's span and its children. NO_TRACE (tracing off) does nothing."""

    recording = False
    trace_id = ""

    def set(self, **attributes: Any) -> None:
        """Attributes of the RPC span, named after the keyword with "_" → "." (model_name →
        s2s.model.name)."""

    def texts(self, key: str, texts: Sequence[str]) -> None:
        """The texts under s2s.<key>, only with --trace-text."""

    def finish(self, code: str, message: str = "") -> None:
        """The RPC's status code (a gRPC code name)."""

    def queued(self) -> None:
        """The job was submitted to the worker."""

    def admitted(self, queue_wait_s: float, batch_sentences: int, encoded_ahead: bool) -> None:
        """One of its sentences joined a running batch after waiting queue_wait_s, with
        batch_sentences others admitted at once; encoded_ahead: the encode-ahead thread had
        encoded it (else the worker encodes it now: an "encode" span)."""

    def encoded(self, start_ns: int, end_ns: int, sentences: int) -> None:
        """An encoder call (wall-clock ns) read its sentences, `sentences` in the call."""

    def step(self, sentences: int, hypotheses: int, seconds: float) -> None:
        """A decoder step its sentences took part in, with the batch's size."""

    def decoded(self, error: Exception | None) -> None:
        """The worker answered the job."""

    def carrier(self) -> dict[str, str]:
        """The trace's context as W3C headers (traceparent), for the engine process's spans."""
        return {}


NO_TRACE = RequestTrace()
_CURRENT: contextvars.ContextVar[RequestTrace] = contextvars.ContextVar(
    "s2s_request_trace", default=NO_TRACE
)


def current_trace() -> RequestTrace:
    """The trace of the request this code runs for (NO_TRACE outside one, or with tracing off)."""
    return _CURRENT.get()


@contextlib.contextmanager
def active(trace: RequestTrace) -> Iterator[RequestTrace]:
    """`trace` is current_trace() inside the block (in this task and the tasks it starts)."""
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)
