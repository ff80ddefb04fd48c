"""Glossaries (service/model/glossary.py, the engine's constraints, the server's --glossary-dir):
a request's terms and a model's standing ones kept in the translation, alone and batched, on every
face; the term's alignment on its source term; the limits in ModelInfo; refusals by name."""

from __future__ import annotations

import concurrent.futures
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from export import glossary as export_glossary
from proto.translation.v1 import translation_pb2 as pb
from service.cli import translate as translate_cli
from service.cli.client import TranslatorClient
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.model import glossary as gl
from service.model.bundle import BundleError, add_files
from tests.conftest import TinyModel
from tests.test_http import call, http, port_of  # noqa: F401  (the fixture)
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    base_args,
    bundle,
    engine,
    error_of,
    server,
    texts,
)

CPU = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)


def has(pieces: list[str], term: str) -> bool:
    """The term's target pieces in a row among a hypothesis's pieces (the guarantee: the tiny
    model's random weights may glue any piece to the term's word)."""
    want = TERMS[term]
    return any(pieces[i : i + len(want)] == want for i in range(len(pieces)))


TERMS = {"mille": ["▁mille"], "sept": ["▁sept"], "cent": ["▁cent"], "deux": ["▁deux"]}


def word_of(text: str) -> str:
    """A word of a text that is a term's source (its longest, punctuation aside)."""
    return max(text.split(), key=len).strip(",.")


# --- matching -------------------------------------------------------------------------------------


def test_terms_match_whole_words_in_a_row_the_longest_first() -> None:
    glossary = gl.Glossary(
        (gl.Term("new york", "New York"), gl.Term("new", "neuf"), gl.Term("e-mail", "courriel"))
    )
    found = glossary.find("a new house in new york, by e-mail or mail")
    assert [(m.term.target, m.start, m.end) for m in found] == [
        ("neuf", 2, 5),
        ("New York", 15, 23),
        ("courriel", 28, 34),
    ]
    assert glossary.find("newer york") == []


def test_a_glossary_file_is_read_as_a_memory_file_and_refused_naming_the_line(
    tmp_path: Path,
) -> None:
    good = tmp_path / "g.tsv"
    good.write_text("# terms\nNew York\tNew York\n\nmail\tcourriel\n", "utf-8")
    glossary = gl.read_glossary(good, str.lower, lambda _: None)
    assert [(t.source, t.target) for t in glossary.terms] == [
        ("new york", "New York"),
        ("mail", "courriel"),
    ]
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab\n", "utf-8")
    with pytest.raises(gl.GlossaryFileError, match=r"bad\.tsv:2: no tab"):
        gl.read_glossary(bad, str.lower, lambda _: None)


# --- the engine -----------------------------------------------------------------------------------


def test_a_requests_term_is_in_the_best_answer_and_in_every_ended_one(
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    options = SearchOptions(beam_size=4, n_best=3, max_length_b=12)
    for text in texts[:6]:
        term = (word_of(text), "mille")
        (got,) = engine.translate(
            [text], SearchOptions(**{**options.values(), "glossary": (term,)})
        )
        assert has(got.hypotheses[0].tokens, "mille"), got.hypotheses[0].text
        assert all(has(h.tokens, "mille") for h in got.hypotheses if h.finished)


def test_a_target_only_term_is_in_every_text_and_an_absent_source_changes_nothing(
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    base = SearchOptions(beam_size=3)
    got = engine.translate(texts[:3], SearchOptions(beam_size=3, glossary=(("", "sept"),)))
    assert all(has(t.hypotheses[0].tokens, "sept") for t in got)
    absent = SearchOptions(beam_size=3, glossary=(("zzzz", "sept"),))
    assert [t.hypotheses[0].text for t in engine.translate(texts[:3], absent)] == [
        t.hypotheses[0].text for t in engine.translate(texts[:3], base)
    ]


def test_a_term_comes_with_a_target_prefix(engine: Engine, texts: list[str]) -> None:  # noqa: F811
    options = SearchOptions(beam_size=3, target_prefix=("un",), glossary=(("", "mille"),))
    (got,) = engine.translate(texts[:1], options)
    assert got.hypotheses[0].text.startswith("un") and has(got.hypotheses[0].tokens, "mille")


def test_the_terms_alignment_rows_are_its_source_terms(engine: Engine, texts: list[str]) -> None:  # noqa: F811
    text = next(t for t in texts if len(t.split()) >= 2 and not engine.prepare(t).segments)
    source = text.split()[-1]
    options = SearchOptions(beam_size=3, glossary=((source, "mille"),))
    (got,) = engine.translate([text], options, "word")
    h = got.hypotheses[0]
    assert h.alignment is not None
    row = h.alignment.target_tokens.index("mille")
    column = h.alignment.source_tokens.index(source)
    np.testing.assert_allclose(h.alignment.matrix[row, column], 1.0, atol=1e-6)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"glossary": (("un", "日本"),)}, "glossary[0] ('un' → '日本'): the target term '日本' has characters the model's target vocabulary cannot spell"),
        ({"glossary": (("un", "mille"),), "sampling_topk": 5}, "a glossary cannot be combined with sampling (sampling_topk != 1)"),
        ({"glossary": (("un", "mille"),), "return_alternatives": 2}, "a glossary cannot be combined with return_alternatives"),
        ({"glossary": (("un", " ".join(["mille"] * 20)),)}, "is 20 target tokens long, over the limit of 16"),
        ({"glossary": tuple((f"w{i}", "mille") for i in range(40))}, "glossary has 40 terms, over the limit of 32"),
        ({"glossary": (("un", " "),)}, "glossary[0] ('un') has no target term"),
    ],
)  # fmt: skip
def test_terms_that_cannot_be_kept_are_refused_by_name(
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
    values: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ValueError) as err:  # InvalidInput, or the options' own check
        engine.translate(texts[:1], SearchOptions(beam_size=3, **values))
    assert message in str(err.value)


# --- the standing glossary ------------------------------------------------------------------------


def bundle_with_glossary(tiny: TinyModel, tmp_path: Path, lines: str) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, copy)
    entries = tmp_path / "terms.tsv"
    entries.write_text(lines, "utf-8")
    export_glossary.attach(copy, entries)
    return copy


def test_a_bundles_glossary_is_kept_and_a_request_can_switch_it_off(
    tiny: TinyModel, tmp_path: Path
) -> None:
    text = tiny.sources[2]
    path = bundle_with_glossary(tiny, tmp_path, f"{word_of(text)}\tmille\n")
    standing = Engine.load(path, CPU)
    assert len(standing.terms.glossary) == 1
    (on,) = standing.translate([text], SearchOptions(beam_size=3))
    assert has(on.hypotheses[0].tokens, "mille")
    (off,) = standing.translate([text], SearchOptions(beam_size=3, use_glossary=False))
    plain = Engine.load(tiny.bundle, CPU).translate([text], SearchOptions(beam_size=3))[0]
    assert off.hypotheses[0].text == plain.hypotheses[0].text
    # the request's term wins over the standing one with the same source
    mine = SearchOptions(beam_size=3, glossary=((word_of(text), "sept"),))
    assert has(standing.translate([text], mine)[0].hypotheses[0].tokens, "sept")


def test_a_bundle_glossary_that_does_not_parse_refuses_the_bundle(
    tiny: TinyModel, tmp_path: Path
) -> None:
    path = bundle_with_glossary(tiny, tmp_path, "un\tmille\n")
    (path / "glossary.tsv").write_text("un\t日本\n", "utf-8")
    add_files(path, ["glossary.tsv"])
    with pytest.raises(BundleError, match=r"glossary\.tsv:1: the target term '日本'"):
        Engine.load(path, CPU)


def test_the_servers_file_is_kept_reloaded_and_reported(tiny: TinyModel, tmp_path: Path) -> None:
    folder = tmp_path / "glossaries"
    folder.mkdir()
    name = json.loads((tiny.bundle / "manifest.json").read_text())["name"]
    text = tiny.sources[3]
    (folder / f"{name}.tsv").write_text(f"{word_of(text)}\tmille\n", "utf-8")
    srv = ServerThread.start(
        [*base_args(tiny.bundle), "--no-warmup", "--glossary-dir", str(folder)]
    )
    try:

        def ask(**options: Any) -> list[str]:
            request = pb.TranslateRequest(
                texts=[text], options=pb.DecodingOptions(beam_size=3, **options)
            )
            return list(
                srv.stub.Translate(request, timeout=30).translations[0].hypotheses[0].tokens
            )

        assert has(ask(), "mille")
        info = srv.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
        assert info.glossary_terms == 1
        assert (info.limits.max_glossary_terms, info.limits.max_term_tokens) == (32, 16)
        (folder / f"{name}.tsv").write_text(f"{word_of(text)}\tsept\n", "utf-8")
        srv.submit(srv.r.reload()).result(30)
        assert has(ask(), "sept")
        (folder / f"{name}.tsv").write_text("broken\n", "utf-8")  # kept: the terms in force
        srv.submit(srv.r.reload()).result(30)
        assert has(ask(), "sept")
        plain = Engine.load(tiny.bundle, CPU).translate([text], SearchOptions(beam_size=3))[0]
        assert ask(use_glossary=False) == plain.hypotheses[0].tokens
    finally:
        srv.close()


# --- the faces ------------------------------------------------------------------------------------


def test_grpc_http_the_client_and_the_cli_keep_a_term_as_the_engine(
    server: ServerThread,  # noqa: F811
    http: ServerThread,  # noqa: F811
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sent = texts[:3]
    term = (word_of(sent[0]), "mille")
    want = [
        t.hypotheses[0].text
        for t in engine.translate(sent, SearchOptions(beam_size=3, glossary=(term,)))
    ]
    message = pb.DecodingOptions(
        beam_size=3, glossary=[pb.GlossaryTerm(source=term[0], target="mille")]
    )
    got = server.stub.Translate(pb.TranslateRequest(texts=sent, options=message), timeout=30)
    assert [t.hypotheses[0].text for t in got.translations] == want
    with TranslatorClient(f"127.0.0.1:{server.r.port}") as client:
        answers = client.translate(sent, beam_size=3, glossary=[term])
    assert [a.best.text for a in answers] == want
    body = {
        "texts": sent,
        "options": {"beam_size": 3, "glossary": [{"source": term[0], "target": "mille"}]},
    }
    answer = call(port_of(http), "/v1/Translate", body)
    assert [t["hypotheses"][0]["text"] for t in answer.body["translations"]] == want
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(t + "\n" for t in sent)))
    argv = [
        "--bundle",
        str(engine.bundle.path),
        "--beam",
        "3",
        "--glossary",
        f"{term[0]} ||| mille",
    ]
    assert translate_cli.main([*argv, "--providers", "CPUExecutionProvider", "--threads", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == want


def test_requests_with_and_without_terms_share_the_batch_and_answer_as_alone(
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    def send(job: tuple[list[str], list[tuple[str, str]]]) -> list[str]:
        sent, terms = job
        message = pb.DecodingOptions(
            beam_size=3, glossary=[pb.GlossaryTerm(source=s, target=t) for s, t in terms]
        )
        response = server.stub.Translate(
            pb.TranslateRequest(texts=sent, options=message), timeout=30
        )
        return [t.hypotheses[0].text for t in response.translations]

    jobs = [
        (texts[:4], [(word_of(texts[0]), "mille")]),
        (texts[:4], []),
        (texts[2:6], [("", "sept"), (word_of(texts[3]), "cent")]),
        (texts, [("", "deux")]),
    ]
    alone = [send(j) for j in jobs]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(send, jobs * 2))
    assert together == alone * 2


def test_a_refused_term_is_invalid_argument_naming_it(
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    message = pb.DecodingOptions(glossary=[pb.GlossaryTerm(source="un", target="日本")])
    err = error_of(
        lambda: server.stub.Translate(
            pb.TranslateRequest(texts=texts[:1], options=message), timeout=30
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "glossary[0] ('un' → '日本')" in (err.details() or "")


# --- which terms a text kept, and why not -----------------------------------------------------


def three_words(engine: Engine, texts: list[str]) -> tuple[str, str, str]:  # noqa: F811
    """A text decoded whole (one sentence) and two terms over its first three words that overlap
    on the second."""
    text = next(t for t in texts if len(t.split()) >= 3 and not engine.prepare(t).segments)
    words = text.split()
    return text, " ".join(words[:2]), " ".join(words[1:3])


def test_each_text_says_which_terms_were_kept_and_which_not_and_why(
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    text, first, second = three_words(engine, texts)
    terms = ((first, "mille"), (second, "cent"), ("", "sept"), ("zzzz", "deux"))
    (got,) = engine.translate([text], SearchOptions(beam_size=3, glossary=terms))
    assert [(u.term.source, u.term.target, u.status, u.request_index) for u in got.glossary] == [
        (first, "mille", "kept", 0),
        (second, "cent", "overlapped", 1),  # the leftmost wins where two overlap
        ("", "sept", "kept", 2),  # a term without a source applies to every text
    ]  # ("zzzz" is in no text: it does not apply)
    assert got.glossary[1].kept_instead == gl.Term(first, "mille")
    assert has(got.hypotheses[0].tokens, "mille") and has(got.hypotheses[0].tokens, "sept")
    # a maximum length of one token cannot hold a term of two: the answer is cut before it
    options = SearchOptions(beam_size=3, max_length=1, glossary=((first, "mille sept"),))
    (cut,) = engine.translate([text], options)
    assert not cut.hypotheses[0].finished
    assert [(u.term.target, u.status) for u in cut.glossary] == [("mille sept", "cut")]
    # no terms, no report
    assert engine.translate([text], SearchOptions(beam_size=3))[0].glossary == ()


def test_the_standing_glossary_is_reported_as_the_models(tiny: TinyModel, tmp_path: Path) -> None:
    text = next(t for t in tiny.sources if len(t.split()) >= 3)
    words = text.split()
    first, second = " ".join(words[:2]), " ".join(words[1:3])
    path = bundle_with_glossary(tiny, tmp_path, f"{second}\tcent\n")
    standing = Engine.load(path, CPU)
    (got,) = standing.translate([text], SearchOptions(beam_size=3, glossary=((first, "mille"),)))
    assert [(u.term.target, u.status, u.request_index) for u in got.glossary] == [
        ("mille", "kept", 0),
        ("cent", "overlapped", None),  # the model's own term: no request index
    ]


@pytest.mark.parametrize("second", ["{}", "  {} "], ids=["same", "same-after-the-input-rule"])
def test_terms_with_the_same_source_in_one_request_are_refused_by_name(
    engine: Engine,  # noqa: F811
    server: ServerThread,  # noqa: F811
    texts: list[str],  # noqa: F811
    second: str,
) -> None:
    """Two terms for one source: a text could keep only one, silently. Refused, naming both."""
    source = word_of(texts[0])
    terms = ((source, "mille"), ("", "sept"), (second.format(source), "cent"))
    expected = (
        f"glossary[0] ({source!r} → 'mille') and glossary[2] ({second.format(source)!r} → 'cent') "
        "have the same source"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        engine.translate(texts[:1], SearchOptions(beam_size=3, glossary=terms))
    message = pb.DecodingOptions(glossary=[pb.GlossaryTerm(source=s, target=t) for s, t in terms])
    err = error_of(
        lambda: server.stub.Translate(
            pb.TranslateRequest(texts=texts[:1], options=message), timeout=30
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (err.details() or "")


def test_the_greek_model_refuses_two_targets_for_kai_and_reports_the_overlap() -> None:
    """The issue's requests to grc-en-nt, text "καὶ εἶπεν αὐτοῖς"."""
    from tests.conftest import REPO

    greek = Engine.load(REPO / "models" / "grc-en-nt", CPU)
    text = "καὶ εἶπεν αὐτοῖς"
    both = SearchOptions(beam_size=3, glossary=(("καὶ", "and"), ("καὶ", "also")))
    with pytest.raises(ValueError, match="glossary\\[0\\] \\('καὶ' → 'and'\\) and glossary\\[1\\]"):
        greek.translate([text], both)
    overlap = (("καὶ εἶπεν", "and said"), ("εἶπεν αὐτοῖς", "told them"))
    (got,) = greek.translate([text], SearchOptions(beam_size=3, glossary=overlap))
    assert [(u.term.source, u.status) for u in got.glossary] == [
        ("καὶ εἶπεν", "kept"),
        ("εἶπεν αὐτοῖς", "overlapped"),
    ]
    assert "and said" in got.hypotheses[0].text


def test_grpc_http_the_client_and_the_cli_report_the_terms(
    server: ServerThread,  # noqa: F811
    http: ServerThread,  # noqa: F811
    engine: Engine,  # noqa: F811
    texts: list[str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, first, second = three_words(engine, texts)
    terms = [(first, "mille"), (second, "cent")]
    message = pb.DecodingOptions(
        beam_size=3, glossary=[pb.GlossaryTerm(source=s, target=t) for s, t in terms]
    )
    got = server.stub.Translate(pb.TranslateRequest(texts=[text], options=message), timeout=30)
    kept, overlapped = got.translations[0].glossary
    assert (kept.term.source, kept.status, kept.request_index) == (first, pb.TERM_STATUS_KEPT, 0)
    assert kept.HasField("request_index") and not kept.HasField("kept_instead")
    assert (overlapped.status, overlapped.request_index) == (pb.TERM_STATUS_OVERLAPPED, 1)
    assert (overlapped.kept_instead.source, overlapped.kept_instead.target) == (first, "mille")
    body = {
        "texts": [text],
        "options": {"beam_size": 3, "glossary": [{"source": s, "target": t} for s, t in terms]},
    }
    answer = call(port_of(http), "/v1/Translate", body).body["translations"][0]["glossary"]
    assert answer == [
        {"term": {"source": first, "target": "mille"}, "status": "TERM_STATUS_KEPT",
         "request_index": 0},
        {"term": {"source": second, "target": "cent"}, "status": "TERM_STATUS_OVERLAPPED",
         "request_index": 1, "kept_instead": {"source": first, "target": "mille"}},
    ]  # fmt: skip
    with TranslatorClient(f"127.0.0.1:{server.r.port}") as client:
        (answered,) = client.translate([text], beam_size=3, glossary=terms)
    assert [(u.term.source, u.status, u.request_index) for u in answered.glossary] == [
        (first, "kept", 0),
        (second, "overlapped", 1),
    ]
    reported = [
        {"source": first, "target": "mille", "status": "kept", "request_index": 0},
        {"source": second, "target": "cent", "status": "overlapped", "request_index": 1,
         "kept_instead": {"source": first, "target": "mille"}},
    ]  # fmt: skip
    from service.cli.client import main as client_main

    flags = ["--glossary", f"{first} ||| mille", "--glossary", f"{second} ||| cent", "--json"]
    assert client_main(["--server", f"127.0.0.1:{server.r.port}", *flags, text]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["glossary"] == reported
    monkeypatch.setattr("sys.stdin", io.StringIO(text + "\n"))
    argv = ["--bundle", str(engine.bundle.path), "--beam", "3", *flags, "--threads", "1"]
    assert translate_cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["glossary"] == reported
