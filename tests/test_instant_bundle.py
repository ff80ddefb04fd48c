"""benchmarks/decoding/instant.py: a bundle that meets the contract, costs nothing and ends its
sentences at lengths the sources choose (the churn benchmarks need sentences leaving at different
steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.decoding.instant import VOCAB, build_instant_bundle, instant_text, target_length
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    bundle = build_instant_bundle(tmp_path_factory.mktemp("instant"))
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search="host")
    return Engine.load(bundle, config)


def test_the_instant_bundle_loads_as_any_bundle_and_keeps_the_contract(engine: Engine) -> None:
    assert isinstance(engine.bundle.path, Path) and engine.bundle.name == "instant"
    assert engine.cfg.tgt_vocab_size == VOCAB  # the manifest's sizes are the graphs'


@pytest.mark.parametrize("length", [3, 9, 40, 300])
def test_each_sentence_ends_after_the_length_its_source_asks_for(
    engine: Engine, length: int
) -> None:
    text = instant_text(length, seed=length)
    assert target_length(engine.prepare(text).ids) == length
    options = SearchOptions(
        beam_size=5, n_best=5, max_length_a=0.0, max_length_b=500, max_length=500
    )
    (translation,) = engine.translate([text], options, alignment="subword")
    hyps = translation.hypotheses
    assert len(hyps) == 5 and all(h.finished for h in hyps)
    assert {len(h.token_ids) for h in hyps} == {length}  # L tokens, then the end of sentence
    assert hyps[0].score >= hyps[-1].score
    assert hyps[0].alignment is not None
    matrix = hyps[0].alignment.matrix  # the fixed attention: 1/len on every source position
    assert matrix.shape == (length, len(translation.source_tokens))
    assert abs(float(matrix.sum(axis=1).max()) - 1.0) < 1e-6
