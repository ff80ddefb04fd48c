"""Every error a request can meet, as plain exceptions: no grpc here, and no engine.

The transports map them to their status codes (service/serve/status.py, one place for both faces),
so the engine, the worker and the benchmarks raise and catch them without importing grpc.
"""

from __future__ import annotations


class InvalidInput(ValueError):
    """A request the engine refuses; the message says what to change."""


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


class ModelNotFound(LookupError):
    """The request names a model or version that is not served; the message lists what is."""


class EngineUnavailable(NotReady):
    """The engine process that decodes for this model stopped or stopped answering (a supervisor
    restarts it): the request was not answered and may be retried."""
