"""Forced alignment (Align): the teacher-forced pass's invariants on the tiny model, its agreement
with the beam search, its scheduling beside Translate, its errors, the CLI's file mode and /v1/Align.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import json_format

from benchmarks.alignment import align_modes
from export.metrics.aer import AlignmentCounts, score_sentence
from export.onnx.to_onnx import export_bundle
from export.train.checkpoint import save_checkpoint
from export.train.model import Seq2Seq
from proto.translation.v1 import translation_pb2 as pb
from service.cli import align as offline_align
from service.cli import client as client_cli
from service.decode.align.aligner import ForcedBatch, align
from service.decode.align.forced import AlignedPair, AlignOptions
from service.decode.align.links import LINK_MODES, extract_links, parse_pharaoh, to_pharaoh
from service.decode.align.pair_answers import ForcedRequest, prepare_pair
from service.decode.engine.engine import Engine
from service.decode.runtime.step_graph import decoder_graph
from service.decode.search.beam import SearchOptions
from service.decode.shared.alignment import word_index
from service.decode.shared.errors import InvalidInput
from service.decode.text.sides import Side
from service.model.architecture import ModelConfig
from service.serve.protocol import aligned_pair_from_pb
from service.serve.scheduler import BatchingConfig, BatchKey, Waiting, decide
from tests.conftest import TinyModel
from tests.test_http import call
from tests.test_server import ServerThread, base_args

# --- link modes, by hand ---------------------------------------------------------------------

# rows: target words t0..t2; columns: source words s0..s2
HAND = np.array(
    [
        [0.7, 0.2, 0.1],  # t0 → s0
        [0.1, 0.5, 0.4],  # t1 → s1
        [0.1, 0.45, 0.45],  # t2 → s1 (first of a tie)
    ],
    np.float32,
)


def test_link_modes_by_hand() -> None:
    assert extract_links(HAND, "argmax") == {(0, 0), (1, 1), (1, 2)}
    # columns: s0 → t0, s1 → t1, s2 → t2 (0.45 > 0.4)
    assert extract_links(HAND, "source_argmax") == {(0, 0), (1, 1), (2, 2)}
    assert extract_links(HAND, "intersect") == {(0, 0), (1, 1)}
    assert extract_links(HAND, "union") == {(0, 0), (1, 1), (1, 2), (2, 2)}
    # grow from the intersection: (1, 2) is next to (1, 1) while t2 is unaligned, then (2, 2)
    # next to (1, 2) while s2 is
    assert extract_links(HAND, "grow") == {(0, 0), (1, 1), (1, 2), (2, 2)}
    # t3's argmax link (0, 3) is in the union, next to no link, and s0 is aligned already: the
    # final-and step only adds links whose words are both unaligned
    far = np.array([[0.9, 0.1, 0.0], [0.1, 0.8, 0.1], [0.05, 0.05, 0.9], [0.6, 0.0, 0.4]])
    assert (0, 3) in extract_links(far, "union")
    assert extract_links(far, "grow") == {(0, 0), (1, 1), (2, 2)}
    assert extract_links(HAND, "threshold", 0.4) == {(0, 0), (1, 1), (2, 1), (1, 2), (2, 2)}
    assert to_pharaoh({(2, 1), (0, 0), (1, 1)}) == "0-0 1-1 2-1"
    assert parse_pharaoh("0-0 1-1 2-1") == {(0, 0), (1, 1), (2, 1)}
    with pytest.raises(ValueError, match="not a Pharaoh link"):
        parse_pharaoh("0-0 1:1")


def test_threshold_keeps_a_link_for_every_target_word() -> None:
    flat = np.full((2, 4), 0.25, np.float32)
    links = extract_links(flat, "threshold", 0.9)
    assert {t for _, t in links} == {0, 1}


# --- the engine's forced pass ----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny: TinyModel) -> Engine:
    return Engine.load(tiny.bundle)


@pytest.fixture(scope="module")
def pairs(tiny: TinyModel, engine: Engine) -> list[tuple[str, str]]:
    """Sources with targets of other lengths than the model would write (translations of other
    sentences): the pass must not depend on the model agreeing."""
    translations = engine.translate(tiny.sources[:12], SearchOptions(beam_size=1, max_length=12))
    targets = [t.hypotheses[0].text or "un" for t in translations]
    return [(s, targets[(i + 3) % len(targets)]) for i, s in enumerate(tiny.sources[:12])]


def check_invariants(result: AlignedPair) -> None:
    assert result.subword is not None and result.word is not None
    T, S = len(result.target_tokens), len(result.source_tokens)
    assert result.subword.matrix.shape == (T, S)
    np.testing.assert_allclose(result.subword.matrix.sum(axis=1), 1.0, atol=1e-5)
    T_w, S_w = len(result.target_words), len(result.source_words)
    assert result.word.matrix.shape == (T_w, S_w)
    np.testing.assert_allclose(result.word.matrix.sum(axis=1), 1.0, atol=1e-5)
    links = parse_pharaoh(result.pharaoh)
    assert links and all(0 <= s < S_w and 0 <= t < T_w for s, t in links)
    assert len(result.token_log_probs) == T
    assert all(lp <= 0 for lp in [*result.token_log_probs, result.eos_log_prob])
    total = math.fsum(result.token_log_probs) + result.eos_log_prob
    assert result.log_prob == pytest.approx(total, abs=1e-9)
    assert result.confidence == pytest.approx(math.exp(result.log_prob / (T + 1)))


def test_invariants(engine: Engine, pairs: list[tuple[str, str]]) -> None:
    results = align(engine, pairs)
    assert len(results) == len(pairs)
    for (source, target), result in zip(pairs, results, strict=True):
        check_invariants(result)
        assert result.source_words == source.split()
        assert result.target_words == target.split()


def test_every_link_mode_stays_inside_the_sentence(
    engine: Engine, pairs: list[tuple[str, str]]
) -> None:
    for mode in LINK_MODES:
        if mode == "head":  # the tiny model has no link head: tests/test_link_head.py
            continue
        for (source, target), result in zip(
            pairs, align(engine, pairs, AlignOptions(links=mode)), strict=True
        ):
            links = parse_pharaoh(result.pharaoh)
            assert all(s < len(source.split()) and t < len(target.split()) for s, t in links)


def test_alone_equals_batched(engine: Engine, pairs: list[tuple[str, str]]) -> None:
    together = align(engine, pairs)
    for pair, batched in zip(pairs, together, strict=True):
        (alone,) = align(engine, [pair])
        assert alone.pharaoh == batched.pharaoh
        assert alone.log_prob == pytest.approx(batched.log_prob, abs=1e-4)
        assert alone.subword is not None and batched.subword is not None
        np.testing.assert_allclose(alone.subword.matrix, batched.subword.matrix, atol=1e-5)


def test_pairs_joining_mid_batch_equal_alone(engine: Engine, pairs: list[tuple[str, str]]) -> None:
    """Pairs join a running forced batch between steps (as the worker admits them) and others
    leave: each answer is still its own."""
    prepared = [prepare_pair(engine, s, t) for s, t in pairs]
    batch: ForcedBatch[int] = ForcedBatch(engine)
    results: dict[int, AlignedPair] = {}
    options = AlignOptions()
    for i, prepared_pair in enumerate(prepared):
        batch.add([ForcedRequest(i, prepared_pair, options)])
        results.update(batch.step())
    while len(batch):
        results.update(batch.step())
    for i, pair in enumerate(pairs):
        (alone,) = align(engine, [pair])
        assert results[i].log_prob == pytest.approx(alone.log_prob, abs=1e-4)


def forced_ids(engine: Engine, source: str, target_ids: list[int]) -> AlignedPair:
    """Teacher-force these target ids (not a text: a random model's output need not tokenize
    back to itself) after `source`."""
    pair = prepare_pair(engine, source, "x")
    pieces = engine.tgt_tok.pieces(target_ids)
    word_of = word_index(pieces)
    words = [str(w) for w in range(int(word_of.max()) + 1)] if len(word_of) else []
    tgt = Side(words=words, ids=target_ids, pieces=pieces, word_of=word_of, unknown=[])
    batch: ForcedBatch[int] = ForcedBatch(engine)
    batch.add([ForcedRequest(0, replace(pair, tgt=tgt), AlignOptions())])
    results: dict[int, AlignedPair] = {}
    while len(batch):
        results.update(batch.step())
    return results[0]


def test_forced_score_equals_the_beam_searchs(engine: Engine, tiny: TinyModel) -> None:
    """Teacher-forcing the model's own best output gives the search's log-prob and attention."""
    sources = [s for s in tiny.sources[:16] if not engine.prepare(s).segments]
    translations = engine.translate(
        sources, SearchOptions(beam_size=4, max_length=30), alignment="subword"
    )
    compared = 0
    for source, t in zip(sources, translations, strict=True):
        best = t.hypotheses[0]
        if not best.token_ids:
            continue
        forced = forced_ids(engine, source, best.token_ids)
        # the search's log-prob counts EOS only when the hypothesis ended with it
        want = forced.log_prob if best.finished else math.fsum(forced.token_log_probs)
        assert want == pytest.approx(best.log_prob, abs=1e-4)
        assert forced.subword is not None and best.alignment is not None
        np.testing.assert_allclose(forced.subword.matrix, best.alignment.matrix, atol=1e-5)
        compared += 1
    assert compared >= 8


def test_the_topk_fallback_equals_the_exposed_log_softmax(
    engine: Engine, pairs: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph whose log-softmax cannot be exposed aligns through its TopK asked for every token:
    the same answers."""
    assert engine.model.forced_session() is not None  # the exposed row, for the bundles we export
    exposed = align(engine, pairs[:4])
    monkeypatch.setattr(engine.model, "forced_session", lambda: None)
    fallback = align(engine, pairs[:4])
    for a, b in zip(exposed, fallback, strict=True):
        assert a.token_log_probs == pytest.approx(b.token_log_probs, abs=1e-5)
        assert a.pharaoh == b.pharaoh


def test_the_int8_decoder_exposes_its_log_softmax(tiny: TinyModel) -> None:
    graph, _ = decoder_graph(tiny.bundle / "decoder.int8.onnx", full_log_probs=True)
    assert graph is not None


def test_unknown_characters_are_flagged_not_refused(engine: Engine) -> None:
    (result,) = align(engine, [("one ☃ two", "un ☃ deux")])
    assert 1 in result.unknown_source_words and 1 in result.unknown_target_words
    assert result.unknown_source_tokens and result.unknown_target_tokens
    check_invariants(result)


def test_bad_pairs_name_the_pair(engine: Engine, tiny: TinyModel) -> None:
    with pytest.raises(InvalidInput, match=r"pairs\[1\]: target is empty"):
        align(engine, [("one", "un"), ("two", "  ")])
    long_source = " ".join(["seventy"] * 400)
    with pytest.raises(InvalidInput, match=r"pairs\[0\]: source is \d+ subword tokens"):
        align(engine, [(long_source, "un")])
    with pytest.raises(InvalidInput, match="links must be one of"):
        align(engine, [("one", "un")], AlignOptions(links="diagonal"))


@pytest.fixture(scope="module")
def no_attention_bundle(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("none")
    torch.manual_seed(0)
    cfg = ModelConfig(
        src_vocab_size=tiny.src_tok.vocab_size,
        tgt_vocab_size=tiny.tgt_tok.vocab_size,
        emb_dim=16,
        enc_hidden=16,
        dec_hidden=32,
        attn_dim=16,
        attention="none",
    )
    checkpoint = root / "none.pt"
    save_checkpoint(checkpoint, Seq2Seq(cfg).eval())
    for name in ("source.model", "target.model"):
        (root / name).write_bytes((tiny.bundle / name).read_bytes())
    return export_bundle(checkpoint, root, root / "bundle", name="none", version="0.0.1")


def test_a_model_without_attention_cannot_align(no_attention_bundle: Path) -> None:
    with pytest.raises(InvalidInput, match="no attention"):
        align(Engine.load(no_attention_bundle), [("one", "un")])


# --- served: gRPC, HTTP, the CLI -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny: TinyModel, engine: Engine) -> Iterator[ServerThread]:
    srv = ServerThread.start([*base_args(tiny.bundle), "--no-warmup", "--http-port", "0"], engine)
    yield srv
    srv.close()


def grpc_align(
    srv: ServerThread, pairs: list[tuple[str, str]], **options: object
) -> list[AlignedPair]:
    request = pb.AlignRequest(
        pairs=[pb.AlignPair(source=s, target=t) for s, t in pairs],
        options=pb.AlignOptions(**options),  # type: ignore[arg-type]
    )
    response = srv.stub.Align(request, timeout=30)
    return [aligned_pair_from_pb(a) for a in response.alignments]


def test_served_equals_the_engine_while_translations_run(
    server: ServerThread, engine: Engine, tiny: TinyModel, pairs: list[tuple[str, str]]
) -> None:
    """Align requests share the decode loop with Translate requests decoding at the same time,
    and answer as the engine does alone."""
    expected = align(engine, pairs)
    translate = pb.TranslateRequest(
        texts=tiny.sources[:24], options=pb.DecodingOptions(beam_size=4)
    )
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        translating = [pool.submit(server.stub.Translate, translate, timeout=60) for _ in range(3)]
        aligning = [pool.submit(grpc_align, server, [pair]) for pair in pairs]
        answers = [f.result()[0] for f in aligning]
        assert all(len(f.result().translations) == 24 for f in translating)
    for got, want in zip(answers, expected, strict=True):
        assert got.pharaoh == want.pharaoh
        assert got.log_prob == pytest.approx(want.log_prob, abs=1e-4)
        assert got.word is not None and want.word is not None
        np.testing.assert_allclose(got.word.matrix, want.word.matrix, atol=1e-5)


def test_served_options_and_matrices(server: ServerThread, pairs: list[tuple[str, str]]) -> None:
    (bare,) = grpc_align(server, pairs[:1], alignment=pb.ALIGNMENT_MODE_NONE)
    assert bare.subword is None and bare.word is None and bare.pharaoh
    (word,) = grpc_align(
        server, pairs[:1], alignment=pb.ALIGNMENT_MODE_WORD, links=pb.LINK_MODE_ARGMAX
    )
    assert word.subword is None and word.word is not None
    assert word.pharaoh == to_pharaoh(extract_links(word.word.matrix, "argmax"))


@pytest.mark.parametrize(
    ("pairs_sent", "code", "words"),
    [
        (
            [("one", "un"), ("", "deux")],
            grpc.StatusCode.INVALID_ARGUMENT,
            "pairs[1].source is empty",
        ),
        ([("one", "un " * 600)], grpc.StatusCode.INVALID_ARGUMENT, "pairs[0]: target is"),
        ([], grpc.StatusCode.INVALID_ARGUMENT, "pairs is empty"),
    ],
)
def test_served_errors_name_the_pair(
    server: ServerThread, pairs_sent: list[tuple[str, str]], code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        grpc_align(server, pairs_sent)
    assert err.value.code() == code
    assert words in err.value.details()


def test_served_model_without_attention(no_attention_bundle: Path) -> None:
    srv = ServerThread.start([*base_args(no_attention_bundle), "--no-warmup"])
    try:
        with pytest.raises(grpc.RpcError) as err:
            grpc_align(srv, [("one", "un")])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no attention" in err.value.details()
    finally:
        srv.close()


def test_queue_full_is_resource_exhausted(tiny: TinyModel, engine: Engine) -> None:
    srv = ServerThread.start(
        [*base_args(tiny.bundle), "--no-warmup", "--max-queue-sentences", "2"], engine
    )
    try:
        with pytest.raises(grpc.RpcError) as err:
            grpc_align(srv, [("one", "un")] * 3)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        srv.close()


def test_http_align_equals_grpc(server: ServerThread, pairs: list[tuple[str, str]]) -> None:
    port = server.r.http_port
    assert port is not None
    body = {"pairs": [{"source": s, "target": t} for s, t in pairs[:3]]}
    answer = call(port, "/v1/Align", body)
    assert answer.status == 200, answer.body
    message = json_format.ParseDict(answer.body, pb.AlignResponse())
    via_http = [aligned_pair_from_pb(a) for a in message.alignments]
    via_grpc = grpc_align(server, pairs[:3])
    assert [a.pharaoh for a in via_http] == [a.pharaoh for a in via_grpc]
    bad = call(port, "/v1/Align", {"pairs": [{"source": "one", "target": ""}]})
    assert bad.status == 400 and bad.body["code"] == "INVALID_ARGUMENT"
    assert "pairs[0].target" in bad.body["message"]


def test_cli_file_mode(
    server: ServerThread,
    pairs: list[tuple[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One Pharaoh line per pair, like fast_align; an empty line for a pair with an empty side."""
    sources = [s for s, _ in pairs] + [""]
    targets = [t for _, t in pairs] + ["un"]
    (tmp_path / "src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    out = tmp_path / "links"
    argv = [
        "--server", f"127.0.0.1:{server.r.port}", "--source-file", str(tmp_path / "src"),
        "--target-file", str(tmp_path / "tgt"), "--out", str(out), "--batch", "5",
    ]  # fmt: skip
    assert client_cli.main(argv) == 0
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(pairs) + 1 and lines[-1] == ""
    assert lines[:-1] == [a.pharaoh for a in grpc_align(server, pairs)]
    assert "1 pairs with an empty side" in capsys.readouterr().err
    (tmp_path / "short").write_text("one\n", encoding="utf-8")
    argv[5] = str(tmp_path / "short")
    assert client_cli.main(argv) == 1
    assert "lines" in capsys.readouterr().err


def test_cli_align_pairs(
    server: ServerThread, pairs: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = pairs[0]
    argv = ["--server", f"127.0.0.1:{server.r.port}", "--align-pairs", f"{source} ||| {target}"]
    assert client_cli.main(argv) == 0
    first = capsys.readouterr().out.split("\n")[0]
    log_prob, links = first.split("\t")
    (want,) = grpc_align(server, [pairs[0]])
    assert links == want.pharaoh and float(log_prob) == pytest.approx(want.log_prob, abs=1e-3)


def test_align_metrics_method_label(server: ServerThread, pairs: list[tuple[str, str]]) -> None:
    grpc_align(server, pairs[:1])
    registry = server.r.metrics.registry
    count = registry.get_sample_value(
        "s2s_request_duration_seconds_count",
        {"method": "Align", "code": "OK", "protocol": "grpc"},
    )
    assert count is not None and count >= 1


def test_offline_align_files(
    tiny: TinyModel,
    pairs: list[tuple[str, str]],
    engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """s2s-align (no server): the same links as the engine, line for line; an empty line for a
    pair with an empty side; a line over the limits named by its line number."""
    sources = [s for s, _ in pairs] + ["one"]
    targets = [t for _, t in pairs] + [" "]
    (tmp_path / "src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    out = tmp_path / "links"
    argv = [
        "--bundle", str(tiny.bundle), "--source-file", str(tmp_path / "src"),
        "--target-file", str(tmp_path / "tgt"), "--out", str(out), "--batch-size", "4",
        "--providers", "CPUExecutionProvider", "--scores",
    ]  # fmt: skip
    assert offline_align.main(argv) == 0
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    want = align(engine, pairs)
    assert lines[-1] == "" and len(lines) == len(pairs) + 1
    for line, a in zip(lines[:-1], want, strict=True):
        log_prob, links = line.split("\t")
        assert links == a.pharaoh and float(log_prob) == pytest.approx(a.log_prob, abs=1e-3)
    (tmp_path / "src").write_text("one\n" + " ".join(["seventy"] * 300) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("un\nsoixante-dix\n", encoding="utf-8")
    assert offline_align.main([*argv, "--max-source-tokens", "50"]) == 1
    assert "line 2: source is" in capsys.readouterr().err


def test_a_passed_deadline_is_deadline_exceeded(
    server: ServerThread, pairs: list[tuple[str, str]]
) -> None:
    request = pb.AlignRequest(pairs=[pb.AlignPair(source=s, target=t) for s, t in pairs * 5])
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Align(request, timeout=0.001)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the loop is still serving: the next request is answered
    assert grpc_align(server, pairs[:1])[0].pharaoh


def test_forced_pairs_get_their_own_batch_and_take_turns() -> None:
    """The scheduler keeps Align's pairs out of the beam searches' batches (another pass over the
    decoder) and steps the two in turn, under one capacity."""
    config = BatchingConfig(max_batch_hypotheses=12, max_batch_sentences=8)
    waiting = [
        Waiting(("t", 0), "translate", 4, 0.0, model="m"),
        Waiting(("a", 0), "align", 1, 0.0, model="m", forced=True),
    ]
    first = decide(config, 0.0, waiting, {})
    assert first.admit == (("t", 0),) and first.admit_batch == BatchKey("m", 4)
    running = {BatchKey("m", 4): 1}
    second = decide(config, 0.0, waiting[1:], running, first.step_batch, None, "m")
    assert second.admit == (("a", 0),) and second.admit_batch == BatchKey("m", 1, forced=True)
    running[BatchKey("m", 1, forced=True)] = 1
    stepped = [second.step_batch]
    for _ in range(3):
        stepped.append(decide(config, 0.0, [], running, stepped[-1]).step_batch)
    assert set(stepped[:2]) == set(running) and stepped[2] == stepped[0]
    # capacity is shared: 2 beam-4 sentences (8 hypotheses) and the pair fill 9 of 12; a third
    # beam-4 sentence does not fit, a pair does
    full = {BatchKey("m", 4): 2, BatchKey("m", 1, forced=True): 1}
    late = [Waiting(("t", 1), "t2", 4, 0.0, model="m")]
    assert decide(config, 0.0, late, full).admit == ()
    late_pair = [Waiting(("a", 1), "a2", 1, 0.0, model="m", forced=True)]
    assert decide(config, 0.0, late_pair, full).admit == (("a", 1),)


def test_the_benchmarks_aer_by_hand() -> None:
    counts = AlignmentCounts()
    # target word 3 has no gold link: (2, 3) is not scored; gold 3 links, 3 scored, 2 hits
    counts.add(score_sentence({(0, 0), (1, 1), (2, 1), (2, 3)}, {(0, 0), (1, 1), (1, 2)}))
    counts.add(score_sentence({(0, 0)}, set()))  # a sentence without gold scores nothing
    assert (counts.predicted, counts.gold, counts.hits) == (3, 3, 2)
    assert counts.aer == pytest.approx(1 - 4 / 6)
    assert counts.precision == pytest.approx(2 / 3) and counts.recall == pytest.approx(2 / 3)


def test_the_link_mode_benchmark_runs(
    tiny: TinyModel,
    pairs: list[tuple[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks/alignment/align_modes.py on a tiny split with diagonal 'gold': one table row per mode."""
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    gold = [
        " ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split())))) for s, t in pairs
    ]
    for suffix, lines in (("src", sources), ("tgt", targets), ("pharaoh", gold)):
        (tmp_path / f"dev.{suffix}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--bundle", str(tiny.bundle), "--data", str(tmp_path), "--src", "src", "--tgt", "tgt"]
    assert align_modes.main([*argv, "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert f"dev: {len(pairs)} pairs, {len(pairs)} with gold links" in out
    for label, _, _ in align_modes.mode_names():
        assert f"| {label} | " in out
