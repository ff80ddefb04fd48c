"""A closed-loop gRPC load driver without locust: N users, each one request at a time, from a
pluggable mix of request kinds (some cancelled by the client mid-way), every outcome recorded.

Used by loadtest/soak_hour.py (hours at 32 users, mixed requests over every served model) and
loadtest/tracing_overhead.py (tracing on vs off). Lighter than locust's processes, which matters on
a small machine, and it can cancel a call part-way, which locust's users do not.

A mix is a list of `Kind`s: a name, a weight, and `make(rng, stub)` returning the call to make (a
`Call`: a unary-unary future factory and its request). Adding an RPC to the load (e.g. `Align`) is
one more Kind: see `repository_mix`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Call:
    """One request to send: the stub's multi-callable (e.g. stub.Translate) and its message."""

    method: Any  # grpc.UnaryUnaryMultiCallable
    request: Any
    cancel_after_s: float | None = None  # the client cancels it after this long (None: never)


@dataclass(frozen=True)
class Kind:
    name: str
    weight: int
    make: Callable[[random.Random, pb_grpc.TranslatorStub], Call]


@dataclass(frozen=True)
class Outcome:
    kind: str
    started: float  # monotonic seconds
    seconds: float
    code: str  # the gRPC status name; "CANCELLED_BY_CLIENT" for the calls the client cancelled
    details: str = ""  # the error's message ("" when answered)


# what a loop keeps of each answered call, where asked (ClosedLoop's `keep`): kind, request, answer
Keep = Callable[[str, Any, Any], None]


@dataclass
class Tally:
    """Every outcome of a run, in the order they ended (guarded by a lock)."""

    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_sent(self) -> None:
        with self.lock:
            self.sent += 1

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def snapshot(self) -> tuple[int, list[Outcome]]:
        with self.lock:
            return self.sent, list(self.outcomes)


CANCELLED_BY_CLIENT = "CANCELLED_BY_CLIENT"


def one_call(
    stub: pb_grpc.TranslatorStub,
    kind: Kind,
    rng: random.Random,
    timeout_s: float,
    wait_for_ready: bool = False,
    keep: Keep | None = None,
) -> Outcome:
    """Send one request of `kind` and wait for its end (answer, error, or our own cancel).
    wait_for_ready: a call made while no server listens waits for one (within its deadline), as a
    production client configures it, instead of failing at once; keep: given each answer."""
    call = kind.make(rng, stub)
    started = time.monotonic()
    future = call.method.future(call.request, timeout=timeout_s, wait_for_ready=wait_for_ready)
    code, details = "OK", ""
    if call.cancel_after_s is not None:
        try:
            future.result(timeout=call.cancel_after_s)
        except grpc.FutureTimeoutError:
            future.cancel()
            code = CANCELLED_BY_CLIENT
        except grpc.RpcError as err:
            code, details = err.code().name, err.details() or ""  # type: ignore[attr-defined]
    if code == "OK":
        try:
            answer = future.result()
        except grpc.FutureCancelledError:
            code = CANCELLED_BY_CLIENT
        except grpc.RpcError as err:
            code, details = err.code().name, err.details() or ""  # type: ignore[attr-defined]
        else:
            if keep is not None:
                keep(kind.name, call.request, answer)
    return Outcome(kind.name, started, time.monotonic() - started, code, details)


class ClosedLoop:
    """`users` threads, each with its own channel, sending back to back until `stop()`."""

    def __init__(
        self,
        target: str,
        mix: Sequence[Kind],
        users: int,
        timeout_s: float = 30.0,
        seed: int = 1,
        wait_for_ready: bool = False,
        keep: Keep | None = None,
    ) -> None:
        """wait_for_ready and keep: as `one_call`'s."""
        if not mix or any(k.weight < 0 for k in mix) or sum(k.weight for k in mix) <= 0:
            raise ValueError("the mix needs at least one kind with a positive weight")
        self.wait_for_ready, self.keep = wait_for_ready, keep
        self.target = target
        self.mix = list(mix)
        self.users = users
        self.timeout_s = timeout_s
        self.seed = seed
        self.tally = Tally()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self.user, args=(i,), name=f"user-{i}", daemon=True)
            for i in range(users)
        ]

    def start(self) -> ClosedLoop:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Let every user finish its call in flight, then return."""
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def user(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        weights = [k.weight for k in self.mix]
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            while not self.stopping.is_set():
                kind = rng.choices(self.mix, weights)[0]
                self.tally.add_sent()
                self.tally.add(
                    one_call(stub, kind, rng, self.timeout_s, self.wait_for_ready, self.keep)
                )


# --- mixes ------------------------------------------------------------------------------------------


def translate_kind(
    name: str,
    weight: int,
    model: str,
    texts: Sequence[str],
    n_texts: int = 1,
    beam: int = 5,
    alignment: pb.AlignmentMode = pb.ALIGNMENT_MODE_WORD,
    cancel_after_s: float | None = None,
    n_best: int = 2,
    max_length: int | None = None,
) -> Kind:
    """Translate `n_texts` texts drawn from `texts` on `model` ("" = the server's default), n-best
    up to the beam, at most `max_length` target tokens where given."""

    def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        request = pb.TranslateRequest(
            texts=rng.sample(list(texts), min(n_texts, len(texts))),
            options=pb.DecodingOptions(
                beam_size=beam,
                n_best=min(n_best, beam),
                alignment=alignment,
                max_length=max_length,
            ),
            model=pb.ModelSpec(name=model),
        )
        return Call(stub.Translate, request, cancel_after_s)

    return Kind(name, weight, make)


def align_kind(
    name: str,
    weight: int,
    model: str,
    texts: Sequence[str],
    n_pairs: int = 4,
    options: Callable[[random.Random], pb.AlignOptions] | None = None,
) -> Kind:
    """Align `n_pairs` pairs on `model`, each a text drawn from `texts` against another: a forced
    pass costs the same whatever the target says (words the vocabulary lacks are flagged);
    `options` draws each request's AlignOptions (None: the defaults)."""

    def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        pool = list(texts)
        pairs = [
            pb.AlignPair(source=rng.choice(pool), target=rng.choice(pool)) for _ in range(n_pairs)
        ]
        request = pb.AlignRequest(pairs=pairs, model=pb.ModelSpec(name=model))
        if options is not None:
            request.options.CopyFrom(options(rng))
        return Call(stub.Align, request, None)

    return Kind(name, weight, make)


def repository_mix(
    models: dict[str, Sequence[str]], target: str = "", cancel_after_s: float = 0.02
) -> list[Kind]:
    """Every model with its own texts (`models`: name → texts): single texts at beam 1 and 5, a
    batch of 8 with word alignment, a beam-5 request the client cancels after cancel_after_s, and
    Align requests of 4 pairs. (A mix factory also gets the server's address, `target`, to ask
    what it needs before the load; this one needs nothing.)"""
    kinds: list[Kind] = []
    for model, texts in models.items():
        kinds += [
            translate_kind(f"{model}/b5", 4, model, texts, beam=5),
            translate_kind(
                f"{model}/b1", 2, model, texts, beam=1, alignment=pb.ALIGNMENT_MODE_NONE
            ),
            translate_kind(
                f"{model}/batch8", 1, model, texts, n_texts=8, alignment=pb.ALIGNMENT_MODE_SUBWORD
            ),
            translate_kind(
                f"{model}/cancelled", 1, model, texts, n_texts=4, cancel_after_s=cancel_after_s
            ),
            align_kind(f"{model}/align4", 2, model, texts),
        ]
    return kinds


# --- statistics -------------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of values; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def latency_summary(outcomes: Sequence[Outcome], seconds: float) -> dict[str, float]:
    """p50 / p99 (ms) and requests/s of the answered (OK) calls."""
    ok = [o.seconds for o in outcomes if o.code == "OK"]
    return {
        "requests": len(ok),
        "rps": len(ok) / seconds if seconds > 0 else float("nan"),
        "p50_ms": 1000 * quantile(ok, 0.50),
        "p99_ms": 1000 * quantile(ok, 0.99),
    }
