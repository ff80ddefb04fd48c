"""Errors become status codes here, and only here: the gRPC face aborts with them, the HTTP face maps
them on to HTTP statuses (service/serve/http_api.py), and the metrics count rejections by them."""

from __future__ import annotations

import grpc

from service.decode.shared.errors import (
    Cancelled,
    DeadlineExceeded,
    DecodeFailed,
    EngineUnavailable,
    InvalidInput,
    ModelNotFound,
    NotReady,
    QueueFull,
    ShuttingDown,
)

STATUS: dict[type[Exception], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Cancelled: grpc.StatusCode.CANCELLED,
    DecodeFailed: grpc.StatusCode.INTERNAL,
}

REJECT_REASON: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_argument",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "queue_full",
    grpc.StatusCode.UNAVAILABLE: "shutting_down",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.INTERNAL: "internal",
}


def reject_reason(code: grpc.StatusCode, error: Exception | None = None) -> str:
    """The `reason` label of s2s_rejected_requests_total: by status code, but a model still loading
    and an engine process gone are told apart from a server shutting down (all UNAVAILABLE)."""
    if isinstance(error, EngineUnavailable):
        return "engine_unavailable"
    if isinstance(error, NotReady):
        return "not_ready"
    return REJECT_REASON.get(code, "internal")


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and the message a client sees; unknown errors are INTERNAL without details."""
    for cls, code in STATUS.items():
        if isinstance(error, cls):
            return code, str(error)
    return grpc.StatusCode.INTERNAL, "internal error; the cause was logged by the server"
