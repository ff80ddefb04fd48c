"""The batching policy as a pure function of a fake clock (plain floats): admission, stepping, expiry."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest

from service.serve.config import load_settings
from service.serve.scheduler import BatchingConfig, BatchKey, Decision, Waiting, decide


def w(
    key: str,
    beam: int = 5,
    arrived: float = 0.0,
    request: Hashable = None,
    deadline: float | None = None,
) -> Waiting:
    """A waiting sentence; by default each sentence is its own request."""
    return Waiting(
        key=key,
        request=key if request is None else request,
        beam_size=beam,
        arrived=arrived,
        deadline=deadline,
    )


def B(beam: int, model: Hashable = None) -> BatchKey:
    """The running batch of this beam size (of `model`; None: the one model of these tests)."""
    return BatchKey(model, beam)


def cfg(policy: str = "iteration", **kw: float) -> BatchingConfig:
    return BatchingConfig(policy=policy, **kw)  # type: ignore[arg-type]


# --- iteration-level --------------------------------------------------------------------------


def test_iteration_admits_into_the_running_batch_of_its_beam_before_the_step() -> None:
    d = decide(cfg(), now=1.0, waiting=[w("a"), w("b")], running={B(5): 2})
    assert d == Decision(admit=("a", "b"), admit_batch=B(5), step_batch=B(5))
    assert not d.idle


def test_iteration_starts_a_batch_when_nothing_runs() -> None:
    d = decide(cfg(), now=0.0, waiting=[w("a", beam=3)], running={})
    assert (d.admit, d.admit_batch, d.step_batch, d.wake_at) == (("a",), B(3), B(3), None)


def test_iteration_admits_in_arrival_order_up_to_max_batch_hypotheses() -> None:
    config = cfg(max_batch_hypotheses=20)
    waiting = [w(k, arrived=t) for t, k in enumerate("abcd")]
    d = decide(config, now=5.0, waiting=waiting, running={B(5): 2})  # 10 hypotheses running
    assert d.admit == ("a", "b")  # 10 + 2 * 5 = 20: full


def test_iteration_counts_hypotheses_over_every_running_batch() -> None:
    config = cfg(max_batch_hypotheses=20)
    d = decide(config, now=0.0, waiting=[w("a"), w("b")], running={B(1): 4, B(5): 2})  # 14 running
    assert d.admit == ("a",)  # 19 <= 20 < 24


def test_iteration_respects_max_batch_sentences() -> None:
    config = cfg(max_batch_sentences=3)
    d = decide(
        config, now=0.0, waiting=[w("a", 1), w("b", 1), w("c", 1)], running={B(1): 1, B(4): 1}
    )
    assert d.admit == ("a",)
    full = decide(config, now=0.0, waiting=[w("a", 1)], running={B(1): 2, B(4): 1})
    assert full.admit == () and full.admit_batch is None and full.step_batch == B(1)


def test_iteration_admits_into_a_running_batch_only_the_encoded_prefix() -> None:
    waiting = [w("a"), w("b"), w("c")]
    d = decide(cfg(), now=0.0, waiting=waiting, running={B(5): 1}, ready={"a", "c"})
    assert d.admit == ("a",) and d.step_batch == B(5)  # "c" is encoded but must not overtake "b"
    none_ready = decide(cfg(), now=0.0, waiting=waiting, running={B(5): 1}, ready=set())
    assert none_ready.admit == () and none_ready.step_batch == B(
        5
    )  # the batch keeps stepping meanwhile


def test_iteration_with_nothing_running_admits_whether_encoded_or_not() -> None:
    d = decide(cfg(), now=0.0, waiting=[w("a"), w("b")], running={}, ready=set())
    assert d.admit == ("a", "b") and d.step_batch == B(
        5
    )  # an idle loop encodes them itself: no wait


@pytest.mark.parametrize("policy", ["request", "none"])
def test_readiness_does_not_change_the_other_policies(policy: str) -> None:
    config = cfg(policy, max_queue_delay_s=0.0)
    waiting = [w("a", arrived=0.0), w("b", arrived=0.0)]
    assert decide(config, 1.0, waiting, {}, ready=set()) == decide(config, 1.0, waiting, {})


def test_iteration_never_lets_anyone_overtake_the_oldest() -> None:
    config = cfg(max_batch_hypotheses=12)
    # "a" (beam 5) does not fit next to 8 running hypotheses; "b" (beam 1) would, but must wait
    d = decide(config, now=3.0, waiting=[w("a", 5, 1.0), w("b", 1, 2.0)], running={B(4): 2})
    assert d.admit == () and d.step_batch == B(4)
    # once the running batch is gone, "a" goes first
    after = decide(config, now=4.0, waiting=[w("a", 5, 1.0), w("b", 1, 2.0)], running={})
    assert after.admit == ("a",) and after.admit_batch == B(5)


def test_iteration_admits_only_the_oldest_sentences_beam_size_per_decision() -> None:
    d = decide(cfg(), now=1.0, waiting=[w("a", 5), w("b", 1), w("c", 5)], running={})
    assert d.admit == ("a", "c") and d.admit_batch == B(5)  # "b" joins its own batch next time
    nxt = decide(cfg(), now=1.0, waiting=[w("b", 1)], running={B(5): 2}, last_stepped=B(5))
    assert nxt.admit == ("b",) and nxt.admit_batch == B(1)


def test_a_lone_oversized_request_still_progresses() -> None:
    config = cfg(max_batch_hypotheses=8, max_batch_sentences=1)
    d = decide(config, now=0.0, waiting=[w("big", beam=16), w("next", beam=16)], running={})
    assert d.admit == ("big",) and d.step_batch == B(16)
    # while anything else runs it waits (it would exceed the limits), and blocks those behind it
    blocked = decide(
        config, now=0.0, waiting=[w("big", beam=16), w("small", beam=1)], running={B(1): 1}
    )
    assert blocked.admit == () and blocked.step_batch == B(1)


def test_round_robin_over_beam_groups() -> None:
    running = {B(5): 1, B(1): 3, B(4): 2}
    order, last = [], None
    for _ in range(6):
        d: Decision[str] = decide(cfg(), now=0.0, waiting=[], running=running, last_stepped=last)
        order.append(d.step_batch)
        last = d.step_batch
    assert order == [B(1), B(4), B(5), B(1), B(4), B(5)]


def test_round_robin_skips_empty_groups_and_includes_the_one_just_admitted() -> None:
    d = decide(
        cfg(), now=0.0, waiting=[w("a", beam=2)], running={B(1): 0, B(5): 3}, last_stepped=B(1)
    )
    assert d.admit_batch == B(2) and d.step_batch == B(2)
    wrap: Decision[str] = decide(
        cfg(), now=0.0, waiting=[], running={B(1): 0, B(5): 3}, last_stepped=B(5)
    )
    assert wrap.step_batch == B(5)


def test_idle_with_nothing_to_do_sleeps_until_work_arrives() -> None:
    for policy in ("none", "request", "iteration"):
        d: Decision[str] = decide(cfg(policy), now=7.0, waiting=[], running={})
        assert d.idle and d.wake_at is None and d == Decision()


def simulate(
    config: BatchingConfig, jobs: list[tuple[float, str, int, int]], max_ticks: int = 10_000
) -> list[str]:
    """Drive `decide` with a fake clock: jobs are (arrival, key, beam, steps to finish); each step
    advances every sentence of the stepped batch by one; one tick of 1.0 per decision.
    Checks the invariants on every decision; returns the admission order."""
    pending = sorted(jobs)
    waiting: list[Waiting] = []
    steps_left: dict[str, int] = {}
    group: dict[str, int] = {}
    admitted: list[str] = []
    last = None
    now = 0.0
    for _ in range(max_ticks):
        while pending and pending[0][0] <= now:
            t, key, beam, steps = pending.pop(0)
            waiting.append(w(key, beam, t))
            steps_left[key] = steps
        running: dict[BatchKey, int] = {}
        for beam in group.values():
            running[B(beam)] = running.get(B(beam), 0) + 1
        d = decide(config, now, waiting, running, last)
        if d.admit:
            assert d.admit[0] == waiting[0].key, "the oldest waiting sentence was overtaken"
            assert config.policy == "iteration" or not group, "joined a running batch"
            assert d.admit_batch is not None
            assert all(x.batch == d.admit_batch for x in waiting if x.key in d.admit)
            waiting = [x for x in waiting if x.key not in d.admit]
            group.update({key: d.admit_batch.beam for key in d.admit})  # type: ignore[misc]
            admitted.extend(d.admit)  # type: ignore[arg-type]
        hyps = sum(group.values())
        if len(group) > 1:  # only a lone sentence may exceed the limits
            assert hyps <= config.max_batch_hypotheses and len(group) <= config.max_batch_sentences
        if d.step_batch is not None:
            last = d.step_batch
            for key in [k for k, b in group.items() if B(b) == d.step_batch]:
                steps_left[key] -= 1
                if steps_left[key] == 0:
                    del group[key]
        if not pending and not waiting and not group:
            return admitted
        now += 1.0
    raise AssertionError("the simulation did not drain: something starved")


@pytest.mark.parametrize("policy", ["none", "request", "iteration"])
@pytest.mark.parametrize("seed", range(4))
def test_simulated_traffic_drains_without_overtaking_the_oldest(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    jobs = [
        (float(rng.randrange(0, 60)), f"s{i}", rng.choice([1, 2, 5, 16, 32]), rng.randrange(1, 12))
        for i in range(40)
    ]
    config = cfg(policy, max_batch_hypotheses=24, max_batch_sentences=6, max_queue_delay_s=2.0)
    admitted = simulate(config, jobs)
    assert sorted(admitted) == sorted(key for _, key, _, _ in jobs)


# --- request-level --------------------------------------------------------------------------


def test_request_level_waits_for_company_then_admits_after_the_delay() -> None:
    config = cfg("request", max_queue_delay_s=0.5)
    early = decide(
        config, now=10.25, waiting=[w("a", arrived=10.0), w("b", arrived=10.125)], running={}
    )
    assert early.admit == () and early.step_batch is None and early.idle
    assert early.wake_at == 10.5  # the oldest's arrival + max_queue_delay_s
    due = decide(
        config,
        now=early.wake_at,
        waiting=[w("a", arrived=10.0), w("b", arrived=10.125)],
        running={},
    )
    assert due.admit == ("a", "b") and due.step_batch == B(5)


def test_request_level_admits_a_full_batch_at_once() -> None:
    config = cfg("request", max_queue_delay_s=60.0, max_batch_sentences=2)
    d = decide(config, now=0.0, waiting=[w("a"), w("b"), w("c")], running={})
    assert d.admit == ("a", "b") and d.wake_at is None
    exact = decide(config, now=0.0, waiting=[w("a"), w("b")], running={})
    assert exact.admit == ("a", "b")  # no room for a third: full
    by_hypotheses = decide(
        cfg("request", max_queue_delay_s=60.0, max_batch_hypotheses=10),
        now=0.0,
        waiting=[w("a"), w("b")],
        running={},
    )
    assert by_hypotheses.admit == ("a", "b")


def test_request_level_admits_nothing_while_a_batch_runs() -> None:
    config = cfg("request", max_queue_delay_s=0.0)
    d = decide(config, now=100.0, waiting=[w("a", arrived=0.0)], running={B(5): 1})
    assert d.admit == () and d.step_batch == B(5) and d.wake_at is None


def test_request_level_zero_delay_admits_at_once() -> None:
    d = decide(
        cfg("request", max_queue_delay_s=0.0), now=3.0, waiting=[w("a", arrived=3.0)], running={}
    )
    assert d.admit == ("a",)


# --- no batching ----------------------------------------------------------------------------


def test_none_runs_one_request_at_a_time() -> None:
    waiting = [w("r1.0", request="r1"), w("r2.0", request="r2"), w("r1.1", request="r1")]
    d = decide(cfg("none"), now=0.0, waiting=waiting, running={})
    assert d.admit == ("r1.0", "r1.1") and d.step_batch == B(5)
    busy = decide(cfg("none"), now=0.0, waiting=[w("r2.0", request="r2")], running={B(5): 2})
    assert busy.admit == () and busy.step_batch == B(5)
    done = decide(cfg("none"), now=0.0, waiting=[w("r2.0", request="r2")], running={})
    assert done.admit == ("r2.0",)


def test_none_splits_a_request_over_the_limits_but_admits_no_one_else_meanwhile() -> None:
    config = cfg("none", max_batch_sentences=2)
    waiting = [w(f"r1.{i}", request="r1") for i in range(3)] + [w("r2.0", request="r2")]
    assert decide(config, now=0.0, waiting=waiting, running={}).admit == ("r1.0", "r1.1")
    rest = decide(config, now=0.0, waiting=waiting[2:], running={})
    assert rest.admit == ("r1.2",)


# --- deadlines ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["none", "request", "iteration"])
def test_waiting_sentences_past_their_deadline_expire(policy: str) -> None:
    config = cfg(policy, max_queue_delay_s=0.0)
    waiting = [
        w("late", deadline=5.0),
        w("now", deadline=10.0),
        w("fine", deadline=10.5),
        w("open"),
    ]
    d = decide(config, now=10.0, waiting=waiting, running={})
    assert d.expire == ("late", "now")  # a deadline equal to now has passed
    assert "late" not in d.admit and "now" not in d.admit
    assert d.admit[0] == "fine"  # the oldest live sentence is the first in line


def test_expiry_happens_while_a_batch_runs_and_nothing_can_join() -> None:
    d = decide(
        cfg("request"),
        now=2.0,
        waiting=[w("a", deadline=1.0), w("b", deadline=9.0)],
        running={B(5): 4},
    )
    assert d.expire == ("a",) and d.admit == () and d.step_batch == B(5)


def test_request_level_wake_at_follows_the_oldest_live_sentence() -> None:
    config = cfg("request", max_queue_delay_s=1.0)
    d = decide(
        config,
        now=2.5,
        waiting=[w("gone", arrived=1.0, deadline=2.0), w("b", arrived=2.0)],
        running={},
    )
    assert d.expire == ("gone",) and d.admit == () and d.wake_at == 3.0


# --- configuration --------------------------------------------------------------------------


def test_defaults_are_valid() -> None:
    config = BatchingConfig()
    assert (
        config.policy == "iteration"
        and config.max_batch_hypotheses >= config.max_batch_sentences >= 1
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"policy": "greedy"},
            r"batching policy must be one of \('none', 'request', 'iteration'\), got 'greedy'",
        ),
        ({"max_batch_hypotheses": 0}, "batch and queue limits must be >= 1"),
        ({"max_batch_sentences": -1}, "batch and queue limits must be >= 1"),
        ({"max_queue_sentences": 0}, "batch and queue limits must be >= 1"),
        ({"max_queue_delay_s": -0.001}, "max_queue_delay_s must be"),
        ({"max_queue_delay_s": float("nan")}, "max_queue_delay_s must be"),
        ({"max_queue_delay_s": float("inf")}, "max_queue_delay_s must be"),
    ],
)
def test_invalid_batching_config_is_refused_with_a_clear_message(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**kwargs)  # type: ignore[arg-type]


def test_batching_flags_are_validated_at_load() -> None:
    settings = load_settings(["--policy", "request", "--max-queue-delay-s", "0.01"], environ={})
    assert settings.batching == BatchingConfig(policy="request", max_queue_delay_s=0.01)
    with pytest.raises(ValueError, match="batching policy must be one of"):
        load_settings(["--policy", "dynamic"], environ={})
    with pytest.raises(ValueError, match="max_queue_delay_s must be"):
        load_settings([], environ={"S2S_MAX_QUEUE_DELAY_S": "nan"})


# --- several models -------------------------------------------------------------------------


def test_models_take_turns_at_admission_and_a_blocked_turn_blocks_the_flood() -> None:
    config = cfg(max_batch_hypotheses=10)
    flood = [
        Waiting(f"a{i}", f"a{i}", 5, float(i), model="A")  # type: ignore[var-annotated]
        for i in range(20)
    ]
    late = Waiting("b0", "b0", 5, 30.0, model="B")
    # A was admitted last: B's turn, though 20 of A's sentences came first
    turn = decide(config, 31.0, [*flood, late], {B(5, "A"): 1}, last_admitted="A")
    assert turn.admit == ("b0",) and turn.admit_batch == B(5, "B")
    # B's turn but no room (A's batch is full): nothing joins, A does not refill the room
    blocked = decide(config, 31.0, [*flood, late], {B(5, "A"): 2}, last_admitted="A")
    assert blocked.admit == () and blocked.step_batch == B(5, "A")
    # then A's turn again
    after = decide(config, 31.0, flood, {B(5, "A"): 1}, last_admitted="B")
    assert after.admit == ("a0",)


def test_running_batches_of_two_models_step_in_turn() -> None:
    running = {B(5, "A"): 60, B(5, "B"): 1}
    order, last = [], None
    for _ in range(4):
        d: Decision[str] = decide(cfg(), 0.0, [], running, last_stepped=last)
        order.append(d.step_batch)
        last = d.step_batch
    assert order == [B(5, "A"), B(5, "B"), B(5, "A"), B(5, "B")]


def test_simulated_flood_of_one_model_admits_the_other_within_a_few_decisions() -> None:
    """Fake clock: 200 sentences of A at t=0, one of B at t=5; B joins within a few ticks, while
    first in, first out would admit it after all of A's."""
    config = cfg(max_batch_hypotheses=40, max_batch_sentences=8)
    waiting = [Waiting(f"a{i}", f"a{i}", 5, 0.0, model="A") for i in range(200)]
    running: dict[BatchKey, int] = {}
    left: dict[str, int] = {}
    last_step, last_admitted = None, None
    for tick in range(2000):
        if tick == 5:
            waiting.append(Waiting("b", "b", 5, 5.0, model="B"))
        d: Decision[str] = decide(
            config, float(tick), waiting, running, last_step, None, last_admitted
        )
        if d.admit and d.admit_batch is not None:
            waiting = [w for w in waiting if w.key not in d.admit]
            running[d.admit_batch] = running.get(d.admit_batch, 0) + len(d.admit)
            left.update({k: 6 for k in d.admit})
            last_admitted = d.admit_batch.model
            if "b" in d.admit:
                break
        if d.step_batch is not None:  # every sentence of the stepped batch needs 6 steps
            last_step = d.step_batch
            done = [k for k in left if k[0] == str(d.step_batch.model).lower()]
            for k in done:
                left[k] -= 1
                if left[k] == 0:
                    del left[k]
                    running[d.step_batch] -= 1
    assert tick < 20, f"B joined only at tick {tick}"
    assert len(waiting) > 150  # most of A's flood was still waiting: B did overtake it


# --- turns between requests (documents) -----------------------------------------------------------


def document(name: str, sentences: int, arrived: float = 0.0) -> list[Waiting]:
    """A document's sentences: one request, queued together."""
    return [w(f"{name}.{k}", beam=4, arrived=arrived, request=name) for k in range(sentences)]


def test_a_document_alone_has_the_whole_batch() -> None:
    config = cfg(max_batch_hypotheses=40, max_batch_sentences=128)  # 10 places at beam 4
    d = decide(config, now=1.0, waiting=document("doc", 30), running={}, held={})
    assert d.admit == tuple(f"doc.{k}" for k in range(10))


def test_a_document_holds_its_share_and_the_singles_behind_it_come_first() -> None:
    """A 30-sentence document queued first, then 6 one-sentence requests, 10 places (beam 4): the
    share is 10 // 7 = 1 place each; every single joins, the document's second sentence does not."""
    config = cfg(max_batch_hypotheses=40, max_batch_sentences=128)
    singles = [w(f"s{i}", beam=4, arrived=1.0) for i in range(6)]
    d = decide(config, now=2.0, waiting=[*document("doc", 30), *singles], running={}, held={})
    assert d.admit == ("doc.0", "s0", "s1", "s2", "s3", "s4", "s5")


def test_a_requests_running_sentences_count_against_its_turn() -> None:
    """The document already runs 3 sentences: a single arriving now joins before its next one,
    though the document's sentences are older; with places over, the document takes up to its
    share (8 // 2 = 4: one more)."""
    config = cfg(max_batch_hypotheses=32, max_batch_sentences=128)  # 8 places
    waiting = [*document("doc", 27), w("late", beam=4, arrived=5.0)]
    d = decide(config, now=6.0, waiting=waiting, running={B(4): 3}, held={"doc": 3}, ready=None)
    assert d.admit == ("late", "doc.0")


def test_without_turns_a_document_queued_first_goes_first() -> None:
    """held None (no owners known): arrival order, as before."""
    config = cfg(max_batch_hypotheses=40, max_batch_sentences=128)
    singles = [w(f"s{i}", beam=4, arrived=1.0) for i in range(6)]
    d = decide(config, now=2.0, waiting=[*document("doc", 30), *singles], running={})
    assert d.admit == tuple(f"doc.{k}" for k in range(10))
