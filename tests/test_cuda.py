"""The CUDA execution provider, on a GPU host (skipped elsewhere; scripts/gpu_check.sh runs them):
every embedded bundle's graphs run on CUDA node for node, and the answers served from the GPU are
the CPU provider's, within the tolerances below.

Tolerances (TF32 off, the default: fp32 matrix products on both devices). cuBLAS and the CPU's
kernels sum in different orders, so log-probabilities differ in the last bits, and a beam can
rank two near-equal hypotheses the other way round:
- a hypothesis found by both has its score and log-prob within SCORE_TOL and every attention
  weight within ATTENTION_TOL;
- the best hypotheses differ only where they tie: each is in the other provider's n-best with
  scores within SCORE_TOL of the other's best.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu.placement import profile_bundle
from benchmarks.sample_texts import bundle_texts
from service.decode.engine.engine import Engine
from service.decode.runtime.providers import CPU, CUDA, diagnose_cuda, require_provider
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import Translation
from tests.conftest import REPO, needs_cuda

pytestmark = needs_cuda

SCORE_TOL = 1e-3
ATTENTION_TOL = 2e-3
BUNDLES = sorted(p for p in (REPO / "models").iterdir() if (p / "manifest.json").exists())
OPTIONS = SearchOptions(beam_size=5, n_best=3, use_memory=False)


def test_require_provider_passes_and_the_diagnosis_sees_cuda() -> None:
    require_provider("cuda")
    found = diagnose_cuda()
    assert found.build_has_cuda and found.load_error is None
    assert found.driver_cuda is not None and found.cuda_runtime is not None


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_every_computing_node_runs_on_cuda_and_the_step_copies_nothing_inside(bundle: Path) -> None:
    """Shape arithmetic (sizes computed from Shape outputs) is ONNX Runtime's to place on the CPU,
    where shapes live (benchmarks/gpu/placement.py); every other node runs on CUDA, and no Memcpy
    node sits inside the decoder step."""
    encoder, *steps = profile_bundle(bundle, "cuda", bundle_texts(bundle)[:6])
    assert [g.graph for g in steps] == ["decoder_step", "search_step"]  # both searches' steps
    for graph in (encoder, *steps):
        assert graph.nodes > 0
        assert not graph.elsewhere, f"{bundle.name} {graph.graph}: not on CUDA {graph.elsewhere}"
    for step in steps:
        assert not step.memcpy, f"{bundle.name} {step.graph}: Memcpy nodes {step.memcpy}"


def ties(a: Translation, b: Translation) -> bool:
    """a's best is in b's n-best, within SCORE_TOL of b's best (and the other way round)."""
    b_scores = {h.text: h.score for h in b.hypotheses}
    best_a = a.hypotheses[0]
    return (
        best_a.text in b_scores and abs(b_scores[best_a.text] - b.hypotheses[0].score) < SCORE_TOL
    )


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_answers_served_from_cuda_are_the_cpu_providers(bundle: Path) -> None:
    texts = bundle_texts(bundle)[:48]
    cpu = Engine.load(bundle, RuntimeConfig(providers=(CPU,))).translate(texts, OPTIONS, "subword")
    gpu = Engine.load(
        bundle, RuntimeConfig(providers=(CUDA, CPU), require_provider="cuda")
    ).translate(texts, OPTIONS, "subword")
    differing = []
    for text, c, g in zip(texts, cpu, gpu, strict=True):
        if c.hypotheses[0].text != g.hypotheses[0].text:
            assert ties(c, g) and ties(g, c), f"{text!r}: {c.hypotheses[0]} vs {g.hypotheses[0]}"
            differing.append(text)
        on_gpu = {h.text: h for h in g.hypotheses}
        for h in c.hypotheses:
            other = on_gpu.get(h.text)
            if other is None:
                continue
            assert (
                abs(h.score - other.score) < SCORE_TOL
                and abs(h.log_prob - other.log_prob) < SCORE_TOL
            )
            assert h.alignment is not None and other.alignment is not None
            np.testing.assert_allclose(
                h.alignment.matrix, other.alignment.matrix, atol=ATTENTION_TOL, rtol=0
            )
    assert len(differing) <= len(texts) // 10, f"best answers differ on {differing}"


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_the_device_search_on_cuda_is_the_numpy_searchs(bundle: Path) -> None:
    """On the GPU, the search in the step's graph (float64 scores, ONNX Runtime's CUDA TopK)
    against the numpy search over the same decoder step: the same answers, where ties aside."""
    texts = bundle_texts(bundle)[:48]
    answers = {
        search: Engine.load(
            bundle, RuntimeConfig(providers=(CUDA, CPU), require_provider="cuda", search=search)
        ).translate(texts, OPTIONS, "subword")
        for search in ("host", "device")
    }
    for text, h, d in zip(texts, answers["host"], answers["device"], strict=True):
        if h.hypotheses[0].text != d.hypotheses[0].text:
            assert ties(h, d) and ties(d, h), f"{text!r}: {h.hypotheses[0]} vs {d.hypotheses[0]}"
            continue
        for a, b in zip(h.hypotheses, d.hypotheses, strict=False):
            if a.text == b.text:
                assert abs(a.score - b.score) < 1e-5 and abs(a.log_prob - b.log_prob) < 1e-5
