"""ONNX Runtime sessions for a bundle's encoder and decoder-step graphs.

The decoder runs through IOBinding: the recurrent state and the encoder tensors are OrtValues on the
session's device (GPU memory under the CUDA provider) and stay there between steps; only token ids and
back-pointers go in, and only the top-k candidates and the attention row come back to the host. The same
code runs under the CPU provider in the tests.

Sentences joining or leaving the running batch (a batch-composition change, not a step) go through host
numpy: cheap on the CPU, one device round trip per change on a GPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.architecture import PAD_ID
from service.beam import StepOutput
from service.bundle import Bundle, BundleError
from service.config import RuntimeConfig

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def resolve_providers(requested: tuple[str, ...]) -> list[str]:
    """Keep the requested providers this onnxruntime build has, in order; CPU is always the last resort."""
    available = set(ort.get_available_providers())
    chosen = [p for p in requested if p in available]
    dropped = [p for p in requested if p not in available]
    if dropped:
        log.info("execution providers not available here, skipped: %s", dropped)
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen


def make_session(path: str, config: RuntimeConfig, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not config.spin_wait:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    providers = resolve_providers(config.providers)
    provider_options = [
        {"device_id": str(config.device_id)} if p == CUDA else {} for p in providers
    ]
    try:
        return ort.InferenceSession(
            path, sess_options=options, providers=providers, provider_options=provider_options
        )
    except Exception as err:  # a damaged graph fails with messages that may not name it
        raise BundleError(f"{path}: ONNX Runtime cannot load this graph: {err}") from err


@dataclass
class Encoded:
    """Encoder outputs for a group of sentences, as OrtValues on the session's device."""

    values: ort.OrtValue  # (B, S, D)
    keys: ort.OrtValue  # (B, S, Dk), or (B, 1, D) for attention "none"
    mask: ort.OrtValue  # (B, S) bool
    state: ort.OrtValue  # (B, D_state) initial decoder states

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape()[0])


@dataclass(frozen=True)
class EncodedSentence:
    """One sentence's encoder outputs on the host, cut to its own length: the unit that waits between
    an encoder call and the sentence joining a running batch."""

    values: np.ndarray  # (S_i, D)
    keys: np.ndarray  # (S_i, Dk), or (1, D) for attention "none"
    state: np.ndarray  # (D_state,) initial decoder state

    @property
    def length(self) -> int:
        return int(self.values.shape[0])


def split_sentences(
    encoded: Encoded, lengths: np.ndarray, keys_follow_source: bool
) -> list[EncodedSentence]:
    """A batch's encoder outputs → one EncodedSentence per sentence (copies: the rows outlive the batch)."""
    values, keys, state = encoded.values.numpy(), encoded.keys.numpy(), encoded.state.numpy()
    out = []
    for b, n in enumerate(lengths.tolist()):
        key_rows = keys[b, :n] if keys_follow_source else keys[b]
        out.append(EncodedSentence(values[b, :n].copy(), key_rows.copy(), state[b].copy()))
    return out


def pad_ids(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists → src (B, S) int64 padded with PAD, lengths (B,) int64."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
    src = np.full((len(rows), int(lengths.max())), PAD_ID, dtype=np.int64)  # (B, S)
    for i, r in enumerate(rows):
        src[i, : len(r)] = r
    return src, lengths


CALL_COST_SENTENCES = 2.0  # one encoder call costs about as much as two more sentences in it


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """Indices grouped into encoder calls by length, shortest first, minimizing the modelled cost
    Σ over calls of (sentences + CALL_COST_SENTENCES) × longest source.

    The encoder's work follows batch × longest source, so one 70-token sentence among 15-token ones
    makes the whole call ~4× the work; each extra call costs a fixed overhead instead (measured on the
    default model, one thread: 0.32 ms for one 20-token sentence, +0.15 ms per sentence more). The
    optimal split of the sorted lengths into contiguous groups is a small dynamic programme (n ≤ the
    batch limit).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the first j sorted sentences
    cut = [0] * (n + 1)  # cut[j]: where the last group of that best split starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):
            cost = best[i] + (j - i + CALL_COST_SENTENCES) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets: list[list[int]] = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


class OnnxModel:
    """The bundle's two graphs on one device; hands out decoders for running batches."""

    def __init__(self, bundle: Bundle, config: RuntimeConfig) -> None:
        self.bundle = bundle
        self.config = config
        decoder_file = "decoder.int8.onnx" if config.int8_decoder else "decoder.onnx"
        if config.int8_decoder and not bundle.has_int8:
            raise ValueError(
                f"bundle {bundle.path} has no decoder.int8.onnx (export it with --int8)"
            )
        self.encoder = make_session(
            str(bundle.file("encoder.onnx")), config, config.encoder_threads
        )
        self.decoder = make_session(str(bundle.file(decoder_file)), config, config.intra_op_threads)
        on_gpu = self.decoder.get_providers()[0] == CUDA
        self.device_type = "cuda" if on_gpu else "cpu"
        self.device_id = config.device_id if on_gpu else 0

    @property
    def providers(self) -> list[str]:
        return list(self.decoder.get_providers())

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(
            np.ascontiguousarray(array), self.device_type, self.device_id
        )

    def encode(self, src: np.ndarray, lengths: np.ndarray) -> Encoded:
        """src (B, S) int64 padded ids, lengths (B,) int64 → encoder outputs left on the device."""
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src", np.ascontiguousarray(src, dtype=np.int64))
        binding.bind_cpu_input("src_lengths", np.ascontiguousarray(lengths, dtype=np.int64))
        for name in ("values", "keys", "mask", "state"):
            binding.bind_output(name, self.device_type, self.device_id)
        self.encoder.run_with_iobinding(binding)
        values, keys, mask, state = binding.get_outputs()
        return Encoded(values=values, keys=keys, mask=mask, state=state)

    def encode_sentences(self, id_lists: Sequence[Sequence[int]]) -> list[EncodedSentence]:
        """Source id lists → one host EncodedSentence each, in order. Sentences of similar length
        are encoded together (`length_buckets`): the encoder's cost follows batch × longest source."""
        keys_follow_source = self.bundle.architecture.attention != "none"
        out: list[EncodedSentence | None] = [None] * len(id_lists)
        for bucket in length_buckets([len(ids) for ids in id_lists]):
            src, lengths = pad_ids([id_lists[i] for i in bucket])
            encoded = split_sentences(self.encode(src, lengths), lengths, keys_follow_source)
            for i, sentence in zip(bucket, encoded, strict=True):
                out[i] = sentence
        return [s for s in out if s is not None]

    def new_decoder(self) -> OnnxDecoder:
        return OnnxDecoder(self)


class EncoderRows:
    """The running batch's encoder tensors, one row per sentence, in host buffers with spare capacity.

    Sentences join and leave between almost every step under load, so rows are appended in place and
    compacted in place rather than re-concatenated: a join writes only the new rows, a leave moves only
    the rows whose place changes (the search's `compaction_order` keeps that to one per row dropped).
    The source axis is the longest source present (shorter rows are masked) and shrinks when the
    remaining sentences need at most half of it.
    """

    def __init__(self, keys_follow_source: bool) -> None:
        self.keys_follow_source = keys_follow_source  # False for attention "none": keys (B, 1, D)
        self.count = 0
        self.values: np.ndarray | None = None  # (capacity, S, D)
        self.keys: np.ndarray | None = None  # (capacity, S or 1, Dk)
        self.mask: np.ndarray | None = None  # (capacity, S) bool
        self.lengths: np.ndarray | None = None  # (capacity,) int64 real source length per row

    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """values (B, S, D), keys (B, S or 1, Dk), mask (B, S): contiguous leading slices."""
        assert self.values is not None and self.keys is not None and self.mask is not None
        B = self.count
        return self.values[:B], self.keys[:B], self.mask[:B]

    def append(self, sentences: Sequence[EncodedSentence]) -> None:
        """Write joining sentences' rows after the current ones, straight from their own arrays."""
        n, S_new = len(sentences), max(s.length for s in sentences)
        first = sentences[0]
        if self.values is None:
            D, Dk = first.values.shape[1], first.keys.shape[1]
            self.allocate(max(16, 2 * n), S_new, D, first.keys.shape[0], Dk)
        elif self.count + n > self.capacity or S_new > self.source_len:
            self.resize(max(self.capacity, 2 * (self.count + n)), max(self.source_len, S_new))
        assert (
            self.values is not None
            and self.keys is not None
            and self.mask is not None
            and self.lengths is not None
        )
        rows = slice(self.count, self.count + n)
        self.values[rows] = 0.0
        self.keys[rows] = 0.0
        self.mask[rows] = False
        for row, sentence in enumerate(sentences, start=self.count):
            self.values[row, : sentence.length] = sentence.values
            self.keys[row, : sentence.keys.shape[0]] = sentence.keys
            self.mask[row, : sentence.length] = True
            self.lengths[row] = sentence.length
        self.count += n

    def keep(self, keep: np.ndarray) -> None:
        """Keep the rows `keep` (B',), in that order."""
        if len(keep) == 0:
            self.count = 0
            self.values = self.keys = self.mask = self.lengths = None
            return
        assert (
            self.values is not None
            and self.keys is not None
            and self.mask is not None
            and self.lengths is not None
        )
        moved = np.flatnonzero(keep != np.arange(len(keep)))  # only the rows that change place
        if len(moved):
            sources = keep[moved]
            for buffer in (self.values, self.keys, self.mask, self.lengths):
                buffer[moved] = buffer[sources]  # the right side is gathered before any write
        self.count = len(keep)
        needed = int(self.lengths[: self.count].max())
        if needed <= self.source_len // 2:
            self.resize(self.capacity, needed)

    @property
    def capacity(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def source_len(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def allocate(self, capacity: int, S: int, D: int, key_len: int, Dk: int) -> None:
        self.values = np.zeros((capacity, S, D), np.float32)
        self.keys = np.zeros((capacity, S if self.keys_follow_source else key_len, Dk), np.float32)
        self.mask = np.zeros((capacity, S), bool)
        self.lengths = np.zeros(capacity, np.int64)

    def resize(self, capacity: int, S: int) -> None:
        """New buffers of (capacity, S, ·) holding the current rows, cut or zero-padded to S."""
        assert (
            self.values is not None
            and self.keys is not None
            and self.mask is not None
            and self.lengths is not None
        )
        old_values, old_keys, old_mask, old_lengths = (
            self.values,
            self.keys,
            self.mask,
            self.lengths,
        )
        self.allocate(capacity, S, old_values.shape[2], old_keys.shape[1], old_keys.shape[2])
        assert (
            self.values is not None
            and self.keys is not None
            and self.mask is not None
            and self.lengths is not None
        )
        B, S_copy = self.count, min(S, old_mask.shape[1])
        self.values[:B, :S_copy] = old_values[:B, :S_copy]
        key_copy = S_copy if self.keys_follow_source else old_keys.shape[1]
        self.keys[:B, :key_copy] = old_keys[:B, :key_copy]
        self.mask[:B, :S_copy] = old_mask[:B, :S_copy]
        self.lengths[:B] = old_lengths[:B]


class OnnxDecoder:
    """The decoder side of one running batch; implements `service.beam.Decoder`.

    Holds the batch's encoder tensors (one row per sentence) and the state buffer (one row per
    hypothesis produced by the last step, then the initial states of sentences added since).
    """

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self.rows = EncoderRows(keys_follow_source=model.bundle.architecture.attention != "none")
        self.device_tensors: tuple[ort.OrtValue, ort.OrtValue, ort.OrtValue] | None = None
        self.state: ort.OrtValue | None = None  # (R, D_state)

    @property
    def state_rows(self) -> int:
        return 0 if self.state is None else int(self.state.shape()[0])

    def add_sentences(self, sentences: Sequence[EncodedSentence]) -> int:
        """Append sentences (at the end of the sentence order); returns the state-buffer row of the first one."""
        offset = self.state_rows
        self.rows.append(sentences)
        new_state = np.stack([s.state for s in sentences])  # (n, D_state)
        state = new_state if self.state is None else np.concatenate([self.state.numpy(), new_state])
        self.state = self.model.to_device(state)
        self.upload_encoder_tensors()
        return offset

    def keep_sentences(self, keep: np.ndarray) -> None:
        """Drop finished sentences' encoder rows (the state rows are dropped by the next reorder)."""
        keep = np.asarray(keep, dtype=np.int64)
        self.rows.keep(keep)
        if len(keep) == 0:  # the batch is empty: its state rows are of no use to anyone
            self.device_tensors = None
            self.state = None
            return
        self.upload_encoder_tensors()

    def upload_encoder_tensors(self) -> None:
        """On the CPU an OrtValue wraps the numpy buffer (no copy); on a GPU this is one upload."""
        values, keys, mask = self.rows.views()
        self.device_tensors = (
            self.model.to_device(values),
            self.model.to_device(keys),
            self.model.to_device(mask),
        )

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        """One decoder call for every hypothesis: tokens (N,), reorder (N,) → top-k (N, k), attention (N, S)."""
        assert self.device_tensors is not None and self.state is not None, (
            "step() on an empty batch"
        )
        session, model = self.model.decoder, self.model
        values, keys, mask = self.device_tensors
        binding = session.io_binding()
        binding.bind_cpu_input("tokens", np.ascontiguousarray(tokens, dtype=np.int64))
        binding.bind_cpu_input("reorder", np.ascontiguousarray(reorder, dtype=np.int64))
        binding.bind_cpu_input("k", np.array(k, dtype=np.int64))
        binding.bind_ortvalue_input("state", self.state)
        binding.bind_ortvalue_input("values", values)
        binding.bind_ortvalue_input("keys", keys)
        binding.bind_ortvalue_input("mask", mask)
        binding.bind_output("log_probs")  # host
        binding.bind_output("token_ids")  # host
        binding.bind_output("new_state", model.device_type, model.device_id)  # stays on the device
        binding.bind_output("attention")  # host
        session.run_with_iobinding(binding)
        log_probs, token_ids, new_state, attention = binding.get_outputs()
        self.state = new_state
        return StepOutput(
            log_probs=log_probs.numpy(), token_ids=token_ids.numpy(), attention=attention.numpy()
        )
