"""Property-based fuzzing (hypothesis) of the gRPC API, the tokenizer and the beam search.

The API tests share one real server (the trained `models/default` bundle, in process, port 0) and
hold it to its contract on arbitrary input: every call ends OK or INVALID_ARGUMENT before its
deadline, INVALID_ARGUMENT exactly when the request breaks a limit the server advertises in
ModelInfo, an OK answer is well formed, and a known request sent right after still gets the answer
`Engine.translate` gives. Examples are derandomized and bounded (`max_examples`, `deadline`) so the
module stays short; `S2S_FUZZ_EXAMPLES=500 pytest tests/test_fuzz.py` explores more, at random.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loadtest.workload import COMMITTED_TSV, read_sources
from proto.translation.v1 import translation_pb2 as pb
from service.decode.engine.engine import Engine
from service.decode.search.beam import BeamSearch, SearchOptions
from service.decode.shared.rules import coverage_penalty, length_penalty
from service.decode.shared.search_types import Hypothesis, StepOutput
from service.decode.text.translation import Translation
from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from service.model.bundle import load_bundle
from service.model.tokenizer import Tokenizer
from tests.conftest import DEFAULT_BUNDLE
from tests.test_server import (
    Opts,
    ServerThread,
    assert_matches,
    base_args,
    is_idle,
    reference,
    requests_done,
    wait_for,
)

Code = grpc.StatusCode
CALL_TIMEOUT_S = 30.0  # each fuzzed call's gRPC deadline; a passing call takes well under 2 s
_EXAMPLES = os.environ.get("S2S_FUZZ_EXAMPLES")


def fuzz_settings(examples: int, deadline_s: float) -> settings:
    """Bounded, derandomized and without an example database (nothing written to the repo)."""
    return settings(
        max_examples=int(_EXAMPLES) if _EXAMPLES else examples,
        deadline=timedelta(seconds=deadline_s),
        derandomize=_EXAMPLES is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


SENTENCES = read_sources(COMMITTED_TSV)  # the load test's sentences: what the model was made for
CANARY = (
    ["forty-seven", "March 5, 2021"],
    Opts(beam=3, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD),
)


# --- the shared server -------------------------------------------------------------------------


@dataclass
class Served:
    server: ServerThread
    engine: Engine
    info: pb.ModelInfo
    canary: list[Translation]
    raw: grpc.UnaryUnaryMultiCallable  # Translate with the request as bytes, sent as they are


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = ServerThread.start(base_args(DEFAULT_BUNDLE))
    engine = cast(Engine, server.r.engine)  # the single-process server's: an engine
    info = server.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=CALL_TIMEOUT_S)
    raw = server.channel.unary_unary(  # type: ignore[union-attr]
        "/translation.v1.Translator/Translate",
        request_serializer=lambda data: data,
        response_deserializer=pb.TranslateResponse.FromString,
    )
    yield Served(server, engine, info, reference(engine, *CANARY), raw)
    server.close()


def call(
    served: Served, send: Callable[..., pb.TranslateResponse], request: Any
) -> tuple[grpc.StatusCode, pb.TranslateResponse | None, str]:
    """(code, response, details) of one call, which must end in time with OK or INVALID_ARGUMENT."""
    started = time.monotonic()
    try:
        response, code, details = send(request, timeout=CALL_TIMEOUT_S), Code.OK, ""
    except grpc.RpcError as err:
        response, code, details = None, err.code(), err.details()  # type: ignore[attr-defined]
    assert time.monotonic() - started < CALL_TIMEOUT_S
    assert code in (Code.OK, Code.INVALID_ARGUMENT), (code, details)
    if code == Code.INVALID_ARGUMENT:
        assert details, "INVALID_ARGUMENT must say what to change"
    return code, response, details


def still_serving(served: Served) -> None:
    """A known request right after gets the known answer; nothing failed inside the server."""
    texts, o = CANARY
    response = served.server.stub.Translate(o.request(texts), timeout=CALL_TIMEOUT_S)
    assert_matches(response, served.canary)
    assert requests_done(served.server.r, "INTERNAL") == 0


# --- the contract, from what the server advertises ----------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """A request's options with the server's defaults filled in (values as protobuf carries them)."""

    beam: int
    n_best: int
    max_length: int
    a: float
    b: int
    alpha: float
    beta: float
    alignment: int

    @classmethod
    def of(cls, o: pb.DecodingOptions, defaults: pb.DecodingOptions) -> Resolved:
        def pick(name: str) -> Any:
            return getattr(o if o.HasField(name) else defaults, name)

        return cls(
            pick("beam_size"),
            pick("n_best"),
            pick("max_length"),
            pick("max_length_a"),
            pick("max_length_b"),
            pick("length_penalty"),
            pick("coverage_penalty"),
            o.alignment,
        )

    def max_steps(self, src_len: int) -> int:
        return max(1, min(self.max_length, int(self.a * src_len + self.b)))


def should_be_valid(request: pb.TranslateRequest, info: pb.ModelInfo, engine: Engine) -> bool:
    """The request respects every limit in ModelInfo and the documented option ranges."""
    limits, texts, tok = info.limits, list(request.texts), engine.src_tok
    if not 1 <= len(texts) <= limits.max_texts:
        return False
    for text in texts:
        if not text.strip() or len(text) > limits.max_text_chars:
            return False
        if not 1 <= len(tok.encode(engine.normalize(text))) <= limits.max_source_tokens:
            return False
    r = Resolved.of(request.options, info.defaults)
    return (
        1 <= r.beam <= limits.max_beam_size
        and 1 <= r.n_best <= r.beam
        and 1 <= r.max_length <= limits.max_length
        and all(math.isfinite(v) and 0 <= v <= 100 for v in (r.a, r.alpha, r.beta))
        and abs(r.b) <= limits.max_length
        and r.alignment in pb.AlignmentMode.values()
    )


def check_response(
    served: Served, request: pb.TranslateRequest, response: pb.TranslateResponse
) -> None:
    """An OK answer: one translation per text, n-best sorted, lengths and alignments consistent."""
    r = Resolved.of(request.options, served.info.defaults)
    assert len(response.translations) == len(request.texts)
    if request.request_id:
        assert response.request_id == request.request_id
    assert response.model_version == served.info.version
    for text, t in zip(request.texts, response.translations, strict=True):
        # the engine's own preparation: the input rule applied, and a segmented input's pieces
        # with its separators' (service/model/segment.py)
        prepared = served.engine.prepare(text)
        assert list(t.source_tokens) == prepared.pieces
        assert 1 <= len(t.hypotheses) <= r.n_best
        # a segmented input: each segment within its own max_length, the separators between
        joined_bound = sum(r.max_steps(len(s.ids)) for s in prepared.segments) + sum(
            len(sep.target_pieces) for sep in prepared.separators
        )
        scores = [h.score for h in t.hypotheses]
        assert scores == sorted(scores, reverse=True)
        for h in t.hypotheses:
            steps = len(h.tokens) + (1 if h.finished else 0)
            if prepared.segments:
                assert len(h.tokens) <= joined_bound
            else:
                max_steps = r.max_steps(len(prepared.ids))
                assert steps <= max_steps and (h.finished or steps == max_steps)
            assert math.isfinite(h.score) and h.log_prob <= 1e-4
            if r.alignment in (pb.ALIGNMENT_MODE_UNSPECIFIED, pb.ALIGNMENT_MODE_NONE):
                assert not h.HasField("alignment")
                continue
            a = h.alignment
            assert (a.rows, a.cols) == (len(a.target_tokens), len(a.source_tokens))
            assert len(a.weights) == a.rows * a.cols
            weights = np.asarray(a.weights, np.float32).reshape(a.rows, a.cols)
            assert np.all(weights >= 0) and np.allclose(weights.sum(axis=1), 1.0, atol=1e-3)
            if r.alignment == pb.ALIGNMENT_MODE_SUBWORD:
                assert list(a.target_tokens) == list(h.tokens)


def check_translate(served: Served, request: pb.TranslateRequest) -> grpc.StatusCode:
    code, response, details = call(served, served.server.stub.Translate, request)
    expected = should_be_valid(request, served.info, served.engine)
    assert (code == Code.OK) == expected, (code, details)
    event(code.name)
    if response is not None:
        check_response(served, request, response)
    still_serving(served)
    return code


# --- strategies ----------------------------------------------------------------------------

UINT32_MAX, INT32_MIN, INT32_MAX = 2**32 - 1, -(2**31), 2**31 - 1


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """None (the field is left unset: the server's default) or a value."""
    return st.none() | strategy


def edges(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def any_float() -> st.SearchStrategy[float]:
    return (
        edges(0.0, -0.0, 100.0, 100.00001, 101.0, -1e-30, math.nan, math.inf, -math.inf, 3.4e38)
        | st.floats(-1.0, 2.0)
        | st.floats(width=32)
    )


def options(
    beam: st.SearchStrategy[int],
    max_length: st.SearchStrategy[int],
    alignment: st.SearchStrategy[int],
) -> st.SearchStrategy[pb.DecodingOptions]:
    @st.composite
    def build(draw: st.DrawFn) -> pb.DecodingOptions:
        o = pb.DecodingOptions(alignment=draw(alignment))  # type: ignore[arg-type]
        fields = {
            "beam_size": maybe(beam),
            "n_best": maybe(edges(0, 1, 2, 16, 17, UINT32_MAX) | st.integers(0, 6)),
            "max_length": maybe(max_length),
            "max_length_a": maybe(any_float()),
            "max_length_b": maybe(
                edges(INT32_MIN, -513, -512, 512, 513, INT32_MAX) | st.integers(-20, 20)
            ),
            "length_penalty": maybe(any_float()),
            "coverage_penalty": maybe(any_float()),
        }
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is not None:
                setattr(o, name, value)
        return o

    return build()


texts_of_the_domain = st.sampled_from(SENTENCES)
small_beam = edges(0, 1, 17, UINT32_MAX) | st.integers(1, 4)
short_output = edges(0, 1, 513, UINT32_MAX) | st.integers(1, 24)


# --- the gRPC API --------------------------------------------------------------------------


@fuzz_settings(examples=60, deadline_s=20)
@given(
    texts=st.lists(st.text(max_size=120) | texts_of_the_domain, max_size=4),
    o=maybe(options(small_beam, short_output, alignment=st.integers(0, 5))),
    request_id=st.text(max_size=40),
)
def test_arbitrary_unicode_gets_ok_or_invalid_argument(
    served: Served, texts: list[str], o: pb.DecodingOptions | None, request_id: str
) -> None:
    check_translate(served, pb.TranslateRequest(texts=texts, options=o, request_id=request_id))


@fuzz_settings(examples=50, deadline_s=30)
@given(
    texts=st.lists(texts_of_the_domain, min_size=1, max_size=2),
    o=options(
        edges(0, 1, 16, 17, UINT32_MAX) | st.integers(0, 18),
        edges(0, 1, 512, 513, UINT32_MAX) | st.integers(0, 40),
        st.integers(0, 4),
    ),
)
def test_every_option_at_and_beyond_its_limits(
    served: Served, texts: list[str], o: pb.DecodingOptions
) -> None:
    check_translate(served, pb.TranslateRequest(texts=texts, options=o))


@fuzz_settings(examples=15, deadline_s=20)
@given(n=st.integers(0, 8) | st.integers(62, 70), seed=st.integers(0, 2**16))
def test_many_texts(served: Served, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    texts = [SENTENCES[i] for i in rng.integers(0, len(SENTENCES), n)]
    o = pb.DecodingOptions(beam_size=1, max_length=4)
    code = check_translate(served, pb.TranslateRequest(texts=texts, options=o))
    assert (code == Code.OK) == (1 <= n <= served.info.limits.max_texts)


@fuzz_settings(examples=20, deadline_s=20)
@given(
    unit=st.sampled_from(["1 ", "ninety-seven ", "x", "😀", "é", " \u3000", "March 5, 2021, "])
    | st.text(min_size=1, max_size=8),
    chars=st.integers(1990, 2010) | st.integers(200, 1200),
)
def test_very_long_texts(served: Served, unit: str, chars: int) -> None:
    text = (unit * (chars // len(unit) + 1))[:chars]
    o = pb.DecodingOptions(beam_size=2, max_length=4)
    check_translate(served, pb.TranslateRequest(texts=[text, "seventy"], options=o))


@st.composite
def concurrent_calls(draw: st.DrawFn) -> tuple[list[str], Opts, float | None]:
    """One request of a concurrent burst: valid options, and now and then a deadline so short the
    request may be dropped while its batch mates decode."""
    beam = draw(st.sampled_from([1, 2, 5]))  # few beam sizes: requests share running batches
    o = Opts(
        beam=beam,
        n_best=draw(st.integers(1, beam)),
        max_length=draw(st.integers(1, 40)),
        a=draw(st.sampled_from([0.5, 1.5, 2.0])),
        b=draw(st.integers(-2, 8)),
        alpha=draw(st.sampled_from([0.0, 0.5, 1.0])),
        beta=draw(st.sampled_from([0.0, 0.25])),
        alignment=draw(st.integers(0, 3)),
    )
    texts = draw(st.lists(texts_of_the_domain, min_size=1, max_size=3))
    timeout = draw(st.none() | st.none() | st.none() | st.floats(0.001, 0.05))
    return texts, o, timeout


@fuzz_settings(examples=12, deadline_s=60)
@given(calls=st.lists(concurrent_calls(), min_size=2, max_size=8))
def test_concurrent_requests_each_get_their_own_answer(
    served: Served, calls: list[tuple[list[str], Opts, float | None]]
) -> None:
    """Requests with different options share running batches, join and leave them at different
    steps, some are dropped at their deadline: every answer is still the one it gets alone."""
    barrier = threading.Barrier(len(calls))

    def send(i: int) -> tuple[grpc.StatusCode, pb.TranslateResponse | None]:
        texts, o, timeout = calls[i]
        barrier.wait(CALL_TIMEOUT_S)
        try:
            response = served.server.stub.Translate(
                o.request(texts), timeout=timeout or CALL_TIMEOUT_S
            )
        except grpc.RpcError as err:
            return err.code(), None  # type: ignore[attr-defined]
        return Code.OK, response

    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(send, range(len(calls))))
    for (texts, o, timeout), (code, response) in zip(calls, answers, strict=True):
        if timeout is None:
            assert code == Code.OK
        else:
            assert code in (Code.OK, Code.DEADLINE_EXCEEDED), code
        if response is not None:
            assert_matches(response, reference(served.engine, texts, o))
    wait_for(lambda: is_idle(served.server.r), "the server to be idle")
    still_serving(served)


# --- raw bytes: unknown fields and malformed messages ------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # negative values as protobuf writes them (two's complement, 10 bytes)
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wire_field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One field: key (number << 3 | wire type) and its payload, already encoded for the type."""
    return varint(number << 3 | wire_type) + payload


@st.composite
def unknown_fields(draw: st.DrawFn, first_free: int) -> bytes:
    """Fields whose numbers the message does not declare, of every wire type but groups."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        number = draw(
            st.integers(first_free, 18_999) | st.integers(20_000, 2**29 - 1) | edges(2**29 - 1)
        )
        wire_type = draw(st.sampled_from([0, 1, 2, 5]))
        payload = {
            0: varint(draw(st.integers(-(2**63), 2**64 - 1))),
            1: draw(st.binary(min_size=8, max_size=8)),
            5: draw(st.binary(min_size=4, max_size=4)),
        }.get(wire_type)
        if payload is None:
            data = draw(st.binary(max_size=64))
            payload = varint(len(data)) + data
        out += wire_field(number, wire_type, payload)
    return out


@fuzz_settings(examples=30, deadline_s=20)
@given(
    text=texts_of_the_domain,
    top=unknown_fields(first_free=4),  # TranslateRequest declares 1..3
    inner=unknown_fields(first_free=9) | st.just(b""),  # DecodingOptions declares 1..8
    where=st.sampled_from(["end", "start", "middle"]),
)
def test_unknown_fields_are_ignored(
    served: Served, text: str, top: bytes, inner: bytes, where: str
) -> None:
    o = Opts(beam=2, max_length=12)
    options = o.to_pb().SerializeToString() + inner
    known = [wire_field(1, 2, varint(len(text.encode())) + text.encode())]
    known.append(wire_field(2, 2, varint(len(options)) + options))
    data = {
        "end": known[0] + known[1] + top,
        "start": top + known[0] + known[1],
        "middle": known[0] + top + known[1],
    }[where]
    code, response, details = call(served, served.raw, data)
    assert code == Code.OK, details
    assert response is not None
    assert_matches(response, reference(served.engine, [text], o))
    still_serving(served)


@fuzz_settings(examples=40, deadline_s=20)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_are_ok_or_invalid_argument(served: Served, data: bytes) -> None:
    code, response, _ = call(served, served.raw, data)
    try:
        request = pb.TranslateRequest.FromString(data)
    except Exception:  # not a TranslateRequest: refused as bad input
        assert code == Code.INVALID_ARGUMENT
    else:
        assert (code == Code.OK) == should_be_valid(request, served.info, served.engine)
        if response is not None:
            check_response(served, request, response)
    still_serving(served)


@pytest.mark.parametrize(
    "data",
    [
        wire_field(1, 2, varint(2) + b"\xc3\x28"),  # texts[0] is not UTF-8
        wire_field(1, 2, varint(10) + b"abc"),  # a length past the end
        wire_field(2, 2, varint(2) + b"\x08\xff"),  # options ending inside a varint
        wire_field(3, 2, varint(1) + b"\xff"),  # request_id is not UTF-8
        b"\xff\xff\xff\xff",  # not a key at all
    ],
    ids=["bad-utf8", "truncated", "bad-options", "bad-request-id", "garbage"],
)
def test_a_malformed_message_is_invalid_argument(served: Served, data: bytes) -> None:
    running = served.server.r
    before = requests_done(running, "INVALID_ARGUMENT")
    code, _, details = call(served, served.raw, data)
    assert (
        code == Code.INVALID_ARGUMENT and "not a valid translation.v1.TranslateRequest" in details
    )
    assert requests_done(running, "INVALID_ARGUMENT") == before + 1  # counted like any bad input
    still_serving(served)
    wait_for(lambda: is_idle(running), "the server to be idle")


# --- the tokenizer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def src_tok() -> Tokenizer:
    return Tokenizer.load(DEFAULT_BUNDLE / "source.model")


@pytest.fixture(scope="module")
def tgt_tok() -> Tokenizer:
    return Tokenizer.load(DEFAULT_BUNDLE / "target.model")


def known_alphabet(tok: Tokenizer) -> str:
    """The characters the model has pieces for and encodes without <unk>."""
    chars = {c for i in range(tok.vocab_size) for c in tok.pieces([i])[0] if c != "\u2581"}
    return "".join(sorted(c for c in chars if c.isprintable() and UNK_ID not in tok.encode(c)))


@fuzz_settings(examples=300, deadline_s=2)
@given(text=st.text(max_size=300))
def test_encode_never_fails_and_decode_is_stable(src_tok: Tokenizer, text: str) -> None:
    ids = src_tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < src_tok.vocab_size for i in ids)
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)  # special ids only ever come from the search
    assert len(src_tok.pieces(ids)) == len(ids)
    once = src_tok.decode(ids)
    twice = src_tok.decode(src_tok.encode(once))
    if UNK_ID in ids:  # <unk> decodes to " ⁇ ", whose spaces grow on the next round
        assert twice.split() == once.split()
    else:
        assert twice == once
    assert src_tok.encode(text) == ids  # deterministic


@fuzz_settings(examples=200, deadline_s=2)
@given(data=st.data())
def test_text_over_the_known_alphabet_round_trips(src_tok: Tokenizer, data: st.DataObject) -> None:
    text = data.draw(st.text(alphabet=known_alphabet(src_tok) + " \t\n", max_size=200))
    ids = src_tok.encode(text)
    assert UNK_ID not in ids
    assert src_tok.decode(ids) == " ".join(text.split())


@fuzz_settings(examples=200, deadline_s=2)
@given(data=st.data())
def test_any_id_the_decoder_can_emit_decodes(tgt_tok: Tokenizer, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, tgt_tok.vocab_size - 1), max_size=80))
    assert isinstance(tgt_tok.decode(ids), str)
    assert len(tgt_tok.pieces(ids)) == len(ids)


def test_the_target_tokenizer_covers_the_decoder_vocabulary(tgt_tok: Tokenizer) -> None:
    assert tgt_tok.vocab_size == load_bundle(DEFAULT_BUNDLE).architecture.tgt_vocab_size


# --- the beam search -------------------------------------------------------------------------

BOS, EOS = 0, 1


class RandomDecoder:
    """A `Decoder` whose outputs are random: normalized log-probs over the vocabulary, top-k cut at a
    random k' <= k each step, random attention. The distribution after a prefix is a fixed function
    of (seed, sentence, prefix), so the test can recompute every score and attention row afterwards.

    It also checks the search's contract on every call: each row continues its own sentence's state.
    """

    def __init__(self, seed: int, vocab: int) -> None:
        self.seed, self.vocab = seed, vocab
        self.rng = np.random.default_rng(seed)
        self.sentences: list[tuple[int, int]] = []  # encoder rows: (tag, src_len)
        self.states: list[tuple[int, tuple[int, ...]]] = []  # state buffer rows: (tag, prefix)

    def join(self, tag: int, src_len: int) -> int:
        self.sentences.append((tag, src_len))
        self.states.append((tag, ()))
        return len(self.states) - 1

    def dist(
        self, tag: int, src_len: int, prefix: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(log_probs (V,) float32 summing to 1 in probability, attention (src_len,) float32)."""
        rng = np.random.default_rng([self.seed, tag, src_len, len(prefix), *prefix])
        logits = rng.normal(size=self.vocab) * 2.0  # (V,)
        log_probs = logits - np.logaddexp.reduce(logits)  # (V,)
        energies = rng.normal(size=src_len) * 2.0  # (src_len,)
        attention = np.exp(energies) / np.exp(energies).sum()  # (src_len,)
        return log_probs.astype(np.float32), attention.astype(np.float32)

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        (N,) = tokens.shape
        B = len(self.sentences)
        assert B and N % B == 0 and reorder.shape == (N,) and 1 <= k <= self.vocab
        K = N // B
        S = max(src_len for _, src_len in self.sentences)
        width = int(self.rng.integers(1, k + 1))  # a random top-k at every step
        log_probs = np.zeros((N, width), np.float32)  # (N, k')
        token_ids = np.zeros((N, width), np.int64)  # (N, k')
        attention = np.zeros((N, S), np.float32)  # (N, S)
        states = []
        for n in range(N):
            tag, prefix = self.states[reorder[n]]
            own_tag, src_len = self.sentences[n // K]
            assert tag == own_tag, "a row continues another sentence's state"
            prefix = (*prefix, int(tokens[n]))
            lp, att = self.dist(tag, src_len, prefix)
            top = np.argsort(-lp, kind="stable")[:width]  # (k',)
            log_probs[n], token_ids[n], attention[n, :src_len] = lp[top], top, att
            states.append((tag, prefix))
        self.states = states
        return StepOutput(log_probs=log_probs, token_ids=token_ids, attention=attention)

    def keep_sentences(self, keep: np.ndarray) -> None:
        self.sentences = [self.sentences[b] for b in keep]


@dataclass(frozen=True)
class Joining:
    src_len: int
    options: SearchOptions
    at_step: int  # the step before which it joins the running batch


@st.composite
def search_options(draw: st.DrawFn, K: int) -> SearchOptions:
    beam = draw(st.integers(1, K))
    return SearchOptions(
        beam_size=beam,
        n_best=draw(st.integers(1, beam)),
        max_length_a=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        max_length_b=draw(st.integers(-2, 6)),
        max_length=draw(st.integers(1, 10)),
        length_penalty=draw(st.sampled_from([0.0, 0.6, 1.0, 2.0])),
        coverage_penalty=draw(st.sampled_from([0.0, 0.2, 1.0])),
        return_attention=draw(st.booleans()),
    )


def expected_scores(
    decoder: RandomDecoder, tag: int, src_len: int, hyp: Hypothesis, options: SearchOptions
) -> tuple[float, float, list[np.ndarray]]:
    """log P, the GNMT score and the attention rows of the tokens of `hyp`, recomputed."""
    path = [*hyp.tokens, EOS] if hyp.finished_by_eos else list(hyp.tokens)
    log_prob, rows = 0.0, []
    prefix: tuple[int, ...] = (BOS,)
    coverage = np.zeros(src_len, np.float32)  # (src_len,)
    for token in path:
        lp, att = decoder.dist(tag, src_len, prefix)
        log_prob += float(lp[token])
        coverage += att
        rows.append(att)
        prefix = (*prefix, token)
    score = log_prob / length_penalty(len(path), options.length_penalty) + coverage_penalty(
        coverage, options.coverage_penalty
    )
    return log_prob, score, rows[: len(hyp.tokens)]


@fuzz_settings(examples=150, deadline_s=5)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 9),
    K=st.integers(1, 5),
    data=st.data(),
)
def test_beam_search_invariants_over_random_step_functions(
    seed: int, vocab: int, K: int, data: st.DataObject
) -> None:
    joining = data.draw(
        st.lists(
            st.builds(Joining, st.integers(1, 6), search_options(K), st.integers(0, 4)),
            min_size=1,
            max_size=5,
        )
    )
    removed_tag = data.draw(st.none() | st.integers(0, len(joining) - 1))
    removed_at = data.draw(st.integers(0, 6))
    decoder = RandomDecoder(seed, vocab)
    search = BeamSearch(decoder, K, BOS, EOS, vocab_size=vocab)
    results: dict[int, list[Hypothesis]] = {}
    joined_at: dict[Hashable, int] = {}
    removed: set[int] = set()
    for step in range(64):
        for tag, j in enumerate(joining):
            if j.at_step == step:
                search.add(tag, j.src_len, j.options, state_row=decoder.join(tag, j.src_len))
                joined_at[tag] = step
        if step == removed_at and removed_tag is not None and removed_tag in search.sentence_ids:
            assert search.remove([removed_tag]) == [removed_tag]
            removed.add(removed_tag)
        for key, hyps in search.step():
            assert isinstance(key, int) and key not in results, "a sentence finished twice"
            # it decoded for at most its maximum length
            assert step - joined_at[key] < joining[key].options.max_len(joining[key].src_len)
            results[key] = hyps
        if search.is_empty and step >= max(j.at_step for j in joining):
            break
    assert search.is_empty, "the search did not end"
    assert set(results) | removed == set(range(len(joining))) and not set(results) & removed
    for tag, hyps in results.items():
        check_n_best(decoder, tag, joining[tag], hyps)


def check_n_best(decoder: RandomDecoder, tag: int, j: Joining, hyps: Sequence[Hypothesis]) -> None:
    o, max_len = j.options, j.options.max_len(j.src_len)
    assert 1 <= len(hyps) <= o.n_best
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True), "the n-best list is not sorted"
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps), "the n-best list repeats itself"
    for h in hyps:
        assert EOS not in h.tokens
        steps = len(h.tokens) + (1 if h.finished_by_eos else 0)
        assert steps <= max_len and (h.finished_by_eos or steps == max_len)
        log_prob, score, rows = expected_scores(decoder, tag, j.src_len, h, o)
        assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
        assert h.score == pytest.approx(score, abs=1e-3, rel=1e-4)
        if not o.return_attention:
            assert h.attention is None
            continue
        assert h.attention is not None and h.attention.shape == (len(h.tokens), j.src_len)
        if rows:
            np.testing.assert_allclose(h.attention, np.stack(rows), atol=1e-6)
