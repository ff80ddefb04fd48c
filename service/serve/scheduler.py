"""The batching policy as a pure decision: who joins the running batches, which batch steps, when to wake.

`decide` sees plain data (the waiting sentences, the running batches' sizes, the clock's reading) and
returns a `Decision`; the worker applies it. Tests drive it with a fake clock.

Running batches are keyed by (model version, beam size): every sentence in a batch belongs to one loaded
model version and has the same number of hypothesis slots, so one decoder call advances them all.
Align's pairs (teacher-forced, one hypothesis each) have batches of their own, keyed forced=True,
under the same admission, limits and turns.

Fairness across models: admission takes turns between the models with waiting sentences (the model
admitted last yields to another model that has work), and a model whose turn it is blocks the others'
admissions until its oldest sentence fits, so a flood of one model's requests delays another model's
sentence by at most the time for a running sentence to finish; stepping takes turns between the
running batches, so a small batch of one model steps as often as a large one of another.

Policies:
- "none": one request at a time; its sentences decode together, nothing joins until it is done.
- "request": request-level (static) batching: waiting sentences form a batch when it is full or the
  oldest has waited `max_queue_delay_s`; the batch decodes to the end before the next one forms.
- "iteration": iteration-level batching (Orca, TGI, vLLM): before every step, waiting sentences join
  the running batch of their beam size while capacity allows, in turns between their requests,
  each request within its share of the batch (`fair_share`: a document's sentences neither fill
  the batch nor hold back the requests behind it); finished ones have already left.
  While anything runs, only sentences already encoded (`ready`, see `service.decode.engine.encode_ahead`) join,
  so an admission never stalls the running batch for an encoder call.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Container, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, TypeVar

Policy = Literal["none", "request", "iteration"]
POLICIES: tuple[str, ...] = ("none", "request", "iteration")


@dataclass(frozen=True)
class BatchingConfig:
    """How the decode loop batches (service/serve/config.py reads each field's help for --help)."""

    policy: Policy = field(
        default="iteration",
        metadata={
            "help": "batching policy: none (one request at a time), request (whole requests "
            "batched together), iteration (sentences join and leave the running batch at every "
            "decoder step)",
            "choices": POLICIES,
        },
    )
    max_batch_hypotheses: int = field(
        default=320,
        metadata={"help": "the most hypotheses (sentences x beam) decoded together, all beams"},
    )
    max_batch_sentences: int = field(
        default=128, metadata={"help": "the most sentences decoded together"}
    )
    max_queue_delay_s: float = field(
        default=0.004,
        metadata={
            "help": "policy request: how long the oldest queued request may wait for company"
        },
    )
    max_queue_sentences: int = field(
        default=2048,
        metadata={
            "help": "queued sentences beyond which requests are refused (RESOURCE_EXHAUSTED)"
        },
    )
    encode_ahead: bool = field(
        default=True,
        metadata={"help": "encode queued sentences on a second thread while the decoder steps"},
    )

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"batching policy must be one of {POLICIES}, got {self.policy!r}")
        if min(self.max_batch_hypotheses, self.max_batch_sentences, self.max_queue_sentences) < 1:
            raise ValueError("batch and queue limits must be >= 1")
        # NaN or inf would stall or crash the decode loop.
        if not 0 <= self.max_queue_delay_s < math.inf:
            raise ValueError(
                f"max_queue_delay_s must be a finite number >= 0, got {self.max_queue_delay_s}"
            )


KeyT = TypeVar("KeyT", bound=Hashable)
RequestT = TypeVar("RequestT", bound=Hashable)


@dataclass(frozen=True)
class Waiting(Generic[KeyT, RequestT]):
    """A queued sentence, as the scheduler sees it: typed by what its user keys it with (the
    worker: `Waiting[SentenceKey, Job]`); the policy only compares keys and requests."""

    key: KeyT
    request: RequestT
    beam_size: int
    arrived: float  # clock reading
    deadline: float | None = None
    model: Hashable = (
        None  # the loaded model version it decodes with (the worker's: a ModelVersion)
    )
    forced: bool = False  # Align's teacher-forced pass (the target given) rather than a search
    attention: Hashable = None  # Align's choice of cross-attention (AlignOptions.attention)
    owner: Hashable = (
        None  # whose it is, for fair turns (the worker: its request id); None: request
    )

    @property
    def batch(self) -> BatchKey:
        return BatchKey(self.model, self.beam_size, self.forced, self.attention)


class BatchKey(NamedTuple):
    """Which running batch a sentence decodes in: one model version, one beam size, one pass (a
    beam search, or Align's teacher forcing: one hypothesis per pair, beam 1), and for Align one
    choice of cross-attention (its pairs share the decoder graph that reads it)."""

    model: Hashable
    beam: int
    forced: bool = False
    attention: Hashable = None


@dataclass(frozen=True)
class Decision(Generic[KeyT]):
    expire: tuple[KeyT, ...] = ()  # waiting sentences whose deadline has passed
    admit: tuple[KeyT, ...] = ()  # waiting sentences that join the batch `admit_batch`
    admit_batch: BatchKey | None = None
    step_batch: BatchKey | None = None  # the batch to advance by one step
    wake_at: float | None = None  # nothing to step: sleep until then (None: until work arrives)

    @property
    def idle(self) -> bool:
        return self.step_batch is None and not self.admit


@dataclass
class Groups:
    """Sentences per running batch, keyed by (model version, beam size)."""

    sentences: dict[BatchKey, int] = field(default_factory=dict)

    def hypotheses(self) -> int:
        return sum(key.beam * n for key, n in self.sentences.items())

    def total(self) -> int:
        return sum(self.sentences.values())


def decide(
    config: BatchingConfig,
    now: float,
    waiting: Sequence[Waiting[KeyT, Any]],
    running: Mapping[BatchKey, int],
    last_stepped: BatchKey | None = None,
    ready: Container[Hashable] | None = None,
    last_admitted: Hashable = None,
    held: Mapping[Hashable, int] | None = None,
) -> Decision[KeyT]:
    """waiting in arrival order; running maps each running batch → sentences decoding in it; ready
    holds the waiting sentences already encoded (None: all of them); last_admitted is the model of
    the previous admission (whose turn has passed); held: the running sentences of each owner
    (`Waiting.owner`), for the turns between requests (`fair_share`; None: arrival order)."""
    expired = tuple(w.key for w in waiting if w.deadline is not None and w.deadline <= now)
    alive = [w for w in waiting if w.deadline is None or w.deadline > now]
    groups = Groups({BatchKey(*key): n for key, n in running.items() if n > 0})
    if config.policy == "iteration":
        model = model_in_turn(alive, last_admitted)
        turn = [w for w in alive if w.model == model]
        admit, batch = admit_fifo(config, turn, groups, ready, held)
    elif config.policy == "request":
        admit, batch = admit_static_batch(config, now, alive, groups)
    else:
        admit, batch = admit_one_request(config, alive, groups)
    if admit and batch is not None:
        groups.sentences[batch] = groups.sentences.get(batch, 0) + len(admit)
    step_batch = next_group(groups, last_stepped)
    wake_at = None
    if step_batch is None and alive and config.policy == "request":
        wake_at = alive[0].arrived + config.max_queue_delay_s
    return Decision(
        expire=expired,
        admit=admit,
        admit_batch=batch if admit else None,
        step_batch=step_batch,
        wake_at=wake_at,
    )


def model_in_turn(alive: Sequence[Waiting[Any, Any]], last_admitted: Hashable) -> Hashable:
    """The model whose sentences may join next: the one with the oldest waiting sentence, except the
    model admitted last when another model has sentences waiting (round-robin between models)."""
    models = list(dict.fromkeys(w.model for w in alive))  # by their oldest waiting sentence
    if len(models) > 1 and models[0] == last_admitted:
        return models[1]
    return models[0] if models else None


def fits(config: BatchingConfig, groups: Groups, beam: int, extra: int) -> bool:
    """`extra` more sentences of beam `beam` fit within the limits, summed over every batch."""
    return (
        groups.hypotheses() + beam * extra <= config.max_batch_hypotheses
        and groups.total() + extra <= config.max_batch_sentences
    )


def take_fifo(
    config: BatchingConfig, candidates: Sequence[Waiting[KeyT, Any]], groups: Groups
) -> tuple[KeyT, ...]:
    """The longest arrival-order prefix of candidates (one beam size) that fits, at least one sentence
    when nothing runs (a lone request larger than the limits must still make progress)."""
    taken: list[KeyT] = []
    for w in candidates:
        if not fits(config, groups, w.beam_size, len(taken) + 1):
            break
        taken.append(w.key)
    if not taken and candidates and groups.total() == 0:
        taken.append(candidates[0].key)
    return tuple(taken)


def admit_fifo(
    config: BatchingConfig,
    alive: Sequence[Waiting[KeyT, Any]],
    groups: Groups,
    ready: Container[Hashable] | None = None,
    held: Mapping[Hashable, int] | None = None,
) -> tuple[tuple[KeyT, ...], BatchKey | None]:
    """Iteration-level (alive: the waiting sentences of the model in turn): the oldest sentence's
    batch joins, in arrival order (with `held`: in turns between requests, each within its share,
    `fair_share`), while it fits. Nobody overtakes the oldest: if it does not fit, nothing joins
    until capacity frees up. While anything runs, the joining prefix also ends at the first
    sentence not yet encoded."""
    if not alive:
        return (), None
    batch = alive[0].batch
    candidates = [w for w in alive if w.batch == batch]
    if held is not None:
        candidates = fair_share(config, candidates, batch.beam, held)
    if ready is not None and groups.total():
        candidates = list(itertools.takewhile(lambda w: w.key in ready, candidates))
    return take_fifo(config, candidates, groups), batch


def fair_share(
    config: BatchingConfig,
    candidates: Sequence[Waiting[KeyT, Any]],
    beam: int,
    held: Mapping[Hashable, int],
) -> list[Waiting[KeyT, Any]]:
    """The waiting sentences (of one batch) in turns between their requests, each request within
    its share of the batch. A sentence's turn is the number of its request's sentences running
    (`held`) or ahead of it in the queue; turns go in order, arrival order within a turn, so every
    request's next sentence comes before any request's one after (the oldest sentence, its
    request's first, still comes first). A request's share is the batch's places over the
    requests with sentences running or waiting: a document of 40 sentences beside 24 one-sentence
    requests holds a few places, not 40, and neither fills the batch (each step's time grows with
    it) nor keeps the requests behind it waiting; alone, it has the whole batch."""
    if not candidates:
        return []
    owners = [owner_of(w) for w in candidates]
    everyone = {o for o, n in held.items() if n > 0} | set(owners)
    places = min(config.max_batch_sentences, config.max_batch_hypotheses // max(beam, 1))
    share = max(1, places // len(everyone))
    seen = dict(held)
    turns = []
    for owner in owners:
        turns.append(seen.get(owner, 0))
        seen[owner] = turns[-1] + 1
    order = sorted(range(len(candidates)), key=lambda i: turns[i])  # stable: arrival in a turn
    return [candidates[i] for i in order if turns[i] < share]


def owner_of(w: Waiting[Any, Any]) -> Hashable:
    """Whose a waiting sentence is, for the turns: its owner, else its request."""
    return w.request if w.owner is None else w.owner


def admit_static_batch(
    config: BatchingConfig, now: float, alive: Sequence[Waiting[KeyT, Any]], groups: Groups
) -> tuple[tuple[KeyT, ...], BatchKey | None]:
    """Request-level: only when nothing runs; when the batch is full or the oldest has waited long enough."""
    if groups.total() or not alive:
        return (), None
    key = alive[0].batch
    same_batch = [w for w in alive if w.batch == key]
    batch = take_fifo(config, same_batch, groups)
    full = len(batch) < len(same_batch) or not fits(config, groups, key.beam, len(batch) + 1)
    if full or now - alive[0].arrived >= config.max_queue_delay_s:
        return batch, key
    return (), None


def admit_one_request(
    config: BatchingConfig, alive: Sequence[Waiting[KeyT, Any]], groups: Groups
) -> tuple[tuple[KeyT, ...], BatchKey | None]:
    """No batching: the oldest request's sentences alone, once nothing else runs."""
    if groups.total() or not alive:
        return (), None
    request = alive[0].request
    return take_fifo(config, [w for w in alive if w.request == request], groups), alive[0].batch


def batch_order(key: BatchKey) -> tuple[str, int, bool]:
    """A stable order of running batches: by model (its str), then beam size, then pass."""
    return str(key.model), key.beam, key.forced


def next_group(groups: Groups, last_stepped: BatchKey | None) -> BatchKey | None:
    """Round-robin over the running batches (model version, beam size), so no model and no beam
    size starves another."""
    keys = sorted((k for k, n in groups.sentences.items() if n > 0), key=batch_order)
    if not keys:
        return None
    after = None if last_stepped is None else batch_order(BatchKey(*last_stepped))
    later = [k for k in keys if after is None or batch_order(k) > after]
    return later[0] if later else keys[0]
