"""Documents served beside single sentences: one server, closed-loop gRPC clients, four phases.

    python -m benchmarks.serving.documents_served [--bundle models/grc-en-nt-transformer] \
        [--seconds 20] [--rounds 2] [--json docs/benchmarks/documents-served.json]

One server (`python -m service.serve.server` on the bundle, CPU, its defaults; WARNING logs as
served.py's) and `--users` (32) clients, each one request at a time, back to back, in a few client
processes (served.py's reason). Every request has split_sentences "on", no alignment, the model's
beam and n-best. The phases, each `--seconds` after a `--warmup-s` warm-up:

- A, singles alone: every client sends one sentence per Translate;
- B, documents beside singles: `--document-users` (8) of them send documents instead, 5 to 50
  sentences (a uniform draw per request) joined by a space, some (`--newline-share`) by a newline;
- C, the same sentences one per request: those clients send a drawn document's sentences one per
  Translate, in order, then draw the next (B's work without documents);
- D, streaming: as B, the document clients on TranslateStream.

The rounds take the phases in turns (A B C D, then D C B A, ...) so that the machine's noise favours
none; each figure is the median over rounds. Sentences/s, two ways: the server's (its
s2s_translated_sentences_total over the window: each sentence counted as it finishes, which the
B ÷ C floor reads) and the clients' (the sentences of the answers that ended in the window, a
document all of its sentences at once: a 12-second document straddling a 20-second window's edge
counts whole or not at all); latencies are those of the requests that started in it (the clients
run `--cooldown-s` past it, so those end under load). The server's queue wait
(s2s_queue_wait_seconds, per sentence) and decoder batch size (s2s_batch_sentences) over the window
come from its /metrics. Floors: B ÷ C sentences/s >= 1.0, B's singles p99 ÷ A's <= 1.5.

The sentences are the bundle's sample texts (benchmarks/sample_texts.py: the Greek models' dev
verses, loadtest/grc_sources.txt), each with a capital first letter and a final '.', as the splitter
(service/model/sentences.py) needs to cut there; each is checked to be one sentence to it, and drawn
documents to cut into their number. Any error, or a document answered with another number of
sentences, fails the run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from benchmarks.sample_texts import bundle_texts
from loadtest import prom
from loadtest.closed_loop import Call, ClosedLoop, Kind
from loadtest.harness import LocalServer, RunFailed
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.model.sentences import split_sentences

REPO = Path(__file__).resolve().parent.parent.parent
FINAL = ".;!?"
PHASES = {  # the document clients' role in each phase (None: they send singles too)
    "A": None,
    "B": "document",
    "C": "walk",
    "D": "stream",
}
ROLES = ("single", "document", "walk", "stream")
TITLES = {"A": "singles alone", "B": "documents + singles", "C": "B's sentences one per request",
          "D": "documents streamed + singles"}  # fmt: skip

# One answered or failed request, as a client process sends it back.
Answer = tuple[str, int, float, float, float | None, str, str]
# (role, sentences, started (monotonic s), seconds, first message's seconds (stream), code, details)


@dataclass(frozen=True)
class Draw:
    """How a document is drawn: its sentences from `pool`, `low` to `high` of them, each joined to
    the previous by a newline with probability `newline_share`, else a space."""

    pool: tuple[str, ...]
    language: str  # the model's source language, as its splitter cuts
    low: int
    high: int
    newline_share: float

    def sentences(self, rng: random.Random, n: int | None = None) -> list[str]:
        return rng.sample(self.pool, rng.randint(self.low, self.high) if n is None else n)

    def join(self, rng: random.Random, sentences: Sequence[str]) -> str:
        text = sentences[0]
        for s in sentences[1:]:
            text += ("\n" if rng.random() < self.newline_share else " ") + s
        return text


def as_sentence(verse: str) -> str:
    """A verse as a sentence the splitter cuts after: a capital first letter, a final '.'."""
    verse = verse.strip()
    verse = verse[0].upper() + verse[1:]
    return verse if verse[-1] in FINAL else verse + "."


def source_language(bundle: Path) -> str:
    """The bundle's source language, as the server reads it (its manifest's info; "" unknown)."""
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    return str(manifest.get("info", {}).get("source_language", ""))


def sentence_pool(texts: Sequence[str], language: str, at_least: int) -> list[str]:
    """The texts as sentences, those the splitter keeps whole and cuts after when another follows
    (a verse ending in a one-letter word, "ὦ.", reads as an initial: no cut); RunFailed when
    fewer than `at_least` are left."""
    probe = "Καὶ ἐγένετο."

    def whole(sentence: str) -> bool:
        pieces = (sentence, f"{sentence} {probe}", f"{probe} {sentence}")
        return [len(split_sentences(t, "on", language)) for t in pieces] == [1, 2, 2]

    pool = [s for s in map(as_sentence, texts) if whole(s)]
    if len(pool) < at_least:
        raise RunFailed(f"only {len(pool)} of {len(texts)} texts are sentences the splitter cuts")
    return pool


def check_documents(draw: Draw, n: int = 200, seed: int = 0) -> None:
    """Draw `n` documents and check that the splitter cuts each into its sentences."""
    rng = random.Random(seed)
    for _ in range(n):
        sentences = draw.sentences(rng)
        text = draw.join(rng, sentences)
        got = len(split_sentences(text, "on", draw.language))
        if got != len(sentences):
            raise RunFailed(f"a document of {len(sentences)} sentences cuts into {got}: {text!r}")


def request(texts: list[str]) -> pb.TranslateRequest:
    options = pb.DecodingOptions(split_sentences="on", alignment=pb.ALIGNMENT_MODE_NONE)
    return pb.TranslateRequest(texts=texts, options=options)


# --- the clients ---------------------------------------------------------------------------------


def unary_kinds(role: str, draw: Draw) -> list[Kind]:
    """The ClosedLoop mix of a unary role; each kind's name is "role/sentences" (its count)."""

    def single(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        return Call(stub.Translate, request([rng.choice(draw.pool)]))

    def document(n: int) -> Callable[[random.Random, pb_grpc.TranslatorStub], Call]:
        def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
            return Call(stub.Translate, request([draw.join(rng, draw.sentences(rng, n))]))

        return make

    pending: dict[int, list[str]] = {}  # a user's document still to send, by its rng (one each)

    def walk(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        left = pending.setdefault(id(rng), [])
        if not left:
            left.extend(draw.sentences(rng))
        return Call(stub.Translate, request([left.pop(0)]))

    if role == "document":  # one kind per size, equal weights: a uniform draw of the size
        return [Kind(f"document/{n}", 1, document(n)) for n in range(draw.low, draw.high + 1)]
    return [Kind(f"{role}/1", 1, single if role == "single" else walk)]


class StreamUsers:
    """`users` threads, each with its own channel, sending documents on TranslateStream back to
    back until `stop()`; each answer's first message's time is kept, and a stream whose sentence
    messages or final spans do not number its sentences is a "WRONG_SENTENCES" answer."""

    def __init__(self, target: str, draw: Draw, users: int, seed: int, timeout_s: float) -> None:
        self.target, self.draw, self.seed, self.timeout_s = target, draw, seed, timeout_s
        self.answers: list[Answer] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.user, args=(i,), daemon=True)
                        for i in range(users)]  # fmt: skip

    def start(self) -> StreamUsers:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def user(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            while not self.stopping.is_set():
                answer = self.one(stub, rng)
                with self.lock:
                    self.answers.append(answer)

    def one(self, stub: pb_grpc.TranslatorStub, rng: random.Random) -> Answer:
        sentences = self.draw.sentences(rng)
        message = request([self.draw.join(rng, sentences)])
        n, first, chunks, spans = len(sentences), None, 0, -1
        code, details = "OK", ""
        started = time.monotonic()
        try:
            for reply in stub.TranslateStream(message, timeout=self.timeout_s):
                if first is None:
                    first = time.monotonic() - started
                if reply.WhichOneof("chunk") == "sentence":
                    chunks += not reply.sentence.partial  # a final sentence (not a settled part)
                else:
                    spans = len(reply.response.translations[0].sentence_spans)
        except grpc.RpcError as err:
            code, details = err.code().name, err.details() or ""  # type: ignore[attr-defined]
        seconds = time.monotonic() - started
        if code == "OK" and not chunks == spans == n:
            code, details = "WRONG_SENTENCES", f"{n} sent, {chunks} chunks, {spans} spans"
        return ("stream", n, started, seconds, first, code, details)


def client_process(
    target: str, draw: Draw, users: dict[str, int], seconds: float, seed: int, timeout_s: float,
    out: Any,
) -> None:  # fmt: skip
    """One process's share of the clients (`users`: role → clients): run them for `seconds`, send
    back every Answer. A document answered with another number of spans is "WRONG_SENTENCES"."""
    wrong: list[str] = []

    def keep(kind: str, sent: Any, answer: Any) -> None:
        n = int(kind.split("/")[1])
        got = len(answer.translations[0].sentence_spans)
        if kind.startswith("document/") and got != n:
            wrong.append(f"{kind}: {got} spans")

    # the same seed for B's document clients and C's walkers: both draw the same sizes' law
    loops = {role: ClosedLoop(target, unary_kinds(role, draw), n, timeout_s, seed * 10 + 1, keep=keep)
             for role, n in users.items() if n and role != "stream"}  # fmt: skip
    streams = StreamUsers(target, draw, users.get("stream", 0), seed * 10 + 1, timeout_s)
    for loop in loops.values():
        loop.start()
    streams.start()
    time.sleep(seconds)
    for loop in loops.values():
        loop.stop(timeout_s)
    streams.stop(timeout_s)
    answers: list[Answer] = list(streams.answers)
    for role, loop in loops.items():
        for o in loop.tally.snapshot()[1]:
            answers.append((role, int(o.kind.split("/")[1]), o.started, o.seconds, None, o.code,
                            o.details))  # fmt: skip
    if wrong:
        answers.append(("document", 0, 0.0, 0.0, None, "WRONG_SENTENCES", "; ".join(wrong[:3])))
    out.put(answers)


# --- one phase ------------------------------------------------------------------------------------


def shares(users: dict[str, int], processes: int) -> list[dict[str, int]]:
    """Each process's clients of each role (served.py's even split, role by role)."""
    return [
        {role: n // processes + (1 if i < n % processes else 0) for role, n in users.items()}
        for i in range(processes)
    ]


def phase_users(phase: str, args: argparse.Namespace) -> dict[str, int]:
    role = PHASES[phase]
    if role is None:
        return {"single": args.users}
    return {"single": args.users - args.document_users, role: args.document_users}


def window_metrics(before: str, after: str) -> dict[str, float | None]:
    """The server's per-sentence queue wait (ms), decoder batch size (sentences) and decoder step
    time (ms) between two scrapes: mean and p99 (bucket estimates) of each."""
    found: dict[str, float | None] = {}
    for name, key, scale in (("s2s_queue_wait_seconds", "queue_wait", 1000.0),
                             ("s2s_batch_sentences", "batch_sentences", 1.0),
                             ("s2s_decoder_step_duration_seconds", "decoder_step", 1000.0)):  # fmt: skip
        try:
            h = prom.subtract(prom.parse_histogram(after, name, {}),
                              prom.parse_histogram(before, name, {}))  # fmt: skip
        except ValueError:
            found[f"{key}_mean"] = found[f"{key}_p99"] = None
            continue
        found[f"{key}_mean"] = h.sum / h.count * scale if h.count else None
        found[f"{key}_p99"] = prom.histogram_quantile(0.99, h) * scale if h.count else None
    return found


def counter(text: str, name: str) -> float:
    """A counter's value (no labels) in a /metrics scrape; 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def served_rate(before: str, after: str, seconds: float) -> float:
    """Sentences the server translated per second between two scrapes: each sentence counted as
    it finishes decoding, so a document straddling the window's end counts the sentences it has
    done (the clients' count takes a document whole or not at all)."""
    name = "s2s_translated_sentences_total"
    return (counter(after, name) - counter(before, name)) / seconds


def scrape_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode("utf-8"))


def measure(server: LocalServer, draw: Draw, phase: str, args: argparse.Namespace) -> dict:
    """Run one phase's clients and return its figures (RunFailed on any error)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    running = args.warmup_s + args.seconds + args.cooldown_s
    workers = [
        context.Process(target=client_process,
                        args=(server.target, draw, share, running, i + 1, args.timeout_s, queue))
        for i, share in enumerate(shares(phase_users(phase, args), args.client_processes))
        if any(share.values())
    ]  # fmt: skip
    for w in workers:
        w.start()
    time.sleep(args.warmup_s)
    before, window_start = scrape_text(server.metrics_url), time.monotonic()
    time.sleep(args.seconds)
    after, window_end = scrape_text(server.metrics_url), time.monotonic()
    answers: list[Answer] = [a for _ in workers for a in queue.get(timeout=running + 300)]
    for w in workers:
        w.join()
    failed = [a for a in answers if a[5] != "OK"]
    if failed:
        codes = sorted({f"{a[5]}: {a[6][:200]}" for a in failed})
        raise RunFailed(f"phase {phase}: {len(failed)} of {len(answers)} requests failed: {codes}")
    row = figures(answers, window_start, window_end)
    row.update(window_metrics(before, after), phase=phase, clients=phase_users(phase, args))
    row["served_sentences_per_s"] = served_rate(before, after, window_end - window_start)
    return row


def percentiles(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}p50_ms": None, f"{prefix}p99_ms": None}
    return {f"{prefix}p50_ms": float(np.percentile(values, 50) * 1000),
            f"{prefix}p99_ms": float(np.percentile(values, 99) * 1000)}  # fmt: skip


def figures(answers: Sequence[Answer], start: float, end: float) -> dict[str, Any]:
    """Sentences/s of the answers that ended in [start, end]; per role, the latencies (and first
    messages) of the requests that started in it."""
    span = end - start
    ended = [a for a in answers if start <= a[2] + a[3] <= end]
    row: dict[str, Any] = {
        "window_s": round(span, 2),
        "sentences_per_s": sum(a[1] for a in ended) / span,
        "requests_per_s": len(ended) / span,
        "roles": {},
    }
    for role in ROLES:
        mine = [a for a in answers if a[0] == role and start <= a[2] < end]
        if not mine:
            continue
        got = {"requests": len(mine), "sentences_per_request": statistics.mean(a[1] for a in mine),
               "sentences_per_s": sum(a[1] for a in ended if a[0] == role) / span,
               **percentiles([a[3] for a in mine], "")}  # fmt: skip
        if role == "stream":
            got.update(percentiles([a[4] for a in mine if a[4] is not None], "first_"))
        row["roles"][role] = got
    return row


# --- the run --------------------------------------------------------------------------------------


def preflight(target: str, draw: Draw, timeout_s: float) -> dict[str, Any]:
    """The server's limits against the largest document, and one single, one document and one
    stream answered with their number of sentences; RunFailed where not."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        limits = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=timeout_s).limits
        longest = sum(sorted(map(len, draw.pool))[-draw.high :]) + draw.high - 1
        if draw.high > limits.max_sentences or longest > limits.max_document_chars:
            raise RunFailed(f"documents of up to {draw.high} sentences, {longest} characters, "
                            f"pass the server's limits: {limits}")  # fmt: skip
        rng = random.Random(7)
        sentences = draw.sentences(rng, draw.high)
        try:
            one = stub.Translate(request([draw.pool[0]]), timeout=timeout_s)
            doc = stub.Translate(request([draw.join(rng, sentences)]), timeout=timeout_s)
            streamed = StreamUsers(target, draw, 0, 1, timeout_s).one(stub, rng)
        except grpc.RpcError as err:
            raise RunFailed(f"preflight: {err.code().name}: {err.details()}") from err  # type: ignore[attr-defined]
    spans = len(doc.translations[0].sentence_spans)
    if spans != len(sentences) or streamed[5] != "OK":
        raise RunFailed(f"preflight: a document of {len(sentences)} sentences gave {spans} spans; "
                        f"the stream: {streamed[5]} {streamed[6]}")  # fmt: skip
    return {"max_sentences": limits.max_sentences, "max_document_chars": limits.max_document_chars,
            "longest_document_chars": longest, "single": one.translations[0].hypotheses[0].text,
            "document_spans": spans, "stream_first_s": streamed[4], "stream_s": streamed[3]}  # fmt: skip


def phase_order(rounds: int) -> list[list[str]]:
    """A B C D, then D C B A, and so on: no phase always first or last."""
    names = list(PHASES)
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    language = source_language(args.bundle)
    pool = sentence_pool(bundle_texts(args.bundle), language, args.max_sentences)
    draw = Draw(tuple(pool), language, args.min_sentences, args.max_sentences, args.newline_share)
    check_documents(draw)
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}  # as served.py
    flags = ["--log-level", "WARNING"]
    report: dict[str, Any] = {"bundle": str(args.bundle), "server_flags": flags,
                              "args": {k: str(v) for k, v in vars(args).items()},
                              "sentences_in_pool": len(pool), "rounds": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="documents-served-") as scratch:
        server = LocalServer.start(str(args.bundle.resolve()), "iteration", Path(scratch),
                                   args.start_timeout_s, extra=flags, env=env)  # fmt: skip
        try:
            report["preflight"] = preflight(server.target, draw, args.timeout_s)
            for r, order in enumerate(phase_order(args.rounds)):
                rows = {}
                for phase in order:
                    rows[phase] = measure(server, draw, phase, args)
                    print(f"round {r + 1} {phase}: {one_line(rows[phase])}", flush=True)
                report["rounds"].append(rows)
        except Exception as err:
            lines = server.log.read_text(errors="replace").splitlines()[-20:]
            raise RunFailed(
                f"{type(err).__name__}: {err}\nthe server's log ends:\n" + "\n".join(lines)
            ) from err
        finally:
            server.stop()
    report["summary"] = summary(report["rounds"])
    report["ratios"] = ratios(report["summary"])
    return report


def one_line(row: dict[str, Any]) -> str:
    roles = ", ".join(f"{role} p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} ms ({r['requests']})"
                      for role, r in row["roles"].items())  # fmt: skip
    rates = f"{row['served_sentences_per_s']:.1f} / {row['sentences_per_s']:.1f} sentences/s"
    return f"{rates} (server / clients); {roles}"


def summary(rounds: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Per phase, each figure's median over the rounds (flattened: "single.p99_ms")."""

    def flat(row: dict[str, Any]) -> dict[str, float]:
        out = {k: v for k, v in row.items() if isinstance(v, int | float) and v is not None}
        for role, got in row["roles"].items():
            out.update({f"{role}.{k}": v for k, v in got.items() if v is not None})
        return out

    found: dict[str, dict[str, float | None]] = {}
    for phase in PHASES:
        rows = [flat(r[phase]) for r in rounds if phase in r]
        keys = sorted({k for row in rows for k in row})
        found[phase] = {k: statistics.median([row[k] for row in rows if k in row]) for k in keys}
    return found


def ratios(s: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    # the server's count: the clients' takes a document whole or not at all at the window's edges
    b_c = over(s["B"].get("served_sentences_per_s"), s["C"].get("served_sentences_per_s"))
    p99 = over(s["B"].get("single.p99_ms"), s["A"].get("single.p99_ms"))
    first = over(s["D"].get("stream.first_p50_ms"), s["D"].get("stream.p50_ms"))
    return {
        "b_over_c_sentences_per_s": b_c, "b_over_c_floor": 1.0,
        "b_over_c_pass": b_c is not None and b_c >= 1.0,
        "b_over_a_singles_p99": p99, "b_over_a_singles_p99_ceiling": 1.5,
        "b_over_a_singles_p99_pass": p99 is not None and p99 <= 1.5,
        "d_first_over_whole_p50": first,
        "d_first_over_whole_p99": over(s["D"].get("stream.first_p99_ms"), s["D"].get("stream.p99_ms")),
    }  # fmt: skip


def table(report: dict[str, Any]) -> list[str]:
    def cell(phase: str, key: str, fmt: str = "{:.0f}") -> str:
        value = report["summary"][phase].get(key)
        return "-" if value is None else fmt.format(value)

    lines = ["| phase | sentences/s (server / clients) | singles p50 / p99 ms | others p50 / p99 ms | "
             "first message p50 / p99 ms | queue wait mean / p99 ms | batch sentences mean "
             "| decoder step mean ms |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for phase, role in PHASES.items():
        other = role or "single"
        lines.append(
            f"| {phase}: {TITLES[phase]} | {cell(phase, 'served_sentences_per_s', '{:.1f}')} / "
            f"{cell(phase, 'sentences_per_s', '{:.1f}')} "
            f"| {cell(phase, 'single.p50_ms')} / {cell(phase, 'single.p99_ms')} "
            f"| {cell(phase, f'{other}.p50_ms') if role else '-'} / "
            f"{cell(phase, f'{other}.p99_ms') if role else '-'} "
            f"| {cell(phase, 'stream.first_p50_ms')} / {cell(phase, 'stream.first_p99_ms')} "
            f"| {cell(phase, 'queue_wait_mean')} / {cell(phase, 'queue_wait_p99')} "
            f"| {cell(phase, 'batch_sentences_mean', '{:.1f}')} "
            f"| {cell(phase, 'decoder_step_mean', '{:.1f}')} |"
        )
    r = report["ratios"]

    def show(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines += [
        f"B ÷ C sentences/s: {show(r['b_over_c_sentences_per_s'])} (floor 1.0: "
        f"{'pass' if r['b_over_c_pass'] else 'MISSED'})",
        f"B ÷ A singles p99: {show(r['b_over_a_singles_p99'])} (ceiling 1.5: "
        f"{'pass' if r['b_over_a_singles_p99_pass'] else 'MISSED'})",
        f"D first message ÷ whole answer: p50 {show(r['d_first_over_whole_p50'])}, "
        f"p99 {show(r['d_first_over_whole_p99'])}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=REPO / "models" / "grc-en-nt-transformer")
    p.add_argument("--users", type=int, default=32, help="clients in every phase")
    p.add_argument("--document-users", type=int, default=8, help="of them, B-D's document clients")
    p.add_argument("--min-sentences", type=int, default=5)
    p.add_argument("--max-sentences", type=int, default=50)
    p.add_argument("--newline-share", type=float, default=0.2,
                   help="of a document's joins, those by a newline (else a space)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=20.0, help="each phase's measured window")
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--cooldown-s", type=float, default=5.0,
                   help="the clients' load past the window, so its last requests end under load")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=120.0, help="each request's deadline")
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if (
        not 0 < args.document_users < args.users
        or not 1 <= args.min_sentences <= args.max_sentences
    ):
        p.error("need 0 < --document-users < --users and 1 <= --min-sentences <= --max-sentences")
    report = run(args)
    print("\n".join(table(report)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
