"""The engine over ONNX Runtime: equals the PyTorch reference, batch-invariant, alignments well-formed."""

from __future__ import annotations

import numpy as np
import pytest

from export.data.corpus import read_tsv
from export.train.torch_decoder import TorchDecoder
from service.decode.engine.engine import Engine, InvalidInput
from service.decode.runtime.encoded import pad_ids
from service.decode.search.beam import SearchOptions, beam_search
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.text.preparation import DecodeRequest
from tests.conftest import DEFAULT_BUNDLE, REPO, TinyModel

SCORE_TOL = 1e-4  # fp32 kernels differ between ONNX Runtime and PyTorch, and with the batch's shape


@pytest.fixture(scope="module")
def engine(tiny: TinyModel) -> Engine:
    return Engine.load(
        tiny.bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )


def options(beam: int, n_best: int = 1, **kw: float) -> SearchOptions:
    return SearchOptions(beam_size=beam, n_best=n_best, max_length_a=1.0, max_length_b=5, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("beam", [1, 4])
def test_onnx_decode_equals_pytorch_reference(engine: Engine, tiny: TinyModel, beam: int) -> None:
    sources = tiny.sources[:8]
    opts = options(beam, n_best=min(beam, 2))
    got = engine.translate(sources, opts, alignment="subword")
    src, lengths = pad_ids([tiny.src_tok.encode(s) for s in sources])
    decoder = TorchDecoder(tiny.model, src, lengths)
    ref = beam_search(
        decoder,
        lengths.tolist(),
        opts,
        tiny.model.cfg.bos_id,
        tiny.model.cfg.eos_id,
        tiny.model.cfg.tgt_vocab_size,
    )
    for translation, ref_hyps in zip(got, ref, strict=True):
        assert [h.token_ids for h in translation.hypotheses] == [h.tokens for h in ref_hyps]
        for h, r in zip(translation.hypotheses, ref_hyps, strict=True):
            assert h.score == pytest.approx(r.score, abs=SCORE_TOL)


def test_beam_one_equals_greedy(engine: Engine, tiny: TinyModel) -> None:
    import torch

    sources = tiny.sources[:10]
    got = engine.translate(sources, options(1), alignment="none")
    for source, translation in zip(sources, got, strict=True):
        ids = tiny.src_tok.encode(source)
        max_len = options(1).max_len(len(ids))
        greedy = tiny.model.greedy(torch.tensor([ids]), torch.tensor([len(ids)]), max_len)[0]
        assert translation.hypotheses[0].token_ids == greedy


def test_sentence_decodes_the_same_alone_and_in_a_batch(engine: Engine, tiny: TinyModel) -> None:
    sources = sorted(tiny.sources[:12], key=len)  # lengths differ across the batch
    opts = options(3, n_best=3)
    batch = engine.translate(sources, opts)
    for source, in_batch in zip(sources, batch, strict=True):
        alone = engine.translate([source], opts)[0]
        assert [h.token_ids for h in alone.hypotheses] == [h.token_ids for h in in_batch.hypotheses]
        assert [h.score for h in alone.hypotheses] == pytest.approx(
            [h.score for h in in_batch.hypotheses], abs=SCORE_TOL
        )


def test_sentence_joining_a_running_batch_decodes_as_alone(engine: Engine, tiny: TinyModel) -> None:
    opts = options(3, n_best=2)
    early, late = tiny.sources[20:24], tiny.sources[24]
    batch = engine.new_batch(3)
    batch.add([DecodeRequest(i, engine.prepare(s), opts) for i, s in enumerate(early)])
    results = dict(batch.step())
    results.update(batch.step())
    batch.add([DecodeRequest("late", engine.prepare(late), opts)])
    while len(batch):
        results.update(batch.step())
    alone = engine.translate([late], opts)[0]
    assert [h.token_ids for h in results["late"].hypotheses] == [
        h.token_ids for h in alone.hypotheses
    ]


def test_nbest_sorted_and_distinct(engine: Engine, tiny: TinyModel) -> None:
    for translation in engine.translate(tiny.sources[:6], options(5, n_best=5)):
        scores = [h.score for h in translation.hypotheses]
        assert scores == sorted(scores, reverse=True)
        seqs = [tuple(h.token_ids) for h in translation.hypotheses]
        assert len(seqs) == len(set(seqs)) == 5


def test_alignment_rows_sum_to_one_and_match_tokens(engine: Engine, tiny: TinyModel) -> None:
    for translation in engine.translate(
        tiny.sources[:6], options(3, n_best=2), alignment="subword"
    ):
        for h in translation.hypotheses:
            a = h.alignment
            assert a is not None
            assert a.matrix.shape == (len(h.tokens), len(translation.source_tokens))
            assert a.target_tokens == h.tokens and a.source_tokens == translation.source_tokens
            assert np.allclose(a.matrix.sum(axis=1), 1.0, atol=1e-5)
            assert len(a.pharaoh.split()) == len(h.tokens)


def test_word_level_alignment(engine: Engine, tiny: TinyModel) -> None:
    source = "ninety-seven and March 5, 2021"
    translation = engine.translate([source], options(2), alignment="word")[0]
    a = translation.hypotheses[0].alignment
    assert a is not None
    assert a.source_tokens == source.split()
    assert a.matrix.shape == (len(a.target_tokens), len(a.source_tokens))
    if a.matrix.size:
        assert np.allclose(a.matrix.sum(axis=1), 1.0, atol=1e-5)


def test_empty_and_overlong_inputs_are_refused(tiny: TinyModel) -> None:
    engine = Engine.load(
        tiny.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",)),
        EngineLimits(max_source_tokens=10),
    )
    for bad in ("", "   \t\n"):
        with pytest.raises(InvalidInput, match="empty"):
            engine.translate([bad])
    with pytest.raises(InvalidInput, match="over the limit of 10"):
        engine.translate(["one two three four five six seven eight nine ten eleven twelve"])
    with pytest.raises(InvalidInput, match="no texts"):
        engine.translate([])
    with pytest.raises(InvalidInput, match="beam_size"):
        engine.translate(["one"], SearchOptions(beam_size=64))


@pytest.mark.parametrize("beam", [1, 4])
def test_int8_decoder_agrees_with_fp32(beam: int) -> None:
    """The default model's int8 decoder (7-bit weights, a scale per column: export/onnx/quantize.py)
    against its fp32 one on 200 test sentences: the same text on nearly all, scores within 0.2 at
    most and 0.005 on average, and not bit-identical (the int8 graph really ran).

    Measured on an AMD EPYC with AVX2 and no VNNI (flags avx2 fma, no avx512_vnni/avx_vnni), the
    CPUs where the old full-range int8 weights saturated: 200/200 the same text at beam 1 and 4,
    largest difference 0.128 and 0.044, mean 0.0015 and 0.0009 (the old graph: 0.49 and 0.34,
    mean 0.012 and 0.011; 0.07 at most on the VNNI machine it was made on). Its weights keep
    every kernel's sums exact (tests/test_int8.py), so these are its figures on every x86-64 CPU."""
    sources = [s for s, _ in read_tsv(REPO / "docs" / "eval" / "test.tsv")][:200]
    runtime = {"providers": ("CPUExecutionProvider",), "intra_op_threads": 1}
    fp32 = Engine.load(DEFAULT_BUNDLE, RuntimeConfig(**runtime))  # type: ignore[arg-type]
    int8 = Engine.load(DEFAULT_BUNDLE, RuntimeConfig(**runtime, int8_decoder=True))  # type: ignore[arg-type]
    opts = SearchOptions(beam_size=beam)
    pairs = [
        (a.hypotheses[0], b.hypotheses[0])
        for a, b in zip(
            fp32.translate(sources, opts, "none"),
            int8.translate(sources, opts, "none"),
            strict=True,
        )
    ]
    same = [(a, b) for a, b in pairs if a.text == b.text]
    assert len(same) >= 0.97 * len(pairs)
    differences = [abs(a.score - b.score) for a, b in same]
    assert max(differences) < 0.2
    assert float(np.mean(differences)) < 0.005
    assert max(differences) > 0.0


def test_removed_sentences_leave_and_the_rest_are_unaffected(
    engine: Engine, tiny: TinyModel
) -> None:
    opts = options(2, n_best=2)
    sources = tiny.sources[30:34]
    batch = engine.new_batch(2)
    batch.add([DecodeRequest(i, engine.prepare(s), opts) for i, s in enumerate(sources)])
    results = dict(batch.step())
    assert sorted(batch.remove({1, 3, "absent"})) == [k for k in (1, 3) if k not in results]
    while len(batch):
        results.update(batch.step())
    expected = engine.translate([sources[0], sources[2]], opts)
    assert [h.token_ids for h in results[0].hypotheses] == [
        h.token_ids for h in expected[0].hypotheses
    ]
    assert [h.token_ids for h in results[2].hypotheses] == [
        h.token_ids for h in expected[1].hypotheses
    ]


def test_encode_sentences_in_length_buckets_equals_each_sentence_encoded_alone(
    engine: Engine, tiny: TinyModel
) -> None:
    ids = [tiny.src_tok.encode(s) for s in tiny.sources[:12]]
    ids.append(ids[0] * 6)  # an outlier, several times longer: it gets a call of its own
    together = engine.model.encode_sentences(ids)
    assert [s.length for s in together] == [len(x) for x in ids]  # input order kept
    for sentence_ids, got in zip(ids, together, strict=True):
        (alone,) = engine.model.encode_sentences([sentence_ids])
        assert np.allclose(got.values, alone.values, atol=1e-5)
        assert np.allclose(got.keys, alone.keys, atol=1e-5)
        assert np.allclose(got.state, alone.state, atol=1e-5)


def test_word_alignment_has_one_row_per_word_of_the_text() -> None:
    # The case: the shipped model, beam 16, n-best 16; a hypothesis beginning with a bare
    # "▁" (with digits split, French "1 000" is "▁", "1", "▁", "0", ...).
    engine = Engine.load(
        "models/default", RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )
    (translation,) = engine.translate(
        ["1,000"], SearchOptions(beam_size=16, n_best=16), alignment="word"
    )
    assert any(h.tokens[0] == "▁" for h in translation.hypotheses)  # the case is still exercised
    for h in translation.hypotheses:
        assert h.alignment is not None
        assert h.alignment.target_tokens == h.text.split(), h.tokens
        assert h.alignment.matrix.shape == (len(h.text.split()), 1)
