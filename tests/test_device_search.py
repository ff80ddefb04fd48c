"""The device search (service/decode/search/device_search.py) against today's numpy search
(service/decode/search/beam.py), the reference: every embedded bundle, an imported Marian model and an
imported toolkit's beam rule, at beam 1 and 5, n-best, alone and batched, joining mid-batch, under
each stopping rule and penalty. Same texts and tokens, scores and log-probs within 1e-5, attention
within 1e-6 on the CPU provider; a disagreement fails naming the sentence and what differs.

Both row-op kinds run (service/decode/runtime/device.py): the CPU provider's numpy writes and views
("host", the default there), and the graphs a GPU runs ("graph": the history grown and the
finished sentences gathered on the device)."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from benchmarks.decoding.instant import build_instant_bundle, instant_text
from benchmarks.sample_texts import bundle_texts
from service.decode.engine.engine import Engine
from service.decode.runtime.search_graph import controls_problem
from service.decode.search.device_search import DeviceSearch
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions, merge_options
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import DecodeRequest
from service.decode.text.translation import AlignmentMode, Translation
from tests.conftest import REPO

SCORE_TOLERANCE = 1e-5
ATTENTION_TOLERANCE = 1e-6
EMBEDDED = ("default", "g2p", "grc-en-nt", "grc-en-nt-silver", "grc-en-nt-transformer")


def load(bundle: Path, search: str, row_ops: str = "auto") -> Engine:
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, search=search, row_ops=row_ops
    )
    return Engine.load(bundle, config)


class Pair:
    """A bundle's engines: the reference (search "host") and the device search's."""

    def __init__(self, bundle: Path, texts: Sequence[str], row_ops: str = "auto") -> None:
        self.bundle = bundle
        self.host = load(bundle, "host")
        self.device = load(bundle, "device", row_ops)
        searches = self.device.new_batch(5).searches
        assert isinstance(searches[0], DeviceSearch), "the device search did not load"
        self.texts = list(texts)
        self.defaults = SearchOptions(
            **merge_options(SearchOptions().values(), self.host.decoding_defaults)
        )

    def options(self, **changes: Any) -> SearchOptions:
        return replace(self.defaults, **changes)


def assert_same(want: Translation, got: Translation, where: str) -> None:
    """The device search's translation is the host search's (the module's tolerances)."""
    assert len(got.hypotheses) == len(want.hypotheses), (
        f"{where}: {len(got.hypotheses)} hypotheses, the host search {len(want.hypotheses)}"
    )
    for i, (w, g) in enumerate(zip(want.hypotheses, got.hypotheses, strict=True)):
        at = f"{where}, hypothesis {i}"
        assert g.token_ids == w.token_ids, f"{at}: tokens {g.token_ids} != {w.token_ids}"
        assert g.text == w.text and g.finished == w.finished, f"{at}: {g.text!r} != {w.text!r}"
        assert abs(g.score - w.score) <= SCORE_TOLERANCE, f"{at}: score {g.score} != {w.score}"
        assert abs(g.log_prob - w.log_prob) <= SCORE_TOLERANCE, f"{at}: log-prob differs"
        np.testing.assert_allclose(
            g.token_log_probs, w.token_log_probs, atol=SCORE_TOLERANCE, err_msg=at
        )
        if w.alignment is None:
            assert g.alignment is None, f"{at}: an alignment the host search did not give"
            continue
        assert g.alignment is not None, f"{at}: no alignment"
        assert g.alignment.matrix.shape == w.alignment.matrix.shape, f"{at}: attention's shape"
        np.testing.assert_allclose(
            g.alignment.matrix, w.alignment.matrix, atol=ATTENTION_TOLERANCE, rtol=0, err_msg=at
        )


def compare(pair: Pair, texts: Sequence[str], options: SearchOptions, what: str) -> None:
    want = pair.host.translate(list(texts), options, alignment="subword")
    got = pair.device.translate(list(texts), options, alignment="subword")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert_same(w, g, f"{pair.bundle.name} {what}, text {i} {texts[i]!r}")


def marian_bundle(root: Path) -> Path:
    """A tiny Marian s2s model trained by pymarian (seconds) and imported: word vocabularies, a
    cGRU decoder, Marian's scoring and narrowing rule as the bundle's defaults."""
    pytest.importorskip("pymarian")
    pytest.importorskip("torch")
    from export.importers import marian
    from export.toolkits import marian_toolkit as mt

    model = mt.train_words_demo(root)
    vocabs = (model.parent / "src.yml", model.parent / "tgt.yml")
    return marian.import_model(model, vocabs, root / "bundle", "tiny-marian", "1.0.0")


def toolkit_rule_bundle(root: Path) -> Path:
    """The default bundle (a cGRU) declared as imported from Marian: the same graphs under the
    imported toolkits' beam rule (only the non-EOS candidates among the top beam continue),
    without Marian's scoring defaults."""
    copy = Path(shutil.copytree(REPO / "models" / "default", root / "toolkit-rule"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["architecture"]["toolkit"] = "marian"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


BUNDLES = (*EMBEDDED, "instant", "marian", "toolkit-rule")


@pytest.fixture(scope="module", params=BUNDLES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    name = request.param
    if name in EMBEDDED:
        bundle = REPO / "models" / name
        return Pair(bundle, bundle_texts(bundle)[:14])
    root = tmp_path_factory.mktemp(name)
    if name == "instant":
        texts = [instant_text(length, seed) for seed, length in enumerate([1, 3, 9, 17, 40, 2])]
        return Pair(build_instant_bundle(root), texts)
    if name == "marian":
        bundle = marian_bundle(root)
        lines = (root / "task" / "test.src").read_text(encoding="utf-8").splitlines()
        return Pair(bundle, lines[:14])
    bundle = toolkit_rule_bundle(root)
    return Pair(bundle, bundle_texts(REPO / "models" / "default")[:14])


@pytest.mark.parametrize(
    "beam, n_best", [(1, 1), (5, 1), (5, 5), (3, 2)], ids=["greedy", "beam5", "nbest5", "beam3"]
)
def test_a_static_batch_is_the_host_searchs(pair: Pair, beam: int, n_best: int) -> None:
    compare(pair, pair.texts, pair.options(beam_size=beam, n_best=n_best), f"beam {beam}")


def test_each_sentence_alone_is_the_host_searchs(pair: Pair) -> None:
    options = pair.options(beam_size=5, n_best=3)
    for i, text in enumerate(pair.texts[:5]):
        compare(pair, [text], options, f"alone {i}")


STOPPING = [
    {"stopping": "exact"},
    {"stopping": "first"},
    {"stopping": "patience", "patience": 1.5},
    {"stopping": "narrowing"},
    {"length_penalty": 1.0, "coverage_penalty": 0.2},
    {"length_penalty": 0.6, "stopping": "patience", "patience": 2.0},
    {"normalize": 1.0, "word_penalty": 0.5},
    {"word_penalty": -0.3},  # a reward: the exact rule has no bound
    {"max_length_factor": 1.5},
    {"max_length": 4, "max_length_b": 3},  # every hypothesis cut at its maximum length
]


@pytest.mark.parametrize(
    "changes", STOPPING, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
)
def test_every_stopping_rule_and_penalty(pair: Pair, changes: dict[str, Any]) -> None:
    options = pair.options(beam_size=5, n_best=2, **changes)
    compare(pair, pair.texts[:8], options, f"{changes}")


def churn(
    engine: Engine, requests: Sequence[DecodeRequest[int]], seed: int
) -> dict[int, Translation]:
    """Requests joining a running batch 0-3 at a time before each step (the same schedule for
    both searches: the answers must not depend on it anyway)."""
    rng = random.Random(seed)
    batch = engine.new_batch(5)
    pending = list(requests)
    results: dict[int, Translation] = {}
    while pending or len(batch):
        joining = [pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 2, 3])))]
        batch.add(joining)
        if len(batch):
            results.update(batch.step())
    return results


def test_sentences_joining_and_leaving_mid_batch_with_mixed_options(pair: Pair) -> None:
    """Beam sizes below the batch's, n-best lists, penalties and every stopping rule in one running
    batch, sentences joining while others decode and leave; with and without alignments."""
    rng = random.Random(7)
    mixes: list[dict[str, Any]] = [
        {},
        {"beam_size": 3, "n_best": 3},
        {"beam_size": 1},
        {"length_penalty": 1.0, "coverage_penalty": 0.1, "stopping": "patience"},
        {"stopping": "first", "n_best": 2},
        {"stopping": "narrowing", "beam_size": 4},
        {"normalize": 0.6, "word_penalty": 0.2, "max_length_factor": 2.0},
    ]
    requests = []
    for i in range(3 * len(pair.texts)):
        text = pair.texts[i % len(pair.texts)]
        options = pair.options(**{"beam_size": 5, **rng.choice(mixes)})
        alignment: AlignmentMode = "subword" if i % 3 else "none"
        requests.append(DecodeRequest(i, pair.host.prepare(text), options, alignment))
    want = churn(pair.host, requests, seed=3)
    got = churn(pair.device, requests, seed=3)
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert_same(w, got[key], f"{pair.bundle.name} churn, request {key}")


@pytest.fixture(scope="module")
def graph_ops(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """The default bundle with the row ops a GPU runs: the history grown and the finished
    sentences gathered by graphs on the device."""
    bundle = REPO / "models" / "default"
    return Pair(bundle, bundle_texts(bundle)[:14], row_ops="graph")


def test_the_device_graphs_row_ops_give_the_same_answers(graph_ops: Pair) -> None:
    compare(graph_ops, graph_ops.texts, graph_ops.options(beam_size=5, n_best=5), "graph ops")
    requests = [
        DecodeRequest(i, graph_ops.host.prepare(t), graph_ops.options(n_best=2), "subword")
        for i, t in enumerate(graph_ops.texts * 3)
    ]
    want, got = churn(graph_ops.host, requests, 5), churn(graph_ops.device, requests, 5)
    for key, w in want.items():
        assert_same(w, got[key], f"graph ops churn, request {key}")


# --- the decoding controls --------------------------------------------------------------------


def control_cases(pair: Pair) -> list[tuple[str, dict[str, Any]]]:
    """Each control alone, as options: a prefix (the first words of a translation, so that its
    tokens are the model's), single suppressed tokens, a minimum length (on the device), and the
    host's: n-gram blocking, a repetition penalty, a suppressed sequence, sampling, alternatives,
    a glossary term."""
    tok = pair.host.tgt_tok
    first = pair.host.translate(pair.texts[:1], pair.options(beam_size=5))[0].hypotheses[0]
    words = first.text.split()
    singles = [w for w in dict.fromkeys(words) if len(tok.encode(w)) == 1][:2] or words[:1]
    sequence = next((w for w in words if len(tok.encode(w)) > 1), None)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("prefix", {"target_prefix": (" ".join(words[:2]),)}),
        ("suppress", {"suppress": tuple(singles)}),
        ("min_length", {"min_length": len(first.token_ids) + 3}),
        ("ngram", {"no_repeat_ngram_size": 2}),
        ("repetition", {"repetition_penalty": 1.3}),
        ("sampling", {"sampling_topk": 5, "n_best": 2, "seed": 3}),
        ("alternatives", {"return_alternatives": 3, "n_best": 3}),
    ]
    if sequence is not None:
        cases.append(("suppress sequence", {"suppress": (sequence,)}))
    if words:
        cases.append(("glossary", {"glossary": (("", words[-1]),)}))
    return cases


def test_each_control_alone(pair: Pair) -> None:
    for name, changes in control_cases(pair):
        options = pair.options(beam_size=5, **{"n_best": 2, **changes})
        texts = pair.texts[:1] if "target_prefix" in changes else pair.texts[:6]
        compare(pair, texts, options, f"control {name}")


def test_the_device_search_holds_the_mask_and_prefix_controls(pair: Pair) -> None:
    """A prefix, single suppressed tokens and a minimum length decode on the device; the
    controls that read a hypothesis's tokens, sample or keep constraints on the host."""
    cases = dict(control_cases(pair))
    batch = pair.device.new_batch(5)
    device = batch.searches[0]
    assert isinstance(device, DeviceSearch)
    # the graph must end in a TopK over its log-softmax row, which the masks go before (the
    # exporter's do; the instant bundle's reads its top k from a table)
    masks = controls_problem(onnx.load(str(pair.bundle / "decoder.onnx"))) is None
    assert masks == (pair.bundle.name != "instant" and "instant" not in str(pair.bundle))
    for name, on_device in [("prefix", True), ("min_length", True), ("ngram", False),
                         ("repetition", False), ("sampling", False)]:  # fmt: skip
        options = pair.options(beam_size=5, **{"n_best": 2, **cases[name]})
        took = device.takes(options, pair.device.controls(options))
        assert took == (on_device and masks), name


def test_every_control_mixed_in_one_running_batch(pair: Pair) -> None:
    """Sentences with each control, and without, joining one running batch: the device search
    and the numpy search share it; every answer is the host search's."""
    cases = control_cases(pair)
    requests = []
    for i in range(2 * len(pair.texts)):
        changes = cases[i % len(cases)][1] if i % 3 else {}
        text = pair.texts[0] if "target_prefix" in changes else pair.texts[i % len(pair.texts)]
        options = pair.options(beam_size=5, **{"n_best": 2, **changes})
        requests.append(DecodeRequest(i, pair.host.prepare(text), options, "subword"))
    want = churn(pair.host, requests, seed=11)
    got = churn(pair.device, requests, seed=11)
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert_same(w, got[key], f"{pair.bundle.name} mixed controls, request {key}")


def test_sentences_removed_mid_decode_leave_the_others_their_answers(pair: Pair) -> None:
    """Cancelled sentences (RunningBatch.remove) leave between steps, joining ones among them:
    the others' answers are the host search's, and sentences joining after them reuse their
    history rows."""
    requests = [
        DecodeRequest(i, pair.host.prepare(t), pair.options(n_best=2), "subword")
        for i, t in enumerate(pair.texts * 2)
    ]
    want = churn(pair.host, requests, seed=2)
    batch = pair.device.new_batch(5)
    rng = random.Random(4)
    pending = list(requests)
    removed: set[int] = set()
    got: dict[int, Translation] = {}
    while pending or len(batch):
        batch.add([pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 2, 3])))])
        if rng.random() < 0.3 and batch.requests:
            key = rng.choice(sorted(int(k) for k in batch.requests))  # type: ignore[call-overload]
            assert batch.remove([key]) == [key]
            removed.add(key)
        if len(batch):
            got.update(batch.step())
    assert got.keys() == want.keys() - removed and removed
    for key, translation in got.items():
        assert_same(want[key], translation, f"{pair.bundle.name} removals, request {key}")


def test_a_model_capped_at_one_graph_a_beam_gives_the_host_searchs_answers(pair: Pair) -> None:
    """With search_graphs_per_beam 1, the batches of a mixed load (controls, coverage, n-best,
    with and without alignments) run on graphs that do more than their sentences need: the
    answers are the host search's, and the model makes no more graphs than uncapped, at most one
    more than its cap (the one that does every need)."""
    cases = [*control_cases(pair), ("coverage", {"coverage_penalty": 0.2, "length_penalty": 1.0})]
    requests = []
    for i in range(2 * len(pair.texts)):
        changes = cases[i % len(cases)][1] if i % 3 else {}
        text = pair.texts[0] if "target_prefix" in changes else pair.texts[i % len(pair.texts)]
        options = pair.options(beam_size=5, **{"n_best": 1 + i % 2, **changes})
        alignment: AlignmentMode = "subword" if i % 4 else "none"
        requests.append(DecodeRequest(i, pair.host.prepare(text), options, alignment))
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, search_graphs_per_beam=1
    )
    capped = Engine.load(pair.bundle, config)
    uncapped = Engine.load(pair.bundle, replace(config, search_graphs_per_beam=16))
    want = churn(pair.host, requests, seed=13)
    got = churn(capped, requests, seed=13)
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert_same(w, got[key], f"{pair.bundle.name} capped, request {key}")
    churn(uncapped, requests, seed=13)
    made, unmade = len(capped.model.search_sessions), len(uncapped.model.search_sessions)
    assert made <= min(unmade, 2), f"capped made {made} graphs, uncapped {unmade}"


def settled_while_churning(
    engine: Engine, requests: Sequence[DecodeRequest[int]], seed: int
) -> tuple[dict[int, list[Hypothesis]], dict[int, list[Hypothesis]]]:
    """`churn` with every sentence watched: each sentence's settled prefixes as they grew
    (RunningBatch.settled after each step), and its n-best at the end."""
    rng = random.Random(seed)
    batch = engine.new_batch(5)
    pending = list(requests)
    settled: dict[int, list[Hypothesis]] = {r.key: [] for r in requests}
    final: dict[int, list[Hypothesis]] = {}
    while pending or len(batch):
        joining = [pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 2, 3])))]
        batch.add(joining)
        batch.watch([r.key for r in joining])
        if len(batch):
            done = batch.step_raw()
            for request, prefix in batch.settled():
                settled[request.key].append(prefix)
            final.update((request.key, parts[0]) for request, parts in done if len(parts) == 1)
    return settled, final


@pytest.mark.parametrize(
    "beam, n_best", [(1, 1), (5, 1), (5, 3)], ids=["greedy", "beam5", "nbest3"]
)
def test_settled_prefixes_are_the_start_of_every_final_hypothesis(
    pair: Pair, beam: int, n_best: int
) -> None:
    """In both searches, sentences joining a running batch at different steps: each settled
    prefix (what TranslateStream sends before a sentence is final) is the start of the sentence's
    every final hypothesis (tokens, log-probs, attention rows), each longer than the one before."""
    assert_settled_prefixes(pair, beam, n_best)


def test_settled_prefixes_with_the_device_graphs_row_ops(graph_ops: Pair) -> None:
    """As above, the sentences' fields and histories gathered on the device (a GPU's path)."""
    assert_settled_prefixes(graph_ops, 5, 2)


def assert_settled_prefixes(pair: Pair, beam: int, n_best: int) -> None:
    options = pair.options(beam_size=beam, n_best=n_best, return_attention=True)
    for engine in (pair.host, pair.device):
        requests = [
            DecodeRequest(i, engine.prepare(t), options, "subword")
            for i, t in enumerate(pair.texts)
        ]
        settled, final = settled_while_churning(engine, requests, seed=beam)
        whole = [r.key for r in requests if not r.sentence.segments]
        assert whole and all(key in final for key in whole)
        for key in whole:
            lengths = [len(p.tokens) for p in settled[key]]
            assert lengths == sorted(set(lengths)), f"sentence {key}: {lengths}"
            for prefix in settled[key]:
                n = len(prefix.tokens)
                for hyp in final[key]:
                    assert hyp.tokens[:n] == prefix.tokens, f"sentence {key}: {prefix.tokens}"
                best = final[key][0]
                assert best.token_log_probs is not None and prefix.token_log_probs is not None
                np.testing.assert_allclose(prefix.token_log_probs, best.token_log_probs[:n])
                assert best.attention is not None and prefix.attention is not None
                np.testing.assert_allclose(prefix.attention, best.attention[:n], atol=1e-6)
        assert any(settled[key] for key in whole)
