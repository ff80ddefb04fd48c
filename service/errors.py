"""Every error a request can meet, and its gRPC status: the one place where errors become codes."""

from __future__ import annotations

import grpc

from service.engine import InvalidInput


class QueueFull(Exception):
    """The bounded queue has no room: the client should back off and retry."""


class NotReady(Exception):
    """The model is still loading (health says NOT_SERVING meanwhile)."""


class ShuttingDown(Exception):
    """The server is draining before exit and accepts no new work."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before it was decoded."""


class Cancelled(Exception):
    """The client cancelled the request (or went away)."""


class DecodeFailed(Exception):
    """The model runtime raised while decoding; the cause is in the server log."""


STATUS: dict[type[Exception], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Cancelled: grpc.StatusCode.CANCELLED,
    DecodeFailed: grpc.StatusCode.INTERNAL,
}

REJECT_REASON: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_argument",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "queue_full",
    grpc.StatusCode.UNAVAILABLE: "shutting_down",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.INTERNAL: "internal",
}


def reject_reason(code: grpc.StatusCode, error: Exception | None = None) -> str:
    """The `reason` label of s2s_rejected_requests_total: by status code, but a model still loading
    is told apart from a server shutting down (both UNAVAILABLE)."""
    if isinstance(error, NotReady):
        return "not_ready"
    return REJECT_REASON.get(code, "internal")


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and the message a client sees; unknown errors are INTERNAL without details."""
    for cls, code in STATUS.items():
        if isinstance(error, cls):
            return code, str(error)
    return grpc.StatusCode.INTERNAL, "internal error; the cause was logged by the server"
