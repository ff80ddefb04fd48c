"""Documents (issue 66): a text cut into sentences answers as its sentences sent alone (texts,
scores, matrices) in both searches and both server layouts, its whitespace kept exactly; markup
across sentences, Align on documents, TranslateStream (its last message Translate's answer; a
cancelled stream frees its rows) and the limits."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc
from service.decode.engine.engine import Engine
from service.decode.requests import documents, in_process
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions, merge_options
from service.decode.text.translation import Translation
from service.model.sentences import split_sentences
from tests.conftest import REPO
from tests.test_http import call, port_of
from tests.test_server import ServerThread, base_args, metric, wait_for

TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"
RNN = REPO / "models" / "grc-en-nt"
SENTENCES = [
    "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.",
    "Οὗτος ἦν ἐν ἀρχῇ πρὸς τὸν θεόν.",
    "Πάντα δι᾽ αὐτοῦ ἐγένετο, καὶ χωρὶς αὐτοῦ ἐγένετο οὐδὲ ἕν ὃ γέγονεν.",
    "Ἐν αὐτῷ ζωὴ ἦν;",
]
# spaces before, one space, a blank line, CRLF and a tab, a newline after
DOCUMENT = f"  {SENTENCES[0]} {SENTENCES[1]}\n\n{SENTENCES[2]}\r\n\t{SENTENCES[3]}\n"


def options(engine: Engine, **values: Any) -> SearchOptions:
    """The model's defaults, then `values`."""
    return SearchOptions(
        **{**merge_options(SearchOptions().values(), engine.decoding_defaults), **values}
    )


def load(bundle: Path, search: str) -> Engine:
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search=search)
    return Engine.load(bundle, config)


@pytest.fixture(scope="module")
def transformer() -> Engine:
    return load(TRANSFORMER, "device")


def spans_of(text: str) -> list[tuple[int, int]]:
    return split_sentences(text, "on", "grc")


def assert_document_is_its_sentences(
    doc: Translation, alone: list[Translation], text: str, n_best: int
) -> None:
    """Each hypothesis of the document is its sentences' hypotheses of that rank, joined with the
    text's own whitespace; its matrix is theirs on the diagonal."""
    spans = spans_of(text)
    assert list(doc.sentence_spans) == spans
    assert doc.source_tokens == [t for a in alone for t in a.source_tokens]
    assert len(doc.hypotheses) == n_best
    for k, hyp in enumerate(doc.hypotheses):
        parts = [a.hypotheses[k] for a in alone]
        gaps = documents.gaps(text, spans)
        assert hyp.text == gaps[0] + "".join(
            p.text + g for p, g in zip(parts, gaps[1:], strict=True)
        )
        assert [hyp.text[a:b] for a, b in hyp.sentence_spans] == [p.text for p in parts]
        assert hyp.sentence_scores == pytest.approx([p.score for p in parts], abs=1e-6)
        assert hyp.score == pytest.approx(sum(p.score for p in parts), abs=1e-5)
        assert hyp.token_ids == [t for p in parts for t in p.token_ids]
        assert hyp.alignment is not None
        r = c = 0
        for p in parts:
            assert p.alignment is not None
            block = p.alignment.matrix
            t, s = block.shape
            np.testing.assert_allclose(hyp.alignment.matrix[r : r + t, c : c + s], block, atol=1e-6)
            assert not hyp.alignment.matrix[r : r + t, :c].any()
            assert not hyp.alignment.matrix[r : r + t, c + s :].any()
            r, c = r + t, c + s
        assert hyp.alignment.matrix.shape == (r, c)


@pytest.mark.parametrize(
    ("bundle", "search"), [(TRANSFORMER, "host"), (TRANSFORMER, "device"), (RNN, "device")]
)
def test_a_documents_sentences_answer_as_each_sent_alone(bundle: Path, search: str) -> None:
    engine = load(bundle, search)
    spans = spans_of(DOCUMENT)
    assert len(spans) == len(SENTENCES)
    alone = in_process.translate(
        engine, [DOCUMENT[a:b] for a, b in spans], options(engine, beam_size=4, n_best=2), "word"
    )
    [doc] = in_process.translate(
        engine, [DOCUMENT], options(engine, beam_size=4, n_best=2, split_sentences="on"), "word"
    )
    assert_document_is_its_sentences(doc, alone, DOCUMENT, 2)


def test_whitespace_and_newlines_round_trip_exactly(transformer: Engine) -> None:
    text = (
        "\n\n \t" + SENTENCES[1] + "\r\n\r\n   " + SENTENCES[3] + " \u2028" + SENTENCES[0] + "\t \n"
    )
    [doc] = in_process.translate(
        transformer, [text], options(transformer, split_sentences="on"), "none"
    )
    hyp = doc.hypotheses[0]
    source_gaps = documents.gaps(text, list(doc.sentence_spans))
    assert documents.gaps(hyp.text, list(hyp.sentence_spans)) == source_gaps
    assert len(doc.sentence_spans) == 3


def test_off_is_the_text_whole_and_nonewlines_keeps_a_line_break_inside(
    transformer: Engine,
) -> None:
    wrapped = "Ἐν ἀρχῇ ἦν ὁ λόγος,\nκαὶ ὁ λόγος ἦν πρὸς τὸν θεόν. " + SENTENCES[1]
    off = in_process.translate(
        transformer, [wrapped], options(transformer, split_sentences="off"), "none"
    )
    assert off[0].sentence_spans == ()
    plain = in_process.translate(transformer, [wrapped], options(transformer), "none")
    assert off[0].hypotheses[0].text == plain[0].hypotheses[0].text  # the embedded default: off
    [nonew] = in_process.translate(
        transformer, [wrapped], options(transformer, split_sentences="nonewlines"), "none"
    )
    [on] = in_process.translate(
        transformer, [wrapped], options(transformer, split_sentences="on"), "none"
    )
    assert len(nonew.sentence_spans) == 2 and "\n" in wrapped[slice(*nonew.sentence_spans[0])]
    assert len(on.sentence_spans) == 3


def test_a_tag_across_two_sentences_is_put_back(transformer: Engine) -> None:
    tagged = f"<b>{SENTENCES[0]} {SENTENCES[1]}</b>\n{SENTENCES[2]}"
    plain = f"{SENTENCES[0]} {SENTENCES[1]}\n{SENTENCES[2]}"
    on = options(transformer, split_sentences="on", markup="xml")
    [doc] = in_process.translate(transformer, [tagged], on, "none")
    [untagged] = in_process.translate(
        transformer, [plain], options(transformer, split_sentences="on"), "none"
    )
    hyp = doc.hypotheses[0]
    assert hyp.plain_text == untagged.hypotheses[0].text
    assert hyp.text.count("<b>") == 1 and hyp.text.count("</b>") == 1
    assert hyp.text.replace("<b>", "").replace("</b>", "") == hyp.plain_text
    assert "\n" in hyp.text  # the line break between the sentences kept


def test_the_memory_answers_the_sentence_it_knows(tmp_path: Path) -> None:
    """Looked up per sentence: the memory's entry answers its sentence inside a document, the
    model the others; the document's hypothesis is "mixed"."""
    engine = load(TRANSFORMER, "device")
    memory = tmp_path / "memory.tsv"
    memory.write_text(f"{SENTENCES[1]}\tHe was with God in the beginning.\n", encoding="utf-8")
    engine.user_memory = engine.read_memory(memory)
    [doc] = in_process.translate(
        engine, [f"{SENTENCES[3]} {SENTENCES[1]}"], options(engine, split_sentences="on"), "none"
    )
    [alone] = in_process.translate(engine, [SENTENCES[3]], options(engine), "none")
    hyp = doc.hypotheses[0]
    first, second = (hyp.text[a:b] for a, b in hyp.sentence_spans)
    assert second == "He was with God in the beginning."
    assert first == alone.hypotheses[0].text and alone.hypotheses[0].origin == "model"
    assert hyp.origin == "mixed"


def test_a_glossary_term_is_kept_in_its_sentence(transformer: Engine) -> None:
    """A glossary term in the second sentence is kept there, not in the first."""
    on = options(transformer, split_sentences="on", glossary=(("θεόν", "GOD"),))
    [doc] = in_process.translate(transformer, [f"{SENTENCES[3]} {SENTENCES[1]}"], on, "none")
    hyp = doc.hypotheses[0]
    a, b = hyp.sentence_spans[1]
    assert "GOD" in hyp.text[a:b]
    assert "GOD" not in hyp.text[: hyp.sentence_spans[0][1]]


def test_a_target_prefix_starts_the_documents_first_sentence(transformer: Engine) -> None:
    on = options(transformer, split_sentences="on", target_prefix=("Truly",))
    [doc] = in_process.translate(transformer, [f"{SENTENCES[1]} {SENTENCES[3]}"], on, "none")
    assert doc.hypotheses[0].text.startswith("Truly")
    [second] = in_process.translate(transformer, [SENTENCES[3]], options(transformer), "none")
    a, b = doc.hypotheses[0].sentence_spans[1]
    assert doc.hypotheses[0].text[a:b] == second.hypotheses[0].text


# --- served -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[ServerThread]:
    srv = ServerThread.start(
        [*base_args(TRANSFORMER), "--no-warmup", "--http-port", "0", "--max-sentences", "64",
         "--max-document-chars", "6000"]
    )  # fmt: skip
    yield srv
    srv.close()


def request(
    texts: list[str], alignment: pb.AlignmentMode = pb.ALIGNMENT_MODE_WORD, **values: Any
) -> pb.TranslateRequest:
    given = {"beam_size": 4, "n_best": 2, "split_sentences": "on", **values}
    return pb.TranslateRequest(
        texts=texts,
        options=pb.DecodingOptions(alignment=alignment, **given),
        request_id="doc-1",
    )


def test_the_server_answers_a_document_as_in_process(
    served: ServerThread, transformer: Engine
) -> None:
    response = served.stub.Translate(request([DOCUMENT, SENTENCES[1]]), timeout=120)
    want = in_process.translate(
        transformer, [DOCUMENT, SENTENCES[1]],
        options(transformer, beam_size=4, n_best=2, split_sentences="on"), "word",
    )  # fmt: skip
    for got, expected in zip(response.translations, want, strict=True):
        assert [h.text for h in got.hypotheses] == [h.text for h in expected.hypotheses]
        assert [(s.start, s.end) for s in got.sentence_spans] == list(expected.sentence_spans)
        for g, e in zip(got.hypotheses, expected.hypotheses, strict=True):
            assert [(s.start, s.end) for s in g.sentence_spans] == list(e.sentence_spans)
            assert list(g.sentence_confidences) == pytest.approx(e.sentence_confidences, rel=1e-5)
            assert g.alignment.rows * g.alignment.cols == len(g.alignment.weights)


def stream_messages(
    srv: ServerThread, req: pb.TranslateRequest
) -> list[pb.TranslateStreamResponse]:
    return list(srv.stub.TranslateStream(req, timeout=120))


def assert_partials_grow_into_their_sentence(
    chunks: list[pb.SentenceChunk], rows_are_tokens: bool = False
) -> int:
    """Each partial chunk comes after the sentence before its own is final and before its own
    final chunk; its tokens, text (and, `rows_are_tokens`: subword alignment, its rows) are the
    start of that final chunk's, and each extends the one before. Returns how many came."""
    partials = 0
    shown: tuple[list[str], str] | None = None  # the last partial of the sentence open now
    for k, chunk in enumerate(chunks):
        if not chunk.partial:
            shown = None
            continue
        partials += 1
        later = chunks[k + 1 :]
        final = next(c for c in later if not c.partial)
        assert (final.text_index, final.sentence_index) == (chunk.text_index, chunk.sentence_index)
        got, want = chunk.hypothesis, final.hypothesis
        n = len(got.tokens)
        # (a bare word-start piece shows "" while it ends the prefix: no word follows it yet)
        assert n > 0 and list(got.tokens)[:-1] == list(want.tokens)[: n - 1]
        assert got.tokens[-1] in (want.tokens[n - 1], "")
        assert want.text.startswith(got.text)
        assert list(got.token_log_probs) == pytest.approx(list(want.token_log_probs)[:n], abs=1e-5)
        if rows_are_tokens:
            cols = want.alignment.cols
            assert (got.alignment.rows, got.alignment.cols) == (n, cols)
            assert list(got.alignment.weights) == pytest.approx(
                list(want.alignment.weights)[: n * cols], abs=1e-6
            )
        if shown is not None:
            assert len(shown[0]) < n and got.text.startswith(shown[1])
        shown = (list(got.tokens), got.text)
    return partials


def test_the_streams_last_message_is_translates_answer(served: ServerThread) -> None:
    req = request([DOCUMENT, SENTENCES[0]])
    messages = stream_messages(served, req)
    whole = served.stub.Translate(req, timeout=120)
    assert messages[-1].HasField("response")
    assert messages[-1].response.SerializeToString() == whole.SerializeToString()
    assert all(m.HasField("sentence") for m in messages[:-1])
    assert assert_partials_grow_into_their_sentence([m.sentence for m in messages[:-1]]) > 0
    chunks = [m.sentence for m in messages[:-1] if not m.sentence.partial]
    assert [(c.text_index, c.sentence_index) for c in chunks] == [(0, k) for k in range(4)] + [
        (1, 0)
    ]
    best = whole.translations[0].hypotheses[0]
    shown = "".join(c.separator + c.hypothesis.text for c in chunks if c.text_index == 0)
    assert best.text.startswith(shown) and not best.text[len(shown) :].strip()
    assert [c.hypothesis.text for c in chunks[:4]] == [
        best.text[s.start : s.end] for s in best.sentence_spans
    ]
    assert (
        metric(served.r, "s2s_stream_first_chunk_seconds_count", model="grc-en-nt-transformer") >= 1
    )


@pytest.mark.parametrize("beam", [1, 5])
def test_partial_chunks_are_the_settled_prefix_of_each_sentence(
    served: ServerThread, beam: int
) -> None:
    """Before a sentence is final, the part of its best translation no later step can change
    comes, growing (greedy: a token a step), its subword alignment rows with it; the final chunks
    and the last message are what they are without them."""
    req = request([DOCUMENT], pb.ALIGNMENT_MODE_SUBWORD, beam_size=beam, n_best=1)
    messages = stream_messages(served, req)
    chunks = [m.sentence for m in messages[:-1]]
    partials = assert_partials_grow_into_their_sentence(chunks, rows_are_tokens=True)
    finals = [c for c in chunks if not c.partial]
    assert [c.sentence_index for c in finals] == [0, 1, 2, 3]
    assert partials > 0
    if beam == 1:  # every step settles its token: the first sentence, a chunk each time it grows
        firsts = [c for c in chunks if c.partial and c.sentence_index == 0]
        assert len(firsts) >= len(finals[0].hypothesis.text.split()) - 1
    whole = served.stub.Translate(req, timeout=120)
    assert messages[-1].response.SerializeToString() == whole.SerializeToString()


def test_the_client_cli_prints_a_stream_as_it_settles_and_ends_with_the_answer(
    served: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """s2s-client --stream writes each sentence's settled part, then its rest: what it printed
    in the end is the answer's text."""
    from service.cli.client import main as client_main

    text = f"{SENTENCES[0]} {SENTENCES[1]}\n\n{SENTENCES[2]}\n"  # (capsys reads "\r\n" as "\n")
    document = tmp_path / "doc.txt"
    document.write_text(text, encoding="utf-8")
    target = f"127.0.0.1:{served.r.port}"
    flags = ["--split-sentences", "on", "--beam-size", "1"]
    argv = ["--server", target, "--document", str(document), "--stream", *flags]
    assert client_main(argv) == 0
    printed = capsys.readouterr().out
    whole = served.stub.Translate(request([text], beam_size=1, n_best=1), timeout=120)
    assert printed == whole.translations[0].hypotheses[0].text + "\n"
    assert client_main([*argv, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(line.get("sentence", {}).get("partial") for line in lines)


def sse_events(port: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /v1/TranslateStream's events, each `data:` line read as JSON."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/TranslateStream",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as answer:
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        text = answer.read().decode()
    return [
        json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")
    ]


def test_server_sent_events_end_with_translates_answer(served: ServerThread) -> None:
    port = port_of(served)
    body = {"texts": [DOCUMENT], "options": {"split_sentences": "on", "beam_size": 3},
            "request_id": "sse-1"}  # fmt: skip
    events = sse_events(port, body)
    whole = call(port, "/v1/Translate", body)
    assert whole.status == 200
    finals = [e["sentence"] for e in events[:-1] if not e["sentence"].get("partial")]
    assert [f.get("sentence_index", 0) for f in finals] == [0, 1, 2, 3]
    assert events[-1]["response"] == whole.body
    refused = call(
        port,
        "/v1/TranslateStream",
        {"texts": [DOCUMENT], "options": {"split_sentences": "sometimes"}},
    )
    assert refused.status == 400 and "split_sentences" in refused.body["message"]


def test_a_cancelled_stream_frees_its_rows(served: ServerThread) -> None:
    long_one = " ".join([SENTENCES[2]] * 2)
    doc = " ".join(["Ναί."] + [long_one.replace(".", ",") + "."] * 25)
    running = served.r
    done_before = metric(running, "s2s_translated_sentences_total")
    cancelled = metric(running, "s2s_request_duration_seconds_count",
                       method="TranslateStream", code="CANCELLED", protocol="grpc")  # fmt: skip
    call_ = served.stub.TranslateStream(
        request([doc], pb.ALIGNMENT_MODE_NONE, beam_size=5, n_best=1), timeout=120
    )
    first = next(call_)
    assert first.sentence.sentence_index == 0
    call_.cancel()
    wait_for(
        lambda: metric(running, "s2s_request_duration_seconds_count", method="TranslateStream",
                       code="CANCELLED", protocol="grpc") == cancelled + 1,
        "the server to see the cancellation",
    )  # fmt: skip
    wait_for(
        lambda: (
            running.worker.queued_sentences == 0 and metric(running, "s2s_running_sentences") == 0
        ),
        "the stream's sentences to leave the batch",
    )
    assert metric(running, "s2s_translated_sentences_total") - done_before < 26


def test_an_over_long_document_and_too_many_sentences_are_refused(served: ServerThread) -> None:
    with pytest.raises(grpc.RpcError) as err:
        served.stub.Translate(request(["Ναί. " * 1300]), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "over the limit of 6000" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        served.stub.Translate(request(["Ναί. " * 70]), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "70 sentences, over the limit of 64" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:  # a whole text keeps the sentence-level limit
        served.stub.Translate(request(["Ναί " * 700], split_sentences="off"), timeout=60)
    assert "over the limit of 2000" in err.value.details()


def test_model_info_gives_the_limits_the_languages_and_the_default(served: ServerThread) -> None:
    info = served.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert info.limits.max_sentences == 64 and info.limits.max_document_chars == 6000
    assert info.defaults.split_sentences == "off"  # an embedded model's unit is a verse
    assert info.source_language == "grc"


def align_pb(response: pb.AlignResponse) -> list[tuple[list[str], str, list[float]]]:
    return [(list(a.source_words), a.pharaoh, list(a.word.weights)) for a in response.alignments]


def test_align_on_a_document_is_its_sentence_pairs_joined(served: ServerThread) -> None:
    source = f"{SENTENCES[0]}\n{SENTENCES[1]}"
    targets = ["In the beginning was the Word, and the Word was with God.", "He was with God."]
    target = "\n".join(targets)
    opts = pb.AlignOptions(alignment=pb.ALIGNMENT_MODE_WORD, split_sentences="on")
    whole = served.stub.Align(
        pb.AlignRequest(pairs=[pb.AlignPair(source=source, target=target)], options=opts),
        timeout=60,
    ).alignments[0]
    parts = served.stub.Align(
        pb.AlignRequest(
            pairs=[
                pb.AlignPair(source=s, target=t)
                for s, t in zip(SENTENCES[:2], targets, strict=True)
            ],
            options=opts,
        ),
        timeout=60,
    ).alignments
    assert list(whole.source_words) == source.split() and list(whole.target_words) == target.split()
    assert whole.log_prob == pytest.approx(sum(p.log_prob for p in parts), abs=1e-4)
    links = []
    shift_s = shift_t = 0
    for p in parts:
        links += [
            f"{int(s) + shift_s}-{int(t) + shift_t}"
            for s, t in (x.split("-") for x in p.pharaoh.split())
        ]
        shift_s, shift_t = shift_s + len(p.source_words), shift_t + len(p.target_words)
    assert whole.pharaoh == " ".join(links)
    matrix = np.array(whole.word.weights).reshape(whole.word.rows, whole.word.cols)
    first = parts[0].word
    np.testing.assert_allclose(
        matrix[: first.rows, : first.cols], np.array(first.weights).reshape(first.rows, first.cols)
    )
    assert not matrix[: first.rows, first.cols :].any()


def test_a_split_process_layout_answers_as_one_process(
    tmp_path: Path, served: ServerThread
) -> None:
    """A front process and an engine process: the same document answers, Translate and stream."""
    from loadtest.harness import LocalServer

    req = request([DOCUMENT])
    single = served.stub.Translate(req, timeout=120)
    flags = ["--fronts", "1", "--engines", "1", "--providers", "CPUExecutionProvider",
             "--intra-op-threads", "1", "--log-level", "WARNING"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    pod = LocalServer.start(str(TRANSFORMER), "iteration", tmp_path, 180, extra=flags, env=env)
    try:
        with grpc.insecure_channel(pod.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            split = stub.Translate(req, timeout=120)
            streamed = list(stub.TranslateStream(req, timeout=120))
            subword = request([DOCUMENT], pb.ALIGNMENT_MODE_SUBWORD, beam_size=5, n_best=1)
            chunks = [m.sentence for m in stub.TranslateStream(subword, timeout=120)][:-1]
    finally:
        assert pod.stop() == 0
    assert split.SerializeToString() == single.SerializeToString()
    assert streamed[-1].response.SerializeToString() == single.SerializeToString()
    assert assert_partials_grow_into_their_sentence(chunks, rows_are_tokens=True) > 0
