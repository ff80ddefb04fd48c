"""EncoderRows: the running batch's encoder buffers, appended and compacted in place on the device
(the CPU provider here); length buckets; the CUDA provider's options."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from service.decode.engine.engine import Engine
from service.decode.runtime.device import Device
from service.decode.runtime.encoded import (
    CALL_COST_SENTENCES,
    Encoded,
    EncodedSentence,
    length_buckets,
    split_sentences,
)
from service.decode.runtime.encoder_rows import EncoderRows
from service.decode.runtime.row_ops import RowOps, RowUpdates, make_row_ops
from service.decode.runtime.sessions import cuda_provider_options, provider_options
from service.decode.runtime.step_graph import float16_decoder
from service.decode.runtime.transfers import TransferLedger
from service.decode.search.beam import compaction_order
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from tests.conftest import DEFAULT_BUNDLE, needs_cuda


def rows_on_host(rows: EncoderRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running batch's values (B, S, D), keys (B, S or 1, Dk) and mask (B, S), copied to the
    host for inspection (the decode loop never reads them back)."""
    assert rows.buffers is not None
    download = rows.ops.device.download
    values, keys, mask = (download(b, "encoder_rows")[: rows.count] for b in rows.buffers)
    return values, keys, mask


@pytest.fixture(scope="module", params=["graph", "host", pytest.param("cuda", marks=needs_cuda)])
def ops(request: pytest.FixtureRequest) -> RowUpdates:
    """Both row-op kinds on the CPU: the device graphs a GPU runs, and the numpy writes the CPU
    provider uses by default; and, on a GPU host, the graphs on CUDA. Every test below must hold
    for each."""
    if request.param == "cuda":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        device = Device("cuda", 0, TransferLedger())
        return make_row_ops(
            device, providers, provider_options(providers, RuntimeConfig()), "graph"
        )
    device = Device("cpu", 0, TransferLedger())
    return make_row_ops(device, ["CPUExecutionProvider"], [{}], request.param)


def sentence_rows(
    rng: np.random.Generator, lengths: list[int], D: int = 3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    S = max(lengths)
    mask = np.arange(S)[None, :] < np.array(lengths)[:, None]  # (n, S)
    values = rng.standard_normal((len(lengths), S, D)).astype(np.float32) * mask[..., None]
    keys = values[..., :2] * 2.0
    return values, keys, mask


def as_sentences(
    values: np.ndarray, keys: np.ndarray, mask: np.ndarray, keys_follow_source: bool = True
) -> list[EncodedSentence]:
    """Padded (n, S, ·) rows → what the encoder hands the batch: one array set per sentence."""
    out = []
    for i, n in enumerate(mask.sum(axis=1).tolist()):
        key_rows = keys[i, :n] if keys_follow_source else keys[i]
        out.append(EncodedSentence(values[i, :n], key_rows, np.zeros(2, np.float32)))
    return out


def expected(
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same rows concatenated and zero-padded to the longest: what the buffers must show."""
    S = max(int(m.sum()) for _, _, m in rows)
    pad = [
        (v[:S] if v.shape[0] >= S else np.pad(v, ((0, S - v.shape[0]), (0, 0)))) for v, _, _ in rows
    ]
    padk = [
        (k[:S] if k.shape[0] >= S else np.pad(k, ((0, S - k.shape[0]), (0, 0)))) for _, k, _ in rows
    ]
    padm = [(m[:S] if m.shape[0] >= S else np.pad(m, (0, S - m.shape[0]))) for _, _, m in rows]
    return np.stack(pad), np.stack(padk), np.stack(padm)


def test_append_grow_compact_and_shrink_keep_rows_in_order(ops: RowUpdates) -> None:
    rng = np.random.default_rng(0)
    buf = EncoderRows(ops, keys_follow_source=True)
    model: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    # grows S (3 → 5 → 9) and capacity (16 → more)
    for lengths in (
        [3, 1],
        [5],
        [2, 2, 2] * 6,
        [9],
        [1],
    ):
        values, keys, mask = sentence_rows(rng, lengths)
        buf.append(as_sentences(values, keys, mask))
        model += [(values[i], keys[i], mask[i]) for i in range(len(lengths))]
    for keep in (
        [0, 2, 3, 5, 7, 8, 9, 10, 11, 20, 21, 22],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        [1, 3, 4],
    ):
        buf.keep(np.array(keep))
        model = [model[i] for i in keep]
        values, keys, mask = rows_on_host(buf)
        want_v, want_k, want_m = expected(model)
        S = want_m.shape[1]
        assert np.array_equal(mask[:, :S], want_m) and not mask[:, S:].any()
        assert np.allclose(values[:, :S], want_v) and np.allclose(keys[:, :S], want_k)
    assert buf.source_len <= 2 * max(
        int(m.sum()) for _, _, m in model
    )  # the 9-long row left: S shrank
    buf.keep(np.array([], dtype=np.int64))
    assert buf.count == 0 and buf.buffers is None


def test_fixed_context_keys_do_not_follow_the_source_axis(ops: RowUpdates) -> None:
    rng = np.random.default_rng(1)
    buf = EncoderRows(ops, keys_follow_source=False)
    for lengths in ([4], [7, 2]):
        values, _, mask = sentence_rows(rng, lengths)
        summary = rng.standard_normal((len(lengths), 1, 3)).astype(np.float32)
        buf.append(as_sentences(values, summary, mask, keys_follow_source=False))
    _, keys, mask = rows_on_host(buf)
    assert keys.shape == (3, 1, 3) and mask.shape == (3, 7)


def bucket_cost(lengths: list[int], buckets: list[list[int]]) -> float:
    return sum((len(b) + CALL_COST_SENTENCES) * max(lengths[i] for i in b) for b in buckets)


def contiguous_splits(items: list[int]) -> Iterator[list[list[int]]]:
    """Every split of items into contiguous non-empty groups."""
    if not items:
        yield []
        return
    for cut in range(1, len(items) + 1):
        for rest in contiguous_splits(items[cut:]):
            yield [items[:cut], *rest]


@pytest.mark.parametrize("seed", range(12))
def test_length_buckets_cover_every_sentence_once_at_the_least_modelled_cost(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 80, size=int(rng.integers(1, 9))).tolist()
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = min(bucket_cost(lengths, split) for split in contiguous_splits(by_length))
    assert bucket_cost(lengths, buckets) == pytest.approx(best)


def test_length_buckets_keep_equal_lengths_together_and_split_outliers() -> None:
    assert length_buckets([12] * 10) == [list(range(10))]
    buckets = length_buckets([15, 16, 14, 70, 15, 15])
    assert [sorted(b) for b in buckets] == [[0, 1, 2, 4, 5], [3]]


def test_compaction_keep_moves_only_the_rows_that_change_place_in_place(
    ops: RowUpdates,
) -> None:
    rng = np.random.default_rng(3)
    buf = EncoderRows(ops, keys_follow_source=True)
    values, keys, mask = sentence_rows(rng, [2, 3, 4, 5, 6])
    buf.append(as_sentences(values, keys, mask))
    before = rows_on_host(buf)[0].copy()
    assert buf.buffers is not None
    pointers = [b.data_ptr() for b in buf.buffers]
    moved = ops.device.ledger.snapshot()
    buf.keep(compaction_order(np.array([False, True, False, False, True])))  # rows 1, 4 leave
    moved = ops.device.ledger.snapshot().minus(moved)
    # the same device memory, written in place
    assert [b.data_ptr() for b in buf.buffers] == pointers
    # only the row indices crossed (src and dst of the one row that moved, as int64) for the
    # graphs; nothing for numpy writes in host memory
    want = 2 * 8 if isinstance(ops, RowOps) else 0
    assert moved.total_bytes == moved.by_reason().get("indices", 0) == want
    after, _, after_mask = rows_on_host(buf)
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[2], before[2])
    assert np.array_equal(after[1], before[3])  # the one survivor beyond the end filled row 1
    assert after_mask.sum(axis=1).tolist() == [2, 5, 4]


def test_a_join_uploads_only_the_joining_rows_at_their_own_length(ops: RowUpdates) -> None:
    rng = np.random.default_rng(4)
    buf = EncoderRows(ops, keys_follow_source=True)
    values, keys, mask = sentence_rows(rng, [9] * 10)  # S = 9, capacity 20
    buf.append(as_sentences(values, keys, mask))
    joining = as_sentences(*sentence_rows(rng, [3, 2]))
    before = ops.device.ledger.snapshot()
    buf.append(joining)
    moved = ops.device.ledger.snapshot().minus(before)
    D, Dk = 3, 2
    rows = moved.bytes[("host_to_device", "encoder_rows")]
    assert rows == 2 * 3 * (D + Dk) * 4 + 2 * 3  # values and keys float32, mask bool, at S = 3
    if isinstance(ops, RowOps):  # the graphs also take row numbers and pads per buffer
        assert moved.by_reason()["indices"] == 2 * 8 + (6 + 6 + 4) * 8
    assert moved.bytes[("device_to_host", "encoder_rows")] == 0
    got_v, _, got_m = rows_on_host(buf)
    assert got_m.sum(axis=1).tolist() == [9] * 10 + [3, 2]
    assert np.array_equal(got_v[10, :3], joining[0].values) and not got_v[10, 3:].any()


def test_cuda_provider_options_are_set_on_purpose() -> None:
    options = cuda_provider_options(RuntimeConfig(device_id=1, cuda_mem_limit_mb=512))
    assert options == {
        "device_id": "1",
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "1",
        "use_tf32": "0",
        "gpu_mem_limit": str(512 * 1024 * 1024),
    }
    assert "gpu_mem_limit" not in cuda_provider_options(RuntimeConfig())
    both = provider_options(["CUDAExecutionProvider", "CPUExecutionProvider"], RuntimeConfig())
    assert both[1] == {} and both[0]["arena_extend_strategy"] == "kSameAsRequested"
    with pytest.raises(ValueError, match="cuda_arena_extend"):
        RuntimeConfig(cuda_arena_extend="kDouble")


@pytest.mark.parametrize(
    "providers",
    [
        ("CPUExecutionProvider",),
        pytest.param(("CUDAExecutionProvider", "CPUExecutionProvider"), marks=needs_cuda),
    ],
    ids=["cpu", "cuda"],
)
def test_public_binds_give_the_same_translations_as_the_fast_ones(
    providers: tuple[str, ...],
) -> None:
    """service/decode/runtime/device.py binds through onnxruntime's private C-level objects where a release has
    them (a join or a leave binds six times) and through IOBinding's public calls where it does not:
    both paths must decode the same, joins and leaves included."""
    from service.decode.engine.engine import Engine
    from service.decode.shared.options import SearchOptions
    from tests.conftest import DEFAULT_BUNDLE

    texts = ["ninety-seven", "March 5, 2021, then $3.50", "one", "the 21st of May and 4:05 PM"]
    options = SearchOptions(beam_size=4, n_best=2)
    engine = Engine.load(DEFAULT_BUNDLE, RuntimeConfig(providers=providers))
    assert engine.model.providers[0] == providers[0]
    assert engine.model.device.fast_binds  # the onnxruntime installed here exposes them
    fast = engine.translate(texts, options, "subword")
    engine.model.device.fast_binds = False
    public = engine.translate(texts, options, "subword")
    for a, b in zip(fast, public, strict=True):
        assert [h.text for h in a.hypotheses] == [h.text for h in b.hypotheses]
        assert [h.score for h in a.hypotheses] == [h.score for h in b.hypotheses]
        for ha, hb in zip(a.hypotheses, b.hypotheses, strict=True):
            assert ha.alignment is not None and hb.alignment is not None
            np.testing.assert_array_equal(ha.alignment.matrix, hb.alignment.matrix)


def device_rows(
    ops: RowUpdates, values: np.ndarray, keys: np.ndarray, mask: np.ndarray
) -> list[EncodedSentence]:
    """Padded (n, S, ·) rows as an encoder call leaves them on the device: one EncodedSentence
    per row of its outputs (the padding past a sentence's length holds what the encoder wrote)."""
    device = ops.device
    state = np.arange(len(mask) * 2, dtype=np.float32).reshape(-1, 2)  # (n, 2)
    batch = Encoded(
        values=device.upload(values, "encoder_rows"),
        keys=device.upload(keys, "encoder_rows"),
        mask=device.upload(mask, "encoder_rows"),
        state=device.upload(state, "state"),
        device=device,
    )
    return split_sentences(batch, mask.sum(axis=1), keys_follow_source=True)


def test_a_join_of_rows_left_on_the_device_copies_them_there(ops: RowUpdates) -> None:
    """Sentences whose encoder outputs never left the device join with indices alone: the buffers
    and the state hold what the same rows joined from the host would give, on every position a
    sentence has (past its length a row holds what the encoder wrote there, or zeros past the
    encoder call's longest: the mask covers both, and the attention gives them weight 0)."""
    rng = np.random.default_rng(5)
    host = EncoderRows(ops, keys_follow_source=True)
    on_device = EncoderRows(ops, keys_follow_source=True)
    first = sentence_rows(rng, [6, 4])
    values, keys, mask = sentence_rows(rng, [3, 7, 2])
    garbage = (~mask[..., None]).astype(np.float32)  # an encoder's outputs past a sentence's end
    values, keys = values + 5.0 * garbage, keys - 3.0 * garbage
    sentences = device_rows(ops, values, keys, mask)
    host_state = host.append(as_sentences(*first))
    host_state = host.append([EncodedSentence(*s.arrays()) for s in sentences], host_state)
    device_state = on_device.append(as_sentences(*first))
    before = ops.device.ledger.snapshot()
    device_state = on_device.append(sentences, device_state)
    moved = ops.device.ledger.snapshot().minus(before)
    assert moved.total_bytes == moved.by_reason()["indices"]  # no row, no state crosses
    (got_v, got_k, got_m), (want_v, want_k, want_m) = rows_on_host(on_device), rows_on_host(host)
    assert np.array_equal(got_m, want_m)
    assert np.array_equal(got_v[got_m], want_v[want_m])
    assert np.array_equal(got_k[got_m], want_k[want_m])
    assert not want_v[~want_m].any()  # the host's rows are zero-padded
    assert np.array_equal(device_state.numpy(), host_state.numpy())
    assert on_device.lengths[: on_device.count].tolist() == [6, 4, 3, 7, 2]


def test_the_float16_decoder_keeps_its_log_softmax_in_float32_and_both_searches_agree() -> None:
    """RuntimeConfig.fp16_decoder: the decoder step converted by onnxruntime's own float16
    converter (its inputs, outputs, log-softmax and top k in float32) loads on the CPU provider,
    and the device search gives the numpy search's answers over it."""
    model = float16_decoder(onnx.load(str(DEFAULT_BUNDLE / "decoder.onnx")))
    types = {
        i.name: i.type.tensor_type.elem_type for i in [*model.graph.input, *model.graph.output]
    }
    assert types["state"] == types["log_probs"] == types["new_state"] == TensorProto.FLOAT
    halves = [i for i in model.graph.initializer if i.data_type == TensorProto.FLOAT16]
    assert halves, "no weight went to float16"
    log_softmax = next(n for n in model.graph.node if n.op_type == "LogSoftmax")
    feeding = next(n for n in model.graph.node if log_softmax.input[0] in n.output)
    assert feeding.op_type == "Cast" and feeding.attribute[0].i == TensorProto.FLOAT

    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, fp16_decoder=True
    )
    texts = ["the day after tomorrow", "three hundred and twelve", "she sold it in june"]
    answers = []
    for search in ("device", "host"):
        engine = Engine.load(DEFAULT_BUNDLE, RuntimeConfig(**{**config.__dict__, "search": search}))
        answers.append(engine.translate(texts, SearchOptions(beam_size=5), alignment="subword"))
    for device, host in zip(*answers, strict=True):
        d, h = device.hypotheses[0], host.hypotheses[0]
        assert d.token_ids == h.token_ids and abs(d.score - h.score) <= 1e-5


def test_every_session_of_a_decoder_reads_one_copy_of_its_weights() -> None:
    """The decoder step, the device search's variants and Align's session share the decoder's
    weights (SharedWeights: every large initializer, once) and answer as sessions with their own
    copies do, to the bit; no session keeps the graph bytes it was made from."""
    from service.decode.runtime import runtime

    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    engine = Engine.load(DEFAULT_BUNDLE, config)
    model = engine.model
    assert model.shared is not None
    decoder = onnx.load(str(DEFAULT_BUNDLE / "decoder.onnx"))
    large = {t.name for t in decoder.graph.initializer if t.raw_data and len(t.raw_data) >= 1024}
    assert large and set(model.shared.values) == large
    assert model.shared.nbytes >= sum(
        len(t.raw_data) for t in decoder.graph.initializer if t.name in large
    )
    texts = ["ninety-seven", "March 5, 2021", "three hundred and twelve"]
    options = SearchOptions(beam_size=4, n_best=2)
    got = engine.translate(texts, options, alignment="subword")
    original = runtime.OnnxModel._shared_weights
    try:
        runtime.OnnxModel._shared_weights = lambda self: None  # type: ignore[method-assign]
        alone = Engine.load(DEFAULT_BUNDLE, config)
    finally:
        runtime.OnnxModel._shared_weights = original  # type: ignore[method-assign]
    assert alone.model.shared is None
    want = alone.translate(texts, options, alignment="subword")
    for g, w in zip(got, want, strict=True):
        assert [h.token_ids for h in g.hypotheses] == [h.token_ids for h in w.hypotheses]
        assert [h.score for h in g.hypotheses] == [h.score for h in w.hypotheses]
    for session in [model.decoder, *model.search_sessions.values()]:
        assert not getattr(session, "_model_bytes", None), "a session kept its graph's bytes"


def test_a_model_keeps_at_most_max_search_sessions_variants() -> None:
    """The least recently used device-search variant goes first; asked again, it is made again
    and answers the same."""
    from service.decode.runtime.search_variant import SearchVariant

    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, max_search_sessions=2
    )
    model = Engine.load(DEFAULT_BUNDLE, config).model
    shapes = [SearchVariant(K, K + 1, 1, 2, False, attention=False) for K in (1, 2, 3)]
    first = model.search_session(shapes[0])
    model.search_session(shapes[1])
    assert model.search_session(shapes[0]) is first  # used again: the newest
    model.search_session(shapes[2])
    kept = {s.K for s in model.search_sessions}
    assert kept == {1, 3}
    again = model.search_session(shapes[1])
    assert again is not None and {s.K for s in model.search_sessions} == {3, 2}


def test_past_its_graphs_per_beam_a_batch_runs_on_a_made_graph_that_covers_it() -> None:
    """search_variant_for: a variant is made while its beam size has fewer than
    search_graphs_per_beam; past them, the made one that covers what the batch needs with the
    fewest extras, or else the one that does every need; other beam sizes count apart."""
    from dataclasses import replace

    from service.decode.runtime.search_variant import SearchVariant

    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=1, search_graphs_per_beam=2
    )
    model = Engine.load(DEFAULT_BUNDLE, config).model
    assert model.search_takes_controls()
    base = SearchVariant(5, 6, 1, 2, False, attention=False)
    attention, wide = replace(base, attention=True), replace(base, wide=True)

    def run(needed: SearchVariant) -> SearchVariant:
        chosen = model.search_variant_for(needed)
        model.search_session(chosen)
        return chosen

    assert run(base) == base and run(attention) == attention  # two made
    every = replace(base, coverage=True, controls=True, attention=True, wide=True)
    assert run(wide) == every  # a third would pass two: the one that does every need
    assert run(attention) == attention and run(base) == base  # made: themselves
    assert run(replace(base, coverage=True)) == every
    assert run(replace(attention, controls=True)) == every
    assert len(model.search_sessions) == 3
    other_beam = SearchVariant(3, 4, 1, 2, False, attention=False, wide=True)
    assert run(other_beam) == other_beam  # beam 3 has made none yet


@pytest.mark.parametrize("search", ["host", "device"])
def test_steps_that_shrink_the_cpu_arena_give_the_same_answers(search: str) -> None:
    """ArenaShrink: with a shrink due at every step (the arena freed down to its live tensors
    after each), both searches answer as without one; with 0, no step shrinks."""
    from benchmarks.sample_texts import bundle_texts

    texts = bundle_texts(DEFAULT_BUNDLE)[:12]
    options = SearchOptions(beam_size=5, n_best=2)
    answers = {}
    for every in (0.0, 1e-9):
        config = RuntimeConfig(
            providers=("CPUExecutionProvider",), intra_op_threads=1, search=search,
            arena_shrink_s=every,
        )  # fmt: skip
        engine = Engine.load(DEFAULT_BUNDLE, config)
        answers[every] = engine.translate(texts, options, "subword")
        steps = engine.model.arena_shrink.shrinks
        assert (steps > 10) if every else (steps == 0), steps
    for plain, shrunk in zip(answers[0.0], answers[1e-9], strict=True):
        for p, s in zip(plain.hypotheses, shrunk.hypotheses, strict=True):
            assert p.token_ids == s.token_ids and p.score == s.score
            assert p.alignment is not None and s.alignment is not None
            np.testing.assert_array_equal(p.alignment.matrix, s.alignment.matrix)
