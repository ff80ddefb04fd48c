"""Locust load test of translation.v1.Translator over gRPC (or its HTTP/JSON face).

    locust -f loadtest/locustfile.py --headless -u 32 -r 32 -t 30s --host 127.0.0.1:50051
    python -m loadtest.run --users 32 --duration 30s --out runs/loadtest/NAME   # the same, and more

Follows locust's pattern for non-HTTP clients: grpc made gevent-friendly, one channel per user, and
every call reported with `environment.events.request.fire(request_type="grpc", ...)`. Each request
kind is its own statistics row ("short-b5", "long-b5", "batch16-b5", "short-b1", ...): a single
short sentence, a single long one or a batch of 16, with beam 5 or 1 (see loadtest/workload.py).

Environment:
    S2S_TARGET               gRPC target when --host is not given (default 127.0.0.1:50051)
    S2S_LOADTEST_MIX         mixed (default) | beam1 | short-long
    S2S_LOADTEST_ALIGNMENT   none (default) | subword | word: alignments asked for in every request
    S2S_LOADTEST_SENTENCES   source<TAB>target TSV to draw sentences from (default: see workload.py)
    S2S_LOADTEST_TIMEOUT_S   per-call deadline in seconds (default 10)
    S2S_LOADTEST_WAIT_S      wait between a user's requests: SECONDS or MIN,MAX (default 0)
    S2S_LOADTEST_ROUND_ROBIN 1 to balance over every address a dns:/// target resolves to
    S2S_LOADTEST_TLS_CA, S2S_LOADTEST_TLS_CERT, S2S_LOADTEST_TLS_KEY   PEM files: TLS, mutual TLS
    S2S_LOADTEST_PROTOCOL    grpc (default) | http: the same requests as JSON to POST /v1/Translate
                             (--host is then the HTTP face's URL, e.g. http://127.0.0.1:8080;
                             loadtest/protocols.py compares the two under the same load)
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import gevent
import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import FastHttpUser, User, between, constant, events, stats
from locust.rpc import Message
from locust.runners import MasterRunner, WorkerRunner

try:
    from loadtest import workload
except ImportError:  # run as a plain file (`locust -f`) without the project installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from loadtest import workload
from google.protobuf import json_format

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.cli.client import channel_credentials, channel_options
from service.serve.protocol import decoding_options_to_pb

# grpc's C core must hand its waits to gevent, before any channel is opened
grpc_gevent.init_gevent()

CONFIG = workload.LoadTestConfig.from_env()
PROTOCOL = os.environ.get("S2S_LOADTEST_PROTOCOL", "grpc")
if PROTOCOL not in ("grpc", "http"):
    raise SystemExit(f"S2S_LOADTEST_PROTOCOL must be grpc or http, got {PROTOCOL!r}")
SOURCES, SOURCES_FROM = workload.load_sources(CONFIG.sentences)
SHORT, LONG = workload.split_by_length(SOURCES)
POOLS: dict[str, list[str]] = {"short": SHORT, "long": LONG, "all": SOURCES}


@events.init.add_listener
def describe(environment: Any, **_kwargs: Any) -> None:
    print(
        f"loadtest: mix={CONFIG.mix} alignment={CONFIG.alignment} timeout={CONFIG.timeout_s}s "
        f"sentences={len(SOURCES)} from {SOURCES_FROM} (short <= {len(SHORT[-1])} chars, "
        f"long >= {len(LONG[0])} chars)",
        file=sys.stderr,
    )


@events.quitting.add_listener
def let_csv_catch_up(environment: Any, **_kwargs: Any) -> None:
    """locust rewrites its CSV files every second, not at exit: one more turn for the final numbers."""
    options = environment.parsed_options
    if options is not None and getattr(options, "csv_prefix", None):
        gevent.sleep(stats.CSV_STATS_INTERVAL_SEC + 0.25)


# --- distributed runs (--processes): every call in flight at the end is counted ------------------

USERS_RUNNING = "s2s_users_running"  # added to each worker's stats report


@events.init.add_listener
def count_the_last_calls(environment: Any, **_kwargs: Any) -> None:
    """On the time limit, locust's headless master tells its workers to quit and waits 0.5 s for
    their last reports, so the calls still in flight are lost: against the server's own count,
    5-10 % of a run's requests when calls take a second or more (the unbatched policy at 32-64
    users). Workers here say in every report how many users still run; the master waits (up to the
    stop timeout) for a report with none from each worker before it stops listening."""
    runner = environment.runner
    if isinstance(runner, WorkerRunner):

        def report_running_users(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            data[USERS_RUNNING] = runner.user_count

        environment.events.report_to_master.add_listener(report_running_users)
    elif isinstance(runner, MasterRunner):
        done: set[str] = set()

        def note_finished_worker(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            if data.get(USERS_RUNNING) == 0:
                done.add(client_id)

        def quit_after_the_last_reports() -> None:
            runner.stop(send_stop_to_client=False)
            workers = {client.id for client in runner.clients.all}
            done.clear()
            for worker in workers:
                runner.server.send_to_client(Message("quit", None, worker))
            deadline = time.monotonic() + environment.stop_timeout + 5
            while not workers <= done and time.monotonic() < deadline:
                gevent.sleep(0.1)
            runner.greenlet.kill(block=True)

        environment.events.worker_report.add_listener(note_finished_worker)
        setattr(runner, "quit", quit_after_the_last_reports)  # noqa: B010 (replaces a method)


MODEL_NAMES = [
    name for name, _ in CONFIG.models
]  # S2S_LOADTEST_MODELS: which model each call names
MODEL_WEIGHTS = [weight for _, weight in CONFIG.models]


class TranslateFailed(Exception):
    """A failed call, in a form that groups well in locust's failure table: 'CODE: details'."""


def target_of(host: str) -> str:
    """locust's host as a gRPC target: a grpc:// or http:// prefix is dropped."""
    for prefix in ("grpc://", "http://"):
        if host.startswith(prefix):
            return host[len(prefix) :].rstrip("/")
    return host


class GrpcUser(User):
    """A user with its own channel to the Translator; `call` times one Translate and reports it."""

    abstract = True
    host = CONFIG.target

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        target = target_of(self.host or CONFIG.target)
        env = os.environ
        credentials = channel_credentials(
            env.get("S2S_LOADTEST_TLS_CA") or None,
            env.get("S2S_LOADTEST_TLS_CERT") or None,
            env.get("S2S_LOADTEST_TLS_KEY") or None,
        )
        options = channel_options(
            16 * 1024 * 1024, env.get("S2S_LOADTEST_ROUND_ROBIN", "") in ("1", "true", "yes")
        )
        if credentials is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            self.channel = grpc.secure_channel(target, credentials, options=options)
        self.stub = pb_grpc.TranslatorStub(self.channel)
        self.rng = random.Random()

    def on_stop(self) -> None:
        self.channel.close()

    def call(self, name: str, texts: list[str], beam: int) -> None:
        request_id = f"lt-{uuid.uuid4().hex[:12]}"
        model = self.rng.choices(MODEL_NAMES, MODEL_WEIGHTS)[0]
        name = workload.request_name(name, model)
        request = pb.TranslateRequest(
            texts=texts,
            options=decoding_options_to_pb(beam_size=beam, alignment=CONFIG.alignment),
            request_id=request_id,
            model=pb.ModelSpec(name=model),
        )
        exception: Exception | None = None
        response_length = 0
        started = time.perf_counter()
        try:
            response = self.stub.Translate(request, timeout=CONFIG.timeout_s)
            response_length = response.ByteSize()
            if len(response.translations) != len(texts) or not all(
                t.hypotheses for t in response.translations
            ):
                exception = TranslateFailed(
                    f"BAD_RESPONSE: {len(response.translations)} translations for {len(texts)} texts"
                )
        except grpc.RpcError as err:
            code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            exception = TranslateFailed(f"{code}: {details}")
        self.environment.events.request.fire(
            request_type="grpc",
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=response_length,
            exception=exception,
            context={
                "request_id": request_id,
                "texts": len(texts),
                "beam": beam,
                "alignment": CONFIG.alignment,
                "mix": CONFIG.mix,
            },
        )


class HttpJsonUser(FastHttpUser):
    """A user of the HTTP/JSON face: the same request as GrpcUser's, as proto3 JSON."""

    abstract = True

    def on_start(self) -> None:
        self.rng = random.Random()

    def call(self, name: str, texts: list[str], beam: int) -> None:
        request_id = f"lt-{uuid.uuid4().hex[:12]}"
        options = decoding_options_to_pb(beam_size=beam, alignment=CONFIG.alignment)
        body = {
            "texts": texts,
            "options": json_format.MessageToDict(options, preserving_proto_field_name=True),
            "request_id": request_id,
        }
        with self.client.post(
            f"/v1/Translate?timeout={CONFIG.timeout_s:g}",
            json=body,
            name=name,
            catch_response=True,
            context={"request_id": request_id, "texts": len(texts), "beam": beam},
        ) as response:
            if response.status_code != 200:
                try:
                    error = response.json()
                    response.failure(f"{error['code']}: {error['message']}")
                except (ValueError, KeyError, TypeError):
                    response.failure(f"HTTP {response.status_code}")
                return
            translations = response.json().get("translations", [])
            if len(translations) != len(texts) or not all(t["hypotheses"] for t in translations):
                response.failure(
                    f"BAD_RESPONSE: {len(translations)} translations for {len(texts)} texts"
                )


def make_task(kind: workload.RequestKind) -> Any:
    def task(user: GrpcUser | HttpJsonUser) -> None:
        pool = POOLS[kind.pool]
        texts = [user.rng.choice(pool)] if kind.texts == 1 else user.rng.choices(pool, k=kind.texts)
        user.call(kind.name, texts, kind.beam)

    task.__name__ = kind.name.replace("-", "_")
    return task


TASKS = [  # a task listed `weight` times is picked in proportion (locust's {task: weight})
    task
    for name, weight in workload.mix_weights(CONFIG.mix).items()
    for task in [make_task(workload.REQUEST_KINDS[name])] * weight
]
WAIT = (
    constant(CONFIG.wait_s[0]) if CONFIG.wait_s[0] == CONFIG.wait_s[1] else between(*CONFIG.wait_s)
)


class HttpTranslatorUser(HttpJsonUser):
    """TranslatorUser's workload over HTTP/JSON; the only user class when S2S_LOADTEST_PROTOCOL=http."""

    abstract = PROTOCOL != "http"
    tasks = TASKS
    wait_time = WAIT


class TranslatorUser(GrpcUser):
    """The workload S2S_LOADTEST_MIX selects: its request kinds, weighted."""

    abstract = PROTOCOL != "grpc"
    tasks = TASKS
    wait_time = WAIT
