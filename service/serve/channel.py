"""The channel between front processes and engine processes: the only module that knows the wire.

ZeroMQ (pyzmq) carries the messages and msgspec's msgpack encodes them
(benchmarks/serving/zmq_channel.py chose it by measurement: 4x faster than msgpack's own package on
a job, 3x on results); a numpy array travels as its raw bytes (a msgpack extension: dtype, shape,
buffer), never as a list of numbers. An engine binds a ROUTER socket (`ipc://` between
processes, `inproc://` in the single-process mode, where both halves share one process); each
front connects one DEALER socket to it. A message is one frame: a list whose first item says what
it is.

front -> engine                                  engine -> front
  HELLO  name, engine id, generation it follows    VERSIONS  generation, engine id, versions
  JOB    id, kind, model, version, deadline,       BEAT      engine id, busy seconds, queued, decoding
         trace carrier, request id, work          TAKEN     id (the engine holds it now)
  CANCEL id                                        DONE      id, results (raw: service/serve/results.py)
  HEADS  id, model, version, texts                 FAILED    id, error name, message
  ACK    generation                                PROGRESS  id, sentence, its settled prefix

A streamed job's work asks for PROGRESS: a sentence's settled prefix (the part of its best
translation no later step can change), sent each time it grows, before the job's DONE.

An engine says TAKEN as a JOB or HEADS reaches it: a request it never took (sent in the moment
between its death and the front's knowing: `Peer.fail_all` answers it `NotTaken`) is one its death
need not fail, and the front sends it again (service/serve/engine_link.py).

A job's deadline is a `time.monotonic()` reading: the same clock in every process of a host. The
work and the results are what the worker takes and gives (service/serve/jobs.py's Job with
`raw`): token ids, controls and options in; each sentence's n-best lists (token ids, scores, the
attention as one array) or each pair's forced pass out. Errors travel as their class names
(service/decode/shared/errors.py) and are raised again on the front.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, NamedTuple, cast

import msgspec
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from service.decode.align.forced import AlignOptions, Forced
from service.decode.shared import errors
from service.decode.shared.controls import Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis, Settled
from service.decode.text.preparation import Prepared, RawParts
from service.decode.text.sides import PreparedPair, Side
from service.decode.text.translation import AlignmentMode

log = logging.getLogger("s2s.channel")

# message kinds (the first item of every message)
HELLO, JOB, CANCEL, HEADS, ACK = 1, 2, 3, 4, 5
VERSIONS, BEAT, DONE, FAILED, TAKEN, PROGRESS = 11, 12, 13, 14, 15, 16
# job kinds
TRANSLATE, ALIGN = 1, 2

ARRAY = 1  # the msgpack extension code of a numpy array
CONTROLS = tuple(f.name for f in fields(Controls))
ALIGN_OPTIONS = tuple(f.name for f in fields(AlignOptions))
ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidInput,
        errors.QueueFull,
        errors.NotReady,
        errors.ShuttingDown,
        errors.DeadlineExceeded,
        errors.Cancelled,
        errors.DecodeFailed,
        errors.ModelNotFound,
        errors.EngineUnavailable,
    )
}


# --- encoding ---------------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        header = _ENCODE_HEADER((obj.dtype.str, obj.shape))
        return msgspec.msgpack.Ext(
            ARRAY, len(header).to_bytes(2, "little") + header + obj.tobytes()
        )
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__} over the channel")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != ARRAY:
        raise ValueError(f"unknown msgpack extension {code}")
    n = int.from_bytes(data[:2], "little")
    dtype, shape = _DECODE_HEADER(data[2 : 2 + n])
    return np.frombuffer(data, np.dtype(dtype), offset=2 + n).reshape(shape)


_ENCODE_HEADER = msgspec.msgpack.Encoder().encode
_DECODE_HEADER = msgspec.msgpack.Decoder().decode
_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def pack(message: Sequence[Any]) -> bytes:
    return _ENCODER.encode(message)


def unpack(data: bytes) -> Any:
    """A message; arrays come back read-only over the frame's bytes."""
    return _DECODER.decode(data)


def tuples(value: Any) -> Any:
    """Lists (msgpack's arrays) as tuples, nested: what frozen options and controls hold."""
    return tuple(tuples(v) for v in value) if isinstance(value, list | tuple) else value


def error_message(error: Exception) -> tuple[str, str]:
    name = type(error).__name__
    return (name if name in ERRORS else "DecodeFailed"), str(error)


def error_from(name: str, message: str) -> Exception:
    return ERRORS.get(name, errors.DecodeFailed)(message)


# --- the work, both ways ----------------------------------------------------------------------


def controls_out(controls: Controls) -> tuple[Any, ...]:
    return tuple(getattr(controls, name) for name in CONTROLS)


def controls_in(values: Sequence[Any]) -> Controls:
    return Controls(**{name: tuples(v) for name, v in zip(CONTROLS, values, strict=True)})


def translate_work(
    sentences: Sequence[Prepared],
    options: SearchOptions,
    alignment: str,
    controls: Sequence[tuple[Controls, ...]],
    keep_rows: bool = False,
    progress: bool = False,
) -> tuple[Any, ...]:
    """A Translate job's work: each sentence's parts' token ids and controls, the options,
    whether the link head reads the sources next (the engine keeps their encoder rows), and
    whether the front streams it (PROGRESS)."""
    return (
        tuple(tuple(p.ids for p in s.parts) for s in sentences),
        tuple(tuple(controls_out(c) for c in parts) for parts in controls),
        options.values(),
        alignment,
        keep_rows,
        progress,
    )


class TranslateWork(NamedTuple):
    sentences: list[Prepared]  # without their text: the engine reads token ids only
    options: SearchOptions
    alignment: AlignmentMode
    controls: list[Any]
    keep_rows: bool
    progress: bool


def read_translate(work: Sequence[Any]) -> TranslateWork:
    """A Translate job's work as the engine's worker takes it."""
    parts, controls, values, alignment, keep_rows, progress = work
    sentences = []
    for ids in parts:
        if len(ids) == 1:
            sentences.append(Prepared("", list(ids[0]), []))
        else:
            segments = tuple(Prepared("", list(p), []) for p in ids)
            sentences.append(Prepared("", [i for p in ids for i in p], [], segments))
    return TranslateWork(
        sentences,
        SearchOptions(**{name: tuples(v) for name, v in values.items()}),
        cast(AlignmentMode, alignment),
        [tuple(controls_in(c) for c in parts) for parts in controls],
        bool(keep_rows),
        bool(progress),
    )


def align_work(pairs: Sequence[PreparedPair], options: AlignOptions) -> tuple[Any, ...]:
    """An Align job's work: each pair's token ids and words (the link head reads them)."""
    return (
        tuple(
            (p.src.ids, p.tgt.ids, p.src.words, p.src.word_of, p.tgt.words, p.tgt.word_of)
            for p in pairs
        ),
        tuple(getattr(options, name) for name in ALIGN_OPTIONS),
    )


def read_align(work: Sequence[Any]) -> tuple[list[PreparedPair], AlignOptions]:
    pairs, values = work
    out = []
    for src_ids, tgt_ids, src_words, src_word_of, tgt_words, tgt_word_of in pairs:
        src = Side(list(src_words), list(src_ids), [], np.asarray(src_word_of), [])
        tgt = Side(list(tgt_words), list(tgt_ids), [], np.asarray(tgt_word_of), [])
        out.append(PreparedPair(Prepared("", list(src_ids), []), src, tgt))
    return out, AlignOptions(**dict(zip(ALIGN_OPTIONS, values, strict=True)))


def hypothesis_out(h: Hypothesis) -> tuple[Any, ...]:
    return (h.tokens, h.score, h.log_prob, h.finished_by_eos, h.token_log_probs, h.attention)


def hypothesis_in(values: Sequence[Any]) -> Hypothesis:
    tokens, score, log_prob, finished, token_log_probs, attention = values
    return Hypothesis(list(tokens), score, log_prob, attention, finished, token_log_probs)


def results_out(kind: int, results: Sequence[Any]) -> tuple[Any, ...]:
    """A raw job's results: each sentence's parts' hypotheses, or each pair's forced pass."""
    if kind == ALIGN:
        return tuple((f.token_log_probs, f.attention, logits) for f, logits in results)
    return tuple(
        tuple(tuple(hypothesis_out(h) for h in hyps) for hyps in parts) for parts in results
    )


def results_in(kind: int, values: Sequence[Any]) -> list[Any]:
    if kind == ALIGN:
        return [(Forced(lp, attention), logits) for lp, attention, logits in values]
    out: list[RawParts] = [[[hypothesis_in(h) for h in hyps] for hyps in parts] for parts in values]
    return out


# --- the front's end --------------------------------------------------------------------------


Answer = Callable[[Any, Exception | None], None]  # (results, error): one of them None


class NotTaken(errors.EngineUnavailable):
    """The engine went before it took the request (no TAKEN came): it never held it."""


class Peer:
    """One front's connection to one engine (a DEALER socket), on the front's event loop.

    `request(kind, build, answer)` sends `build(id)` and calls `answer` once with the engine's
    DONE (raw results, read) or FAILED (the error raised again); VERSIONS and BEAT go to the
    callbacks. `fail_all` answers every open request with an error (the engine is gone).
    `on_gone` is called when the connection to the engine closes (its process ended: ZeroMQ's
    socket monitor says so at once, where a silent heartbeat takes seconds), after the messages
    that came before it are dispatched.

    The socket is read from the loop's own reader callback (`drain`), every message waiting at
    once, not through zmq.asyncio's futures: a future per message was a twentieth of a front's
    time. ZeroMQ's descriptor signals edges, so a send, which may consume one, looks again."""

    def __init__(
        self,
        address: str,
        name: str,
        on_versions: Callable[[Sequence[Any]], None],
        on_beat: Callable[[Sequence[Any]], None],
        context: zmq.Context[Any] | None = None,
        on_gone: Callable[[], None] = lambda: None,
    ) -> None:
        self.address = address
        self.name = name
        self.on_versions = on_versions
        self.on_beat = on_beat
        self.on_gone = on_gone
        # the process's one ZeroMQ context (inproc:// joins sockets of one context only)
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.monitor: zmq.Socket[Any] | None = None  # the socket's disconnections (start)
        self.ids = itertools.count(1)
        self.open: dict[int, tuple[int, Answer]] = {}  # id -> (job kind, its answer)
        self.taken: set[int] = set()  # the open requests the engine said it holds (TAKEN)
        self.progress: dict[int, Settled] = {}  # streamed: PROGRESS
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining = False  # a drain is scheduled

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.loop.add_reader(self.monitor.fileno(), self.watch_connection)
        self.watch_connection()  # its descriptor signals edges: read what came before the reader
        self.socket.connect(self.address)
        self.loop.add_reader(self.socket.getsockopt(zmq.FD), self.drain)
        self.hello()

    def watch_connection(self) -> None:
        """The monitor's events: a disconnection (the engine's end closed) calls `on_gone`, once
        what the engine sent before it is dispatched (ZeroMQ keeps a closed pipe's messages
        readable until they are read)."""
        assert self.monitor is not None
        while self.monitor.poll(0, zmq.POLLIN):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.drain()
                self.on_gone()

    def hello(self, engine: str = "", generation: int = 0) -> None:
        """Introduce this front (again: once a second, a ping) with the engine life and the
        generation of versions it follows: the engine sends VERSIONS where it follows an older."""
        self.send((HELLO, self.name, engine, generation))

    def send(self, message: Sequence[Any]) -> None:
        """Queue a message (never waits: ZeroMQ queues it while the engine is away)."""
        try:
            self.socket.send(pack(message), zmq.NOBLOCK)
        except zmq.Again as err:  # its high-water mark: the engine is not reading
            raise errors.EngineUnavailable(
                "the engine process is not taking work: retry in a few seconds"
            ) from err
        if not self.draining and self.loop is not None and self.readable():
            self.draining = True
            self.loop.call_soon(self.drain)

    def readable(self) -> bool:
        return bool(self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def request(
        self,
        kind: int,
        build: Callable[[int], Sequence[Any]],
        answer: Answer,
        progress: Settled | None = None,
    ) -> int:
        """Send `build(id)`; returns the id (kind 0: the results are passed on unread).
        `progress(sentence, settled prefix)` hears its PROGRESS messages until its answer."""
        ident = next(self.ids)
        self.send(build(ident))
        self.open[ident] = (kind, answer)
        if progress is not None:
            self.progress[ident] = progress
        return ident

    def forget(self, ident: int) -> None:
        self.open.pop(ident, None)
        self.taken.discard(ident)
        self.progress.pop(ident, None)

    def fail_all(self, error: Exception) -> None:
        """Answer every open request: `error` those the engine took, `NotTaken` the others."""
        open_, self.open = self.open, {}
        self.progress = {}
        taken, self.taken = self.taken, set()
        never = NotTaken(f"the engine process went before it took this request: {error}")
        for ident, (_, answer) in open_.items():
            answer(None, error if ident in taken else never)

    def drain(self) -> None:
        """Every message waiting, dispatched."""
        self.draining = False
        while self.readable():
            try:
                data = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.dispatch(unpack(data))
            except Exception:  # a message it cannot read must not stop the others
                log.exception("unreadable message from the engine at %s", self.address)

    def dispatch(self, message: Sequence[Any]) -> None:
        kind = message[0]
        if kind == BEAT:
            self.on_beat(message)
        elif kind == VERSIONS:
            self.on_versions(message)
        elif kind == TAKEN:
            if message[1] in self.open:
                self.taken.add(message[1])
        elif kind == PROGRESS:
            report = self.progress.get(message[1])
            if report is not None:
                report(message[2], hypothesis_in(message[3]))
        elif kind in (DONE, FAILED):
            self.taken.discard(message[1])
            self.progress.pop(message[1], None)
            entry = self.open.pop(message[1], None)
            if entry is None:
                return  # cancelled meanwhile
            job_kind, answer = entry
            if kind == FAILED:
                answer(None, error_from(message[2], message[3]))
            elif job_kind == 0:
                answer(message[2], None)
            else:
                answer(results_in(job_kind, message[2]), None)

    async def close(self) -> None:
        if self.loop is not None and not self.socket.closed:
            self.loop.remove_reader(self.socket.getsockopt(zmq.FD))
        if self.monitor is not None:
            if self.loop is not None:
                self.loop.remove_reader(self.monitor.fileno())
            self.socket.disable_monitor()
            self.monitor.close(0)
        self.socket.close(0)


# --- the engine's end -------------------------------------------------------------------------


class Endpoint:
    """An engine's ROUTER socket, served by one thread: messages in go to `handle(peer, message)`
    (called on that thread; it must not block), messages out are queued from any thread (`send`,
    `broadcast`) and encoded and sent by that thread. `tick()` is called every `tick_s` (heartbeats)."""

    def __init__(
        self,
        address: str,
        handle: Callable[[bytes, Sequence[Any]], None],
        tick: Callable[[], None],
        tick_s: float = 0.2,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.address = address
        self.handle = handle
        self.tick = tick
        self.tick_s = tick_s
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)
        self.wake_address = f"inproc://wake-{id(self)}"
        self.wake_in = self.context.socket(zmq.PULL)
        self.wake_in.bind(self.wake_address)
        self.local = threading.local()  # each sending thread's PUSH end of the wake-up
        self.outbox: queue.SimpleQueue[tuple[bytes | None, Sequence[Any]]] = queue.SimpleQueue()
        self.peers: set[bytes] = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="engine-channel", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def send(self, peer: bytes | None, message: Sequence[Any]) -> None:
        """Queue a message for one peer (None: every peer that said HELLO), from any thread."""
        self.outbox.put((peer, message))
        if threading.current_thread() is not self.thread:
            self._wake()

    def broadcast(self, message: Sequence[Any]) -> None:
        self.send(None, message)

    def _wake(self) -> None:
        push = getattr(self.local, "push", None)
        if push is None:
            push = self.local.push = self.context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self.wake_address)
        push.send(b"", zmq.NOBLOCK)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.wake_in, zmq.POLLIN)
        next_tick = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                next_tick = now + self.tick_s
            ready = dict(poller.poll(max(1, int((next_tick - now) * 1000))))
            if self.wake_in in ready:
                while True:
                    try:
                        self.wake_in.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
            if self.socket in ready:
                self.receive()
            self.flush()
        self.flush()
        self.socket.close(0)
        self.wake_in.close(0)

    def receive(self) -> None:
        while True:
            try:
                peer, data = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = unpack(data)
                if message[0] == HELLO:
                    self.peers.add(peer)
                self.handle(peer, message)
            except Exception:
                log.exception("unreadable message from a front")

    def flush(self) -> None:
        while True:
            try:
                peer, message = self.outbox.get_nowait()
            except queue.Empty:
                return
            try:
                data = pack(message)
            except Exception:
                log.exception("cannot encode a message for the front")
                continue
            for target in self.peers if peer is None else (peer,):
                try:
                    self.socket.send_multipart((target, data), zmq.NOBLOCK)
                except zmq.ZMQError:  # a front gone (its queue full, or unknown)
                    self.peers.discard(target)

    def stop(self) -> None:
        self.stopping.set()
        self._wake()
        self.thread.join(5.0)
