"""The two searches held to each other under drawn schedules (hypothesis): sentences join a running
batch a few at a time, some leave before they finish (cancelled), and the batch steps, with every
option the searches read drawn per sentence (beam sizes, n-best, a coverage penalty or none, every
stopping rule, attention or none, a prefix, suppressed tokens and sequences, a minimum length,
n-gram blocking, a repetition penalty, sampling with seeds, alternatives, glossary terms).

The device search (search "device": the controls it takes on the device, the rest with the numpy
search in the same running batch) must answer every request as the numpy search alone (search
"host") answers it under the same schedule, and never raise: the coverage KeyError of issue 48 was
a batch that emptied under the coverage graph and filled again with a sentence that had the
penalty, an order of joins and leaves the fixed tests had not taken.

Two bundles: the default model (real weights, every control on the device where it can go) and
the instant bundle (a decoder that costs nothing, so that thousands of schedules fit in CI's time;
its graph takes no controls, so its controlled sentences go to the numpy search). Derandomized,
with no example database: the same schedules every run (S2S_SCHEDULES=N draws N fresh ones).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.decoding.instant import build_instant_bundle, instant_text
from service.decode.engine.engine import Engine
from service.decode.search.device_search import DeviceSearch
from service.decode.shared.options import STOPPING_RULES
from service.decode.text.preparation import DecodeRequest
from service.decode.text.translation import AlignmentMode, Translation
from tests.conftest import REPO
from tests.test_device_search import Pair, assert_same

_DRAWN = os.environ.get("S2S_SCHEDULES")
K = 5  # the running batch's beam size


def schedule_settings(examples: int) -> settings:
    return settings(
        max_examples=int(_DRAWN) if _DRAWN else examples,
        deadline=timedelta(seconds=30),
        derandomize=_DRAWN is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass(frozen=True)
class Words:
    """What a text's own translation offers its controls: its first words (a prefix the model
    would write), a word of one target token and one of several (suppress entries), its last
    word (a glossary term)."""

    prefix: str
    single: str | None
    sequence: str | None
    last: str


def words_of(pair: Pair, text: str) -> Words:
    tok = pair.host.tgt_tok
    best = pair.host.translate([text], pair.options(beam_size=K))[0].hypotheses[0]
    words = best.text.split() or ["x"]
    single = next((w for w in words if len(tok.encode(w)) == 1), None)
    sequence = next((w for w in words if len(tok.encode(w)) > 1), None)
    return Words(" ".join(words[:2]), single, sequence, words[-1])


class Bench:
    """A bundle's two engines, its texts prepared once, and each text's words."""

    def __init__(self, pair: Pair, texts: Sequence[str], controls: bool) -> None:
        self.pair = pair
        self.texts = list(texts)
        self.prepared = [pair.host.prepare(t) for t in self.texts]
        self.words = [words_of(pair, t) for t in self.texts] if controls else []


@pytest.fixture(scope="module")
def default_bench() -> Bench:
    texts = ["seven", "ninety-seven", "forty-two point one", "March 5, 2021",
             "three hundred and twelve", "eleven thousand and four"]  # fmt: skip
    return Bench(Pair(REPO / "models" / "default", texts), texts, controls=True)


@pytest.fixture(scope="module", params=["auto", "graph"])
def instant_bench(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Bench:
    """The instant bundle, with the CPU's row ops (numpy in place) and with the graphs a GPU runs
    (the batch picked and the finished sentences gathered on the device)."""
    texts = [instant_text(length, seed) for seed, length in enumerate([1, 2, 3, 5, 8, 13])]
    bundle = build_instant_bundle(tmp_path_factory.mktemp("instant"))
    return Bench(Pair(Path(bundle), texts, row_ops=request.param), texts, controls=False)


def search_changes() -> st.SearchStrategy[dict[str, Any]]:
    """The options every search reads: beam, n-best, penalties, the stopping rule, lengths."""
    beam = st.integers(1, K)
    return beam.flatmap(
        lambda b: st.fixed_dictionaries(
            {"beam_size": st.just(b), "n_best": st.integers(1, b)},
            optional={
                "coverage_penalty": st.sampled_from([0.0, 0.2]),
                "length_penalty": st.sampled_from([0.0, 0.6, 1.0]),
                "stopping": st.sampled_from(STOPPING_RULES),
                "patience": st.sampled_from([1.0, 1.5]),
                "normalize": st.sampled_from([0.0, 0.6]),
                "word_penalty": st.sampled_from([0.0, 0.3, -0.3]),
                "max_length": st.integers(2, 12),
            },
        )
    )


CONTROLS = ("prefix", "suppress", "suppress sequence", "min_length", "ngram", "repetition",
            "sampling", "alternatives", "glossary")  # fmt: skip


def control_changes(words: Words, control: str, beam: int, seed: int) -> dict[str, Any]:
    """One control's options for a text (nothing where the text offers no such word)."""
    if control == "prefix":
        return {"target_prefix": (words.prefix,)}
    if control == "suppress" and words.single is not None:
        return {"suppress": (words.single,)}
    if control == "suppress sequence" and words.sequence is not None:
        return {"suppress": (words.sequence,)}
    if control == "min_length":
        return {"min_length": 4}
    if control == "ngram":
        return {"no_repeat_ngram_size": 2}
    if control == "repetition":
        return {"repetition_penalty": 1.3}
    if control == "sampling":
        return {"sampling_topk": seed % 4, "seed": seed}
    if control == "alternatives":
        return {"return_alternatives": beam}
    if control == "glossary":
        return {"glossary": (("", words.last),)}
    return {}


@dataclass(frozen=True)
class Join:
    text: int
    changes: dict[str, Any]
    control: str | None
    seed: int
    alignment: AlignmentMode


@dataclass(frozen=True)
class Moment:
    """Before a step: who joins, which joined request leaves (an index into those joined so far,
    taken modulo; None: nobody), then how many steps."""

    joins: tuple[Join, ...]
    leave: int | None
    steps: int


def joins(texts: int, controls: bool) -> st.SearchStrategy[Join]:
    return st.builds(
        Join,
        text=st.integers(0, texts - 1),
        changes=search_changes(),
        control=st.sampled_from(CONTROLS) if controls else st.none(),
        seed=st.integers(1, 10_000),
        alignment=st.sampled_from(["none", "subword", "word"]),
    )


def schedules(texts: int, controls: bool) -> st.SearchStrategy[list[Moment]]:
    moment = st.builds(
        Moment,
        joins=st.lists(joins(texts, controls), max_size=3).map(tuple),
        leave=st.none() | st.integers(0, 50),
        steps=st.integers(1, 3),
    )
    return st.lists(moment, min_size=1, max_size=8)


def requests_of(bench: Bench, schedule: list[Moment]) -> list[list[DecodeRequest[int]]]:
    """Each moment's joining requests (keys in joining order)."""
    key, out = 0, []
    for moment in schedule:
        batch = []
        for j in moment.joins:
            options = bench.pair.options(**j.changes)
            if j.control is not None:
                extra = control_changes(bench.words[j.text], j.control, options.beam_size, j.seed)
                if "return_alternatives" in extra:
                    extra["n_best"] = options.beam_size
                options = replace(options, **extra)
            batch.append(DecodeRequest(key, bench.prepared[j.text], options, j.alignment))
            key += 1
        out.append(batch)
    return out


def run(
    engine: Engine, schedule: list[Moment], requests: list[list[DecodeRequest[int]]]
) -> tuple[dict[int, Translation], list[list[int]]]:
    """The answers, and what each leave removed."""
    batch = engine.new_batch(K)
    answers: dict[int, Translation] = {}
    removed: list[list[int]] = []
    joined: list[int] = []
    for moment, joining in zip(schedule, requests, strict=True):
        batch.add(joining)
        joined += [r.key for r in joining]
        if moment.leave is not None and joined:
            removed.append(batch.remove([joined[moment.leave % len(joined)]]))
        for _ in range(moment.steps):
            if len(batch):
                answers.update(batch.step())
    while len(batch):
        answers.update(batch.step())
    return answers, removed


def check_schedule(bench: Bench, schedule: list[Moment]) -> None:
    requests = requests_of(bench, schedule)
    want, want_removed = run(bench.pair.host, schedule, requests)
    got, got_removed = run(bench.pair.device, schedule, requests)
    assert got_removed == want_removed, "the two searches finished sentences at different steps"
    assert got.keys() == want.keys()
    every = {r.key: r for batch in requests for r in batch}
    for key, answer in want.items():
        assert_same(answer, got[key], f"request {key} ({every[key].options})")


@schedule_settings(examples=1200)
@given(schedule=schedules(texts=6, controls=False))
def test_drawn_schedules_on_the_instant_bundle(
    instant_bench: Bench, schedule: list[Moment]
) -> None:
    check_schedule(instant_bench, schedule)


@schedule_settings(examples=600)
@given(schedule=schedules(texts=6, controls=True))
def test_drawn_schedules_with_every_control(default_bench: Bench, schedule: list[Moment]) -> None:
    check_schedule(default_bench, schedule)


def test_a_batch_emptied_under_the_coverage_graph_fills_again(default_bench: Bench) -> None:
    """Issue 48's KeyError: the last sentence with a coverage penalty finished and the batch
    emptied; the next sentence with the penalty found the coverage graph and no coverage."""
    options = default_bench.pair.options(coverage_penalty=0.2, length_penalty=1.0)
    one = Join(0, {}, None, 1, "none")
    schedule = [Moment((one,), None, 40), Moment((one,), None, 1)]
    requests = [
        [DecodeRequest(0, default_bench.prepared[0], options, "none")],
        [DecodeRequest(1, default_bench.prepared[1], options, "none")],
    ]
    got, _ = run(default_bench.pair.device, schedule, requests)
    want, _ = run(default_bench.pair.host, schedule, requests)
    assert got.keys() == want.keys() == {0, 1}
    for key, answer in want.items():
        assert_same(answer, got[key], f"request {key}")


def test_the_schedules_take_the_paths_they_are_for(default_bench: Bench) -> None:
    """The drawn controls reach both paths of the device engine: some on the device, some with
    the numpy search (a check that the schedules test what they say)."""
    device = default_bench.pair.device.new_batch(K).searches[0]
    assert isinstance(device, DeviceSearch)
    words = default_bench.words[1]
    engine, prepared = default_bench.pair.device, default_bench.prepared[1]

    def takes(control: str) -> bool:
        options = replace(default_bench.pair.options(), **control_changes(words, control, K, 3))
        return device.takes(options, engine.sentence_controls(prepared, options)[0])

    took = {control: takes(control) for control in CONTROLS}
    assert took["prefix"] and took["min_length"]
    assert not took["ngram"] and not took["sampling"] and not took["glossary"]
