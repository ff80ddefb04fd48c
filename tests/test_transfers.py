"""The transfer ledger, and the running batch's host↔device traffic under joins and leaves.

The device here is the CPU provider's; the ledger counts the copies a GPU would make, so a bound
that holds here holds there. The workload joins sentences at most steps while others finish: the
bytes of each step must stay within what the joining sentences and the hypotheses account for,
never grow with the sentences already running. A host-side reference decoder (the runtime's
previous design: numpy buffers rebuilt on every join and leave, plain session.run) must give the
very same hypotheses.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from service.decode.engine.engine import Engine
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.runtime import OnnxModel
from service.decode.runtime.search_variant import PARAMS
from service.decode.runtime.transfers import DIRECTIONS, REASONS, TransferLedger, TransferTotals
from service.decode.search.beam import BeamSearch, SearchOptions
from service.decode.search.device_search import DeviceSearch
from service.decode.search.search import HostSearch
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.search_types import Hypothesis, StepOutput
from service.decode.text.preparation import DecodeRequest, Prepared
from service.serve.metrics import Metrics
from tests.conftest import DEFAULT_BUNDLE, needs_cuda

BEAM = 5


def test_ledger_counts_bytes_and_copies_by_direction_and_reason() -> None:
    ledger = TransferLedger()
    start = ledger.snapshot()
    ledger.record("host_to_device", "state", 1024)
    ledger.record("host_to_device", "state", 512)
    ledger.record("device_to_host", "attention", 40)
    moved = ledger.snapshot().minus(start)
    assert moved.bytes[("host_to_device", "state")] == 1536
    assert moved.copies[("host_to_device", "state")] == 2
    assert moved.total_bytes == 1576
    assert moved.by_reason()["attention"] == 40 and moved.by_reason()["tokens"] == 0
    with pytest.raises(ValueError, match="transfer must be one of"):
        ledger.record("host_to_device", "weights", 1)


def test_metrics_export_every_series_from_zero_and_sum_the_watched_ledgers() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    for direction in DIRECTIONS:
        for reason in REASONS:
            labels = {"direction": direction, "reason": reason}
            assert value("s2s_device_transfer_bytes_total", labels) == 0.0
            assert value("s2s_device_transfers_total", labels) == 0.0
    first, second = TransferLedger(), TransferLedger()
    metrics.watch_transfers(first)
    metrics.watch_transfers(second)
    metrics.watch_transfers(first)  # watched once, counted once
    first.record("device_to_host", "topk", 100)
    second.record("device_to_host", "topk", 20)
    labels = {"direction": "device_to_host", "reason": "topk"}
    assert value("s2s_device_transfer_bytes_total", labels) == 120.0
    assert value("s2s_device_transfers_total", labels) == 2.0


ENGINES = [
    "device search, graph row ops",
    "device search, host row ops",
    "host search, graph row ops",
    "host search, host row ops",
    pytest.param("device search, cuda", marks=needs_cuda),
    pytest.param("host search, cuda", marks=needs_cuda),
]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    """The default model under each search (service/decode/search/device_search.py's, the default, and
    the numpy search over the step's top k) with each kind of row ops (service/decode/runtime/device.py):
    the device graphs a GPU runs, and the numpy writes the CPU provider uses by default; on a GPU
    host, the CUDA provider itself (its ledger must count the same bytes)."""
    search, where = request.param.split(" search, ")
    if where == "cuda":
        config = RuntimeConfig(
            providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
            require_provider="cuda",
            search=search,
        )
        return Engine.load(DEFAULT_BUNDLE, config)
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",),
        intra_op_threads=1,
        row_ops=where.removesuffix(" row ops"),
        search=search,
    )
    return Engine.load(DEFAULT_BUNDLE, config)


@pytest.fixture(scope="module")
def sources(engine: Engine) -> list[Prepared]:
    lines = (DEFAULT_BUNDLE.parent.parent / "docs" / "eval" / "test.tsv").read_text().splitlines()
    return [engine.prepare(line.split("\t")[0]) for line in lines[:120]]


@dataclass(frozen=True)
class StepRecord:
    bytes: int
    bound: int
    batch_bound: int  # what re-uploading the running sentences' encoder rows alone would cost
    joined: int
    left: int
    feeding: bool  # sentences were still waiting to join


def joining_requests(
    joining: list[tuple[int, Prepared]], rng: random.Random
) -> list[DecodeRequest]:
    """The joining sentences as requests, each with a random short length limit."""
    return [
        DecodeRequest(
            i,
            sentence,
            SearchOptions(beam_size=BEAM, max_length_a=1.0, max_length_b=rng.randint(2, 8)),
            "none",
        )
        for i, sentence in joining
    ]


def host_search_bytes(N: int, k: int, S: int, finished: int) -> tuple[int, int]:
    """The host search's (step, leave) bound: each step's tokens, back-pointers, k, top-k and
    attention rows; each leave's moved rows' indices and a refit's pads."""
    step_bytes = N * (8 + 8) + 8 + N * k * (4 + 8) + N * S * 4
    leave_bytes = 2 * 8 * finished + 32 * 8
    return step_bytes, leave_bytes


def device_search_bytes(
    moved: TransferTotals,
    device: DeviceSearch,
    running: int,
    B_before: int,
    n: int,
    left_before: int,
    S: int,
) -> tuple[int, int]:
    """The device search's (step, leave) bound, its step's copies checked on the way: one done
    flag per sentence, no top-k and no attention, and nothing else on a step where nobody joined,
    left or finished."""
    N = running * BEAM
    W = device.sentence_rows
    assert moved.by_reason()["topk"] == moved.by_reason()["attention"] == 0
    changed = bool(n or left_before)
    # the done flags; when sentences joined or left, the index array that picks the batch
    # and the joining sentences' fields, tokens and back-pointers, and settings
    join_fields = n * (W + 2 * BEAM + len(PARAMS)) * 8
    step_bytes = running + (8 * running + join_fields if changed else 0)
    step_bytes += 2 * 2 * 8 * N  # the index buffers grown, when the batch outgrows them
    T = S + 8  # the longest a sentence of this workload decodes (max_length_a 1, b <= 8)
    done = B_before - len(device)  # entries (segments) done at this step
    assert moved.by_reason()["done"] == running == B_before  # one flag per sentence
    if not changed and not done:  # nobody joined, left or finished: the flags, nothing else
        assert moved.total_bytes == running, moved.bytes
    leave_bytes = done * (W * 8 + T * BEAM * (2 + S) * 4 + 2 * 8) + 32 * 8
    return step_bytes, leave_bytes


def test_bytes_per_step_follow_the_joining_sentences_and_hypotheses_not_the_batch(
    engine: Engine, sources: list[Prepared]
) -> None:
    ledger = engine.model.transfers
    batch = engine.new_batch(BEAM)
    k = BEAM + 1  # the search asks for K + 1 candidates per hypothesis
    rng = random.Random(0)
    pending = list(enumerate(sources))
    records: list[StepRecord] = []
    left_before = 0  # entries that left at the last step (the batch changed since)
    while pending or len(batch):
        joining = [pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 1, 2, 3])))]
        before = ledger.snapshot()
        # encodes them here: one encoder call, its outputs downloaded
        batch.add(joining_requests(joining, rng))
        running = len(batch)
        if not running:
            continue
        device = next((s for s in batch.searches if isinstance(s, DeviceSearch)), None)
        host = batch.searches[-1]
        assert isinstance(host, HostSearch)
        rows = host.decoder.rows if device is None else device.rows
        S = rows.source_len  # the attention row's width at this step
        B_before = 0 if device is None else len(device)
        finished = batch.step()
        moved = ledger.snapshot().minus(before)
        D, Dk = rows.D, rows.Dk  # set by the first join, kept after the batch empties
        # each decoded part joins as a row: a segmented sentence's segments, else the sentence
        parts = [part for _, sentence in joining for part in sentence.parts]
        S_join = max((len(part.ids) for part in parts), default=0)
        n = len(parts)
        # the encoder's outputs stay on the device from the encoder to the running batch
        assert moved.by_reason()["encoder_rows"] == moved.by_reason()["state"] == 0
        join_bytes = n * (S_join * 8 + 8 + 2 * 8)  # source ids and length up; 2 row indices
        join_bytes += 4 * 8 * 8  # an empty initial state's shape, a refit's pads (by graph)
        if device is None:
            step_bytes, leave_bytes = host_search_bytes(running * BEAM, k, S, len(finished))
        else:
            step_bytes, leave_bytes = device_search_bytes(
                moved, device, running, B_before, n, left_before, S
            )
        left_before = 0 if device is None else B_before - len(device)  # entries (segments) done
        records.append(
            StepRecord(
                bytes=moved.total_bytes,
                bound=join_bytes + step_bytes + leave_bytes,
                batch_bound=running * rows.source_len * (D + Dk) * 4,
                joined=n,
                left=len(finished),
                feeding=bool(pending),
            )
        )
    assert len(records) > 50
    # the workload is what continuous batching does: joins and leaves on most steps
    steady = [r for r in records[10:] if r.feeding]
    assert sum(r.joined > 0 for r in steady) > 0.6 * len(steady)
    assert sum(r.left > 0 for r in steady) > 0.5 * len(steady)
    over = [r for r in records if r.bytes > r.bound]
    assert not over, f"{len(over)} steps moved more than the bound, e.g. {over[0]}"
    # the bound is tight enough to matter: re-uploading the running batch's rows would break it
    busy = [r for r in records if r.joined or r.left]
    assert sum(r.batch_bound > r.bound for r in busy) > 0.5 * len(busy)


class HostReferenceDecoder:
    """The runtime's previous design, kept as the reference: encoder rows and states in host numpy,
    rebuilt on every join and leave, and a plain session.run per step."""

    def __init__(self, model: OnnxModel) -> None:
        self.session = model.decoder
        self.k_on_host = model.k_on_host  # the session's k: (1,) where TopK reads it directly
        self.values: Any = None  # (B, S, D) once sentences joined
        self.keys: Any = None  # (B, S or 1, Dk)
        self.mask: Any = None  # (B, S) bool
        self.state: Any = None  # (R, D_state)
        self.lengths = np.zeros(0, np.int64)

    def add_sentences(self, sentences: Sequence[EncodedSentence]) -> int:
        offset = 0 if self.state is None else len(self.state)
        S = max(
            [s.length for s in sentences] + ([self.mask.shape[1]] if self.mask is not None else [])
        )
        n = len(sentences)
        values = np.zeros((n, S, sentences[0].values.shape[1]), np.float32)
        keys = np.zeros((n, S, sentences[0].keys.shape[1]), np.float32)
        mask = np.zeros((n, S), bool)
        for i, s in enumerate(sentences):
            values[i, : s.length], keys[i, : s.length], mask[i, : s.length] = s.values, s.keys, True
        new_state = np.stack([s.state for s in sentences])
        if self.values is None:
            self.values, self.keys, self.mask, self.state = values, keys, mask, new_state
        else:
            pad = S - self.mask.shape[1]
            self.values = np.concatenate([np.pad(self.values, ((0, 0), (0, pad), (0, 0))), values])
            self.keys = np.concatenate([np.pad(self.keys, ((0, 0), (0, pad), (0, 0))), keys])
            self.mask = np.concatenate([np.pad(self.mask, ((0, 0), (0, pad))), mask])
            self.state = np.concatenate([self.state, new_state])
        self.lengths = np.concatenate([self.lengths, [s.length for s in sentences]])
        return offset

    def keep_sentences(self, keep: np.ndarray) -> None:
        if len(keep) == 0:
            self.values = self.keys = self.mask = self.state = None
            self.lengths = np.zeros(0, np.int64)
            return
        self.values, self.keys, self.mask = self.values[keep], self.keys[keep], self.mask[keep]
        self.lengths = self.lengths[keep]
        needed = int(self.lengths.max())
        if needed <= self.mask.shape[1] // 2:  # the runtime's shrink rule, so S is the same
            self.values, self.keys, self.mask = (
                self.values[:, :needed],
                self.keys[:, :needed],
                self.mask[:, :needed],
            )

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        log_probs, token_ids, new_state, attention = self.session.run(
            None,
            {
                "tokens": tokens,
                "reorder": reorder,
                "k": np.array([k] if self.k_on_host else k, np.int64),
                "state": self.state,
                "values": np.ascontiguousarray(self.values),
                "keys": np.ascontiguousarray(self.keys),
                "mask": np.ascontiguousarray(self.mask),
            },
        )
        self.state = new_state
        return StepOutput(log_probs=log_probs, token_ids=token_ids, attention=attention)


def churn(
    model: OnnxModel, decoder: object, sources: list[list[int]]
) -> dict[Hashable, list[Hypothesis]]:
    """Sentences joining 0-3 at a time before each step, with lengths 2-12 steps, until all finish."""
    rng = random.Random(1)
    vocab = model.bundle.architecture.tgt_vocab_size
    search = BeamSearch(decoder, BEAM, bos_id=1, eos_id=2, vocab_size=vocab)  # type: ignore[arg-type]
    encoded = model.encode_sentences(sources)
    pending = list(range(len(sources)))
    results: dict[Hashable, list[Hypothesis]] = {}
    while pending or not search.is_empty:
        joining = [pending.pop(0) for _ in range(min(len(pending), rng.choice([0, 1, 2, 3])))]
        if joining:
            row = decoder.add_sentences([encoded[i] for i in joining])  # type: ignore[attr-defined]
            for j, i in enumerate(joining):
                options = SearchOptions(
                    beam_size=rng.choice([1, 3, BEAM]),
                    max_length_a=0.5,
                    max_length_b=rng.randint(2, 12),
                    return_attention=True,
                )
                search.add(i, len(sources[i]), options, state_row=row + j)
        results.update(search.step())
    return results


def test_device_resident_batch_gives_the_host_reference_results_exactly(
    engine: Engine, sources: list[Prepared]
) -> None:
    model = engine.model
    ids = [s.ids for s in sources[:60]]
    got = churn(model, model.new_decoder(), ids)
    want = churn(model, HostReferenceDecoder(model), ids)
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key])
        for g, w in zip(got[key], want[key], strict=True):
            assert g.tokens == w.tokens and g.score == w.score and g.log_prob == w.log_prob
            assert g.attention is not None and w.attention is not None
            assert np.array_equal(g.attention, w.attention)
