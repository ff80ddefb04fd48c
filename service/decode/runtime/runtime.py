"""ONNX Runtime sessions for a bundle's encoder and decoder-step graphs.

The decoder runs through IOBinding: the recurrent state and the encoder tensors are OrtValues on the
session's device (GPU memory under the CUDA provider) and stay there between steps; only token ids and
back-pointers go in, and only the top-k candidates and the attention row come back to the host, into
reusable host buffers. The same code runs under the CPU provider in the tests.

Sentences joining or leaving the running batch change the device buffers in place
(`service.decode.runtime.device.RowOps`): a join uploads only the joining sentences' rows and initial states, a leave
moves rows on the device, and the decoder state never leaves it. Every host↔device copy is counted
in the model's `TransferLedger` (`service.decode.runtime.transfers`), so the bytes per step are a tested quantity:
O(joining sentences + hypotheses × (k + source length)), never O(batch × source length).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from service.decode.runtime.attention_choice import AttentionChoice, choose_attention
from service.decode.runtime.blocked_topk import block_topk
from service.decode.runtime.cache_in_place import (
    SLOT_INPUTS,
    CachesInPlace,
    attend_in_place,
    cacheable,
)
from service.decode.runtime.device import Device, HostRowOps, RowUpdates, host_view, make_row_ops
from service.decode.runtime.encoder_layers import (
    HostLayerRows,
    LayerSlice,
    layer_slices,
    parse_slice,
    split_encoder_inputs,
    split_graph,
)
from service.decode.runtime.providers import CPU, CUDA, check_model_providers, resolve_providers
from service.decode.runtime.search_graph import (
    SearchVariant,
    controls_problem,
    covers_needs,
    extra_needs,
    finished_graph,
    full,
    graph_problem,
    grow_graph,
    same_beam,
    search_scores_output,
    search_step_graph,
    select_graph,
)
from service.decode.runtime.transfers import TransferLedger
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.search_types import StepOutput
from service.model.architecture import PAD_ID, ModelConfig, StateSpec
from service.model.bundle import Bundle, BundleError
from service.model.int8 import warn_once_if_saturating

log = logging.getLogger(__name__)


def cuda_provider_options(config: RuntimeConfig) -> dict[str, str]:
    """The CUDA execution provider's options, each set on purpose (ONNX Runtime's names and values).

    - device_id: the GPU the sessions and every OrtValue of the running batch live on.
    - arena_extend_strategy kSameAsRequested: the running batch's tensors change size at almost
      every step; the default kNextPowerOfTwo would reserve up to twice what a step needs each time
      the arena grows.
    - gpu_mem_limit: a cap on the arena (0 leaves ONNX Runtime's default, the whole device).
    - do_copy_in_default_stream: host↔device copies on the compute stream (ONNX Runtime's
      recommended setting: the copies are ordered with the kernels that read them); false gives
      copies their own stream, which ONNX Runtime documents as faster but open to races.
    - use_tf32: off by default, so a GPU's matrix products round like the CPU's fp32 ones and the
      differential tests' outputs hold across devices.
    """
    options = {
        "device_id": str(config.device_id),
        "arena_extend_strategy": config.cuda_arena_extend,
        "do_copy_in_default_stream": "1" if config.cuda_copy_in_default_stream else "0",
        "use_tf32": "1" if config.cuda_tf32 else "0",
    }
    if config.cuda_mem_limit_mb:
        options["gpu_mem_limit"] = str(config.cuda_mem_limit_mb * 1024 * 1024)
    return options


def provider_options(providers: Sequence[str], config: RuntimeConfig) -> list[dict[str, str]]:
    return [cuda_provider_options(config) if p == CUDA else {} for p in providers]


class SharedWeights:
    """One copy of a graph's weights for every session that runs a variant of it: the decoder
    step, the device search's variants (a beam size and what its sentences need: up to sixteen a
    beam size) and Align's. Each session reads these OrtValues (`SessionOptions.add_initializer`)
    instead of a copy of its own. Each still packs its matrices for its GEMMs (a copy of its own:
    ONNX Runtime's Python API cannot share packed weights): unpacked, a row's log-probs depended
    on the rows beside it (grc-en-nt: 2e-6 between a sentence alone and in a batch), and the same
    request must get the same answer at any batch composition. Measured on grc-en-nt's
    device-search variants (14 MiB of decoder weights), each session's resident memory: 28.8 MiB
    as they were, 15.4 sharing the weights, 9 sharing them and made from a file (`make_session`)."""

    MIN_BYTES = 1024  # smaller initializers (shapes, scalars) stay in their graphs

    def __init__(self, model: onnx.ModelProto) -> None:
        self.values: dict[str, ort.OrtValue] = {}
        self._sizes: dict[str, int] = {}
        for tensor in model.graph.initializer:
            array = np.ascontiguousarray(numpy_helper.to_array(tensor))
            if array.nbytes >= self.MIN_BYTES:
                self.values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(array)
                self._sizes[tensor.name] = array.nbytes

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())

    def add_to(self, options: ort.SessionOptions) -> None:
        """These weights for a session's initializers of the same names (a graph without one of
        them ignores it)."""
        for name, value in self.values.items():
            options.add_initializer(name, value)


@functools.cache
def _trim() -> Any:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc's malloc_trim). Making a session
    parses and serializes its graph's protobuf, the decoder's weights several times over, and the
    memory freed after stays in the process's resident set: 29-38 MiB after loading
    grc-en-nt-silver's graphs. Called once a model's graphs are loaded, and after each device-search
    variant; a no-op where the allocator is not glibc's."""
    trim = _trim()
    if trim is not None:
        trim(0)


class ArenaShrink:
    """Now and then, a decoder step that gives back what the CPU arena holds beyond its live
    tensors. The arena (`shared_cpu_arena`) never shrinks by itself: it keeps the peak of the
    largest batch the process ran, and an engine that took a killed peer's load kept it (the
    chaos soak's memory grew 10% over its last half: docs/soak.md). After a batch of 96 sentences
    on grc-en-nt-transformer a process held 482 MiB, and 225 MiB after one step with ONNX Runtime's
    shrink option and malloc_trim; 150 MiB loaded. One per model (OnnxModel.arena_shrink): at most
    once every `interval_s` (0: never), `options()` hands its caller the run option; the caller
    runs with it, then `released()`."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = time.monotonic() + interval_s
        self._options = ort.RunOptions()
        self._options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.shrinks = 0

    def options(self) -> ort.RunOptions | None:
        """The shrinking run option where a shrink is due, else None (a plain run)."""
        if not self.interval_s:
            return None
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval_s
        return self._options

    def released(self) -> None:
        """After the run that shrank the arena: the heap's freed pages back to the system."""
        self.shrinks += 1
        release_freed_memory()


_arena_lock = threading.Lock()
_arena_registered = False


def shared_cpu_arena() -> None:
    """Register, once per process, the CPU arena that sessions with `session.use_env_allocators`
    allocate from. A session's own arena keeps the peak of what it ever ran (it never shrinks), and
    a model has a session per device-search variant (up to sixteen a beam size) beside its decoder
    step's: 38 variants of each of the four embedded models, run in one process, held 1,728 MiB
    with an arena each and 464 MiB with this one (the figures in docs/deploy.md); 64 texts decoded
    as fast (grc-en-nt 1.24-1.41 s with it, 1.31-1.43 s without, four interleaved runs)."""
    global _arena_registered
    with _arena_lock:
        if not _arena_registered:
            info = ort.OrtMemoryInfo(
                "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
            )
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
            _arena_registered = True


def make_session(
    path: str | bytes,
    config: RuntimeConfig,
    threads: int,
    profile_prefix: str | None = None,
    shared: SharedWeights | None = None,
    prepack: bool = True,
) -> ort.InferenceSession:
    """A session on the configured providers; with `profile_prefix`, ONNX Runtime's profiler on
    (benchmarks/gpu/placement.py reads which provider ran each node from it); `shared`: the weights
    it reads instead of its own copy; without `prepack`, its matrix products read those weights
    as they are rather than from copies packed for the kernel (a session off the hot path)."""
    options = ort.SessionOptions()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if shared is not None:
        shared.add_to(options)
    if config.shared_cpu_arena:
        shared_cpu_arena()
        options.add_session_config_entry("session.use_env_allocators", "1")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not config.spin_wait:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    providers = resolve_providers(config.providers, config.device_id)
    try:
        with graph_file(path) as source:
            return ort.InferenceSession(
                source,
                sess_options=options,
                providers=providers,
                provider_options=provider_options(providers, config),
            )
    except Exception as err:  # a damaged graph fails with messages that may not name it
        where = "the decoder graph (in memory)" if isinstance(path, bytes) else path
        raise BundleError(f"{where}: ONNX Runtime cannot load this graph: {err}") from err


@contextlib.contextmanager
def graph_file(graph: str | bytes) -> Iterator[str]:
    """A graph's path: an in-memory one written to a temporary file for the session's load (a
    session made from bytes keeps them as long as it lives: a decoder's weights again in every
    variant's session, 14 MiB each on grc-en-nt's)."""
    if isinstance(graph, str):
        yield graph
        return
    with tempfile.TemporaryDirectory(prefix="s2s-graph-") as folder:
        path = Path(folder) / "graph.onnx"
        path.write_bytes(graph)
        yield str(path)


FULL_LOG_PROBS = "full_log_probs"  # (N, V): the decoder step's whole log-softmax row
# Align's sessions with a chosen cross-attention kept (OnnxModel.choice_session)
CHOICE_SESSIONS = 4


def expose_full_log_probs(model: onnx.ModelProto) -> bool:
    """Make the input of the decoder-step graph's TopK (the log-softmax over the target vocabulary,
    in vocabulary order) also an output, FULL_LOG_PROBS; False when no TopK produces the
    contract's `log_probs` (True, unchanged, where the graph has that output already).

    Align's teacher forcing needs the log-prob of one given token per row, not the top k: asking
    the graph's TopK for k = V sorts every row of V (measured: a third of greedy decoding's tokens
    per second at V = 8,000); this reads the row before the TopK, from the same weights and step."""
    graph = model.graph
    if any(o.name == FULL_LOG_PROBS for o in graph.output):
        return True
    topk = next((n for n in graph.node if n.op_type == "TopK" and "log_probs" in n.output), None)
    if topk is None:
        return False
    graph.node.append(helper.make_node("Identity", [topk.input[0]], [FULL_LOG_PROBS]))
    graph.output.append(
        helper.make_tensor_value_info(FULL_LOG_PROBS, onnx.TensorProto.FLOAT, ["N", "V"])
    )
    return True


def topk_reads_k_on_the_host(model: onnx.ModelProto) -> bool:
    """Let the step's TopK read `k` as it is bound, in host memory; False (graph unchanged) where
    the graph is not the exporter's `Reshape(k, [1]) → TopK`.

    The contract's `k` is a scalar and TopK wants a 1-element tensor in host memory. The exporter's
    Reshape between them has a CUDA kernel, so under the CUDA provider ONNX Runtime copied k to the
    GPU, reshaped it there and copied it back for the TopK: a Memcpy node and a synchronization in
    every step. With `k` declared (1,) and fed to the TopK directly, nothing crosses."""
    graph = model.graph
    k = next((i for i in graph.input if i.name == "k"), None)
    if k is None or len(k.type.tensor_type.shape.dim) != 0:
        return False
    users = [n for n in graph.node if "k" in n.input]
    if len(users) != 1 or users[0].op_type != "Reshape" or users[0].input[0] != "k":
        return False
    reshaped = users[0].output[0]
    readers = [n for n in graph.node if reshaped in n.input]
    if not readers or any(
        n.op_type != "TopK" or list(n.input) != [n.input[0], reshaped] for n in readers
    ):
        return False
    if any(o.name == reshaped for o in graph.output):
        return False
    for n in readers:
        n.input[1] = "k"
    shape = users[0].input[1]
    graph.node.remove(users[0])
    if not any(shape in n.input for n in graph.node):  # the Reshape's target was its alone
        for n in [n for n in graph.node if n.op_type == "Constant" and shape in n.output]:
            graph.node.remove(n)
        for i in [i for i in graph.initializer if i.name == shape]:
            graph.initializer.remove(i)
    k.type.tensor_type.shape.dim.add().dim_value = 1
    return True


# float16_decoder keeps these in float32: the log-softmax (the scores and the search read it) and
# what onnxruntime's converter keeps there by default (TopK among them)
FLOAT32_OPS = ("LogSoftmax",)


def float16_decoder(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder step with its weights and arithmetic in float16 (RuntimeConfig.fp16_decoder):
    onnxruntime's own converter (onnxruntime.transformers.float16, in the onnxruntime wheel), its
    inputs and outputs kept float32, the log-softmax and the top k too (FLOAT32_OPS and the
    converter's default block list): the search's scores are the float32 log-probs, in float64."""
    from onnxruntime.transformers.float16 import (  # imported on use: ~0.2 s
        DEFAULT_OP_BLOCK_LIST,
        convert_float_to_float16,
    )

    blocked = sorted({*DEFAULT_OP_BLOCK_LIST, *FLOAT32_OPS})
    converted: onnx.ModelProto = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=blocked
    )
    return converted


def decoder_graph(
    path: Path,
    full_log_probs: bool = False,
    fp16: bool = False,
    edit: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None,
    blocked_vocab: int | None = None,
    layer_inputs: bool = False,
    in_place: Sequence[StateSpec] = (),
) -> tuple[str | bytes | None, bool]:
    """The decoder-step graph as ONNX Runtime gets it: changed by `edit` where given (Align's
    choice of a cross-attention, service/decode/runtime/attention_choice.py), in float16 with `fp16`
    (`float16_decoder`), with TopK reading k on the host (`topk_reads_k_on_the_host`), for
    `full_log_probs` with FULL_LOG_PROBS exposed (None when it cannot be), and with
    `blocked_vocab` (the target vocabulary's size) its top k in two stages
    (service/decode/runtime/blocked_topk.py), with `layer_inputs` each layer's part of the encoder keys
    and values an input of its own (service/decode/runtime/encoder_layers.py), with `in_place` those
    caches attended in place (service/decode/runtime/cache_in_place.py: ValueError where the graph does
    not read them as it expects); and whether k is bound as a (1,) host tensor. A file onnx cannot
    parse is passed on by its path, for ONNX Runtime's own error naming it."""
    try:
        model = onnx.load(str(path))
    except Exception:  # a damaged file: make_session reports it
        return (None if full_log_probs else str(path)), False
    if edit is not None:
        model = edit(model)
    if in_place and not attend_in_place(model, in_place):
        raise ValueError(f"{path}: its self-attentions do not read their caches as expected")
    if fp16:
        model = float16_decoder(model)
    k_on_host = topk_reads_k_on_the_host(model)
    if full_log_probs and not expose_full_log_probs(model):
        return None, k_on_host
    if blocked_vocab is not None:
        block_topk(model, "log_probs", blocked_vocab)
    if layer_inputs:
        split_encoder_inputs(model)
    return model.SerializeToString(), k_on_host


@dataclass(frozen=True)
class GraphInput:
    """A graph input's name, ONNX Runtime type string and shape (service/model/graph_contract.py)."""

    name: str
    type: str
    shape: list[int | str | None]


@dataclass(eq=False)
class Encoded:
    """Encoder outputs for a group of sentences, as OrtValues on the session's device."""

    values: ort.OrtValue  # (B, S, D)
    keys: ort.OrtValue  # (B, S, Dk), or (B, 1, D) for attention "none"
    mask: ort.OrtValue  # (B, S) bool
    state: ort.OrtValue  # (B, D_state) initial decoder states
    device: Device

    @property
    def tensors(self) -> tuple[ort.OrtValue, ort.OrtValue, ort.OrtValue, ort.OrtValue]:
        """values, keys, mask, state: what `RowOps.gather_append` reads rows of."""
        return self.values, self.keys, self.mask, self.state

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape()[0])


class EncodedSentence:
    """One sentence's encoder outputs: the unit that waits between an encoder call and the sentence
    joining a running batch (on another thread, the encode-ahead's, maybe).

    Either its row of an encoder call's outputs, left on the device where the encoder wrote them
    (`EncodedSentence.row_of`: the running batch copies the row device to device when the sentence
    joins, `RowOps.gather_append`; nothing crosses to the host), or host arrays cut to its own
    length, values (S_i, D), keys (S_i, Dk) or (1, D) for attention "none", state (D_state,) (as
    tests and host references build them). `values`, `keys` and `state` read a device row to the
    host (a copy, counted): the decode loop never does."""

    __slots__ = ("_arrays", "batch", "keys_follow_source", "length", "row")

    def __init__(self, values: np.ndarray, keys: np.ndarray, state: np.ndarray) -> None:
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = (values, keys, state)
        self.batch: Encoded | None = None
        self.row = 0
        self.length = int(values.shape[0])
        self.keys_follow_source = True

    @classmethod
    def row_of(
        cls, batch: Encoded, row: int, length: int, keys_follow_source: bool
    ) -> EncodedSentence:
        """Row `row` (of `length` positions) of an encoder call's outputs, left on the device."""
        sentence = cls.__new__(cls)
        sentence._arrays = None
        sentence.batch, sentence.row, sentence.length = batch, row, length
        sentence.keys_follow_source = keys_follow_source
        return sentence

    @property
    def on_device(self) -> bool:
        return self.batch is not None

    @property
    def state_width(self) -> int:
        """D_state: its initial decoder state's width."""
        if self.batch is not None:
            return int(self.batch.state.shape()[1])
        return len(self.state)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, keys, state) on the host: a device row is downloaded (once, counted)."""
        if self._arrays is None:
            batch = self.batch
            assert batch is not None
            n, b = self.length, self.row
            values = batch.device.download(batch.values, "encoder_rows")[b, :n]
            keys = batch.device.download(batch.keys, "encoder_rows")[b]
            keys = keys[:n] if self.keys_follow_source else keys
            state = batch.device.download(batch.state, "state")[b]
            self._arrays = (values.copy(), keys.copy(), state.copy())
        return self._arrays

    @property
    def values(self) -> np.ndarray:
        return self.arrays()[0]

    def own_values(self) -> np.ndarray:
        """Its values (S_i, D) as a host array of its own. Where the device's memory is the host's,
        its row is read in place and copied alone (`values` copies the whole batch's outputs to
        cut its row: a cost per sentence that grows with the batch)."""
        batch = self.batch
        if self._arrays is not None or batch is None or batch.device.type != "cpu":
            return self.values
        B, S, D = batch.values.shape()
        return host_view(batch.values, (B, S, D))[self.row, : self.length].copy()

    @property
    def keys(self) -> np.ndarray:
        return self.arrays()[1]

    @property
    def state(self) -> np.ndarray:
        return self.arrays()[2]


def split_sentences(
    encoded: Encoded, lengths: np.ndarray, keys_follow_source: bool
) -> list[EncodedSentence]:
    """A batch's encoder outputs → one EncodedSentence per sentence, each its row of them, left on
    the device until it joins a running batch (the rows hold the batch's tensors alive)."""
    return [
        EncodedSentence.row_of(encoded, b, n, keys_follow_source)
        for b, n in enumerate(lengths.tolist())
    ]


def first_widths(sentence: EncodedSentence) -> tuple[int, int, int]:
    """(D, Dk, key_len) of a sentence's encoder outputs: the running batch's buffers' widths."""
    if sentence.batch is not None:
        values, keys = sentence.batch.values.shape(), sentence.batch.keys.shape()
        return int(values[2]), int(keys[2]), sentence.length if sentence.keys_follow_source else 1
    return sentence.values.shape[1], sentence.keys.shape[1], sentence.keys.shape[0]


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
        self.decoder_file = bundle.file(decoder_file)
        if config.int8_decoder:  # an int8 graph of the old scheme on a CPU where it saturates
            warn_once_if_saturating(self.decoder_file)
        # the decoder's weights once, for every session of its graph's variants
        self.shared = self._shared_weights()
        # on the CPU the step's top k runs in two stages (service/decode/runtime/blocked_topk.py), and
        # its layers read their parts of the encoder keys and values as inputs of their own
        # (service/decode/runtime/encoder_layers.py)
        on_cpu = self.encoder.get_providers()[0] == CPU
        self.blocked_vocab = bundle.architecture.tgt_vocab_size if on_cpu else None
        self.layer_inputs = on_cpu
        self._cutters: dict[tuple[LayerSlice, ...], ort.InferenceSession] = {}
        # a Transformer's caches attended in place on the CPU (service/decode/runtime/cache_in_place.py)
        specs = bundle.architecture.decoder_states
        in_place = on_cpu and config.cache_in_place and not config.fp16_decoder
        self.cache_specs: tuple[StateSpec, ...] = (
            tuple(specs) if in_place and cacheable(specs) else ()
        )
        try:
            graph, self.k_on_host = decoder_graph(
                self.decoder_file, fp16=config.fp16_decoder, blocked_vocab=self.blocked_vocab,
                layer_inputs=self.layer_inputs, in_place=self.cache_specs,
            )  # fmt: skip
        except ValueError as err:  # a graph of another shape: the contract's caches
            log.warning("%s: caches not in place: %s", bundle.name, err)
            self.cache_specs = ()
            graph, self.k_on_host = decoder_graph(
                self.decoder_file, fp16=config.fp16_decoder, blocked_vocab=self.blocked_vocab,
                layer_inputs=self.layer_inputs,
            )  # fmt: skip
        assert graph is not None
        self.decoder = make_session(graph, config, config.intra_op_threads, shared=self.shared)
        check_model_providers(
            bundle.name,
            config.providers,
            [self.encoder.get_providers()[0], *self.decoder.get_providers()],
            config.require_provider,
            config.device_id,
        )
        # Align's decoder session (the same graph, its log-softmax exposed), made on first use
        self._forced: ort.InferenceSession | None = None
        self._forced_made = False
        self._forced_lock = threading.Lock()
        # Align's sessions with a chosen cross-attention (`choice_session`), made on first use
        self._choices: OrderedDict[AttentionChoice, ort.InferenceSession] = OrderedDict()
        # the device search's sessions (service/decode/search/device_search.py), made on first use; with
        # a profile prefix, under ONNX Runtime's profiler (benchmarks/gpu/placement.py)
        # (at most config.max_search_sessions, the least recently used dropped first: a session
        # holds its packed weights, 9 MiB on grc-en-nt)
        self._searches: OrderedDict[SearchVariant, ort.InferenceSession] = OrderedDict()
        self.profile_prefix: str | None = None
        self.arena_shrink = ArenaShrink(config.arena_shrink_s)
        self._takes_controls: bool | None = None  # `search_takes_controls`
        self._helpers: dict[str, ort.InferenceSession] = {}
        on_gpu = self.decoder.get_providers()[0] == CUDA
        self.device_type = "cuda" if on_gpu else "cpu"
        self.device_id = config.device_id if on_gpu else 0
        self.transfers = TransferLedger()
        self.device = Device(self.device_type, self.device_id, self.transfers)
        providers = self.providers
        self.row_ops = make_row_ops(
            self.device, providers, provider_options(providers, config), config.row_ops
        )
        release_freed_memory()  # what parsing and serializing the graphs left

    def search_session(self, variant: SearchVariant) -> ort.InferenceSession:
        """The decoder step with the device search's step appended (service/decode/runtime/search_graph.py)
        for `variant` (its k: K + 1 or V, set here), made on first use and shared by the running
        batches of its beam; ValueError where the decoder graph cannot take it (`graph_problem`,
        and `controls_problem` for a variant with controls)."""
        V = self.bundle.architecture.tgt_vocab_size
        variant = replace(variant, k=min(variant.K + 1, V))
        with self._forced_lock:
            session = self._searches.get(variant)
            if session is not None:
                self._searches.move_to_end(variant)
            else:
                model = self._decoder_model()
                problem = graph_problem(model, variant.K)
                if not problem and variant.controls:
                    problem = controls_problem(model)
                if problem:
                    raise ValueError(f"{self.decoder_file}: no device search: {problem}")
                topk_reads_k_on_the_host(model)
                stepped = search_step_graph(model, variant)
                if self.cache_specs and not attend_in_place(stepped, self.cache_specs):
                    raise ValueError(f"{self.decoder_file}: no device search: caches not in place")
                if self.blocked_vocab is not None:
                    block_topk(stepped, search_scores_output(variant), self.blocked_vocab)
                if self.layer_inputs:
                    split_encoder_inputs(stepped)
                graph = stepped.SerializeToString()
                threads = self.config.intra_op_threads
                session = make_session(
                    graph, self.config, threads, self.profile_prefix, self.shared
                )
                self._searches[variant] = session
                while len(self._searches) > self.config.max_search_sessions:
                    self._searches.popitem(last=False)  # its running batch keeps it while it runs
                release_freed_memory()
            return session

    @property
    def caches_in_place(self) -> bool:
        """Whether this model's step graphs attend to their caches in place (CachesInPlace)."""
        return bool(self.cache_specs)

    def declared_states(self) -> DeclaredStates | CachesInPlace | None:
        """A running batch's declared state tensors (None for the RNNs): in place where the
        graphs attend in place, else as the graph contract has them."""
        if self.cache_specs:
            return CachesInPlace(self.cache_specs, self.device)
        return DeclaredStates.of(self.bundle.architecture, self.row_ops)

    def run_step(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        """One decoder step's call, now and then shrinking the CPU arena (`ArenaShrink`)."""
        shrink = self.arena_shrink.options()
        session.run_with_iobinding(binding, shrink)
        if shrink is not None:
            self.arena_shrink.released()

    def search_variant_for(self, needed: SearchVariant) -> SearchVariant:
        """The variant a batch whose sentences need `needed` runs on: `needed` itself where its
        session is made, or while its beam size has fewer than config.search_graphs_per_beam;
        past them, the made one that covers it with the fewest extras, or else the variant that
        does everything this model's graph can (`full`: one more session a beam size, then every
        batch has one). A variant that does more than its batch needs gives the same answers
        (each sentence reads only what it asked for, as in a batch of mixed needs), so that a
        mixed load holds a few packed copies of the decoder's weights a beam size, not sixteen."""
        V = self.bundle.architecture.tgt_vocab_size
        key = replace(needed, k=min(needed.K + 1, V))
        with self._forced_lock:
            made = [v for v in self._searches if same_beam(v, key)]
        if key in made or len(made) < self.config.search_graphs_per_beam:
            return needed
        covers = [v for v in made if covers_needs(v, key)]
        if covers:
            return replace(min(covers, key=extra_needs), k=needed.k)
        return full(needed, controls=self.search_takes_controls())

    def search_takes_controls(self) -> bool:
        """Whether the device search's graphs can apply the decoding controls (`controls_problem`),
        read once."""
        if self._takes_controls is None:
            self._takes_controls = controls_problem(self._decoder_model()) is None
        return self._takes_controls

    def search_graph(self, variant: SearchVariant) -> onnx.ModelProto:
        """The graph `search_session(variant)` runs (for inspection: benchmarks/gpu/placement.py)."""
        V = self.bundle.architecture.tgt_vocab_size
        model = self._decoder_model()
        topk_reads_k_on_the_host(model)
        return search_step_graph(model, replace(variant, k=min(variant.K + 1, V)))

    def _decoder_model(self) -> onnx.ModelProto:
        """The decoder file's graph (in float16 with RuntimeConfig.fp16_decoder)."""
        model = onnx.load(str(self.decoder_file))
        return float16_decoder(model) if self.config.fp16_decoder else model

    def _shared_weights(self) -> SharedWeights | None:
        """The decoder's weights for its sessions to share; None for a file onnx cannot read
        (its session's own error names it)."""
        try:
            return SharedWeights(self._decoder_model())
        except Exception:
            return None

    @property
    def search_sessions(self) -> dict[SearchVariant, ort.InferenceSession]:
        """The device search's sessions made so far, by shape."""
        return dict(self._searches)

    def search_helper(self, name: str) -> ort.InferenceSession:
        """The device search's small graphs (`select_graph`, `finished_graph` with or without the
        attention rows, `grow_graph`), on the model's device with one thread, made on first use."""
        with self._forced_lock:
            session = self._helpers.get(name)
            if session is None:
                graph = {
                    "select": select_graph,
                    "finished": finished_graph,
                    "finished_plain": lambda: finished_graph(attention=False),
                    "grow": grow_graph,
                }[name]()
                session = make_session(graph, self.config, 1)
                self._helpers[name] = session
            return session

    def decoder_inputs(self) -> list[GraphInput]:
        """The decoder graph's inputs as its file declares them (the contract's), whatever
        `decoder_graph` changed for the session: k is the scalar the contract names, and the
        encoder's layer parts and the in-place caches' slot inputs are not the file's."""
        return [
            GraphInput(arg.name, arg.type, [] if arg.name == "k" and self.k_on_host else arg.shape)
            for arg in self.decoder.get_inputs()
            if parse_slice(arg.name) is None and arg.name not in SLOT_INPUTS
        ]

    def cut_session(self, parts: tuple[LayerSlice, ...]) -> ort.InferenceSession:
        """The graph that cuts `parts` from a running batch's encoder keys and values
        (encoder_layers.split_graph), on the model's device, made on first use."""
        with self._forced_lock:
            session = self._cutters.get(parts)
            if session is None:
                session = make_session(split_graph(parts), self.config, 1)
                self._cutters[parts] = session
            return session

    @property
    def providers(self) -> list[str]:
        return list(self.decoder.get_providers())

    def encode(self, src: np.ndarray, lengths: np.ndarray) -> Encoded:
        """src (B, S) int64 padded ids, lengths (B,) int64 → encoder outputs left on the device."""
        binding = self.encoder.io_binding()
        self.device.bind_host_input(binding, "src", src.astype(np.int64, copy=False), "tokens")
        lengths = lengths.astype(np.int64, copy=False)
        self.device.bind_host_input(binding, "src_lengths", lengths, "tokens")
        for name in ("values", "keys", "mask", "state"):
            binding.bind_output(name, self.device_type, self.device_id)
        self.encoder.run_with_iobinding(binding)
        values, keys, mask, state = binding.get_outputs()
        return Encoded(values=values, keys=keys, mask=mask, state=state, device=self.device)

    def encode_sentences(self, id_lists: Sequence[Sequence[int]]) -> list[EncodedSentence]:
        """Source id lists → one EncodedSentence each, in order, its row of its encoder call's
        outputs left on the device. Sentences of similar length are encoded together
        (`length_buckets`): the encoder's cost follows batch × longest source."""
        keys_follow_source = self.bundle.architecture.attention != "none"
        out: list[EncodedSentence | None] = [None] * len(id_lists)
        for bucket in length_buckets([len(ids) for ids in id_lists]):
            src, lengths = pad_ids([id_lists[i] for i in bucket])
            encoded = split_sentences(self.encode(src, lengths), lengths, keys_follow_source)
            for i, sentence in zip(bucket, encoded, strict=True):
                out[i] = sentence
        return [s for s in out if s is not None]

    def new_decoder(
        self, forced: bool = False, choice: AttentionChoice | None = None
    ) -> OnnxDecoder:
        """A running batch's decoder; forced: for Align's teacher forcing (`OnnxDecoder.step_full`),
        its attention read from `choice`'s layer and head where given."""
        if choice is not None:
            return OnnxDecoder(self, self.choice_session(choice))
        return OnnxDecoder(self, self.forced_session() if forced else None)

    def choice_session(self, choice: AttentionChoice) -> ort.InferenceSession:
        """Align's decoder session with its attention read from `choice`'s cross-attention
        (attention_choice.choose_attention), made on first use; the most recent few are kept
        (each shares the decoder's weights). ValueError where the graph cannot give it."""
        shape = self.bundle.architecture.transformer
        if shape is None:
            raise ValueError(f"{self.bundle.name} is not a Transformer: no layer or head to choose")
        with self._forced_lock:
            session = self._choices.get(choice)
            if session is not None:
                self._choices.move_to_end(choice)
                return session
            graph, k_on_host = decoder_graph(
                self.decoder_file, full_log_probs=True, fp16=self.config.fp16_decoder,
                edit=lambda model: choose_attention(model, choice, shape.heads, shape.d_model),
                blocked_vocab=self.blocked_vocab, layer_inputs=self.layer_inputs,
                in_place=self.cache_specs,
            )  # fmt: skip
            if graph is None:
                raise ValueError(f"{self.decoder_file}: no log-softmax to expose for Align")
            assert k_on_host == self.k_on_host
            threads = self.config.intra_op_threads
            session = make_session(graph, self.config, threads, shared=self.shared, prepack=False)
            self._choices[choice] = session
            while len(self._choices) > CHOICE_SESSIONS:
                self._choices.popitem(last=False)  # a running batch keeps its own while it runs
            release_freed_memory()  # what parsing and serializing the graph left
            return session

    def forced_session(self) -> ort.InferenceSession | None:
        """The decoder graph with FULL_LOG_PROBS exposed, loaded once, on the first Align; None when
        the graph cannot expose it (step_full then asks the TopK for every token)."""
        with self._forced_lock:
            if not self._forced_made:
                graph, k_on_host = decoder_graph(
                    self.decoder_file,
                    full_log_probs=True,
                    fp16=self.config.fp16_decoder,
                    blocked_vocab=self.blocked_vocab,
                    layer_inputs=self.layer_inputs,
                    in_place=self.cache_specs,
                )
                assert k_on_host == self.k_on_host  # one rule for both graphs: one k binding
                if graph is not None:
                    self._forced = make_session(
                        graph, self.config, self.config.intra_op_threads, shared=self.shared
                    )
                self._forced_made = True
            return self._forced


class EncoderRows:
    """The running batch's encoder tensors, one row per sentence, in device buffers with spare capacity.

    Sentences join and leave between almost every step under load, so rows are written and compacted
    in place on the device (`RowOps`) rather than rebuilt on the host and uploaded: a join uploads
    only the joining rows (at their own length; the device pads them), a leave moves only the rows
    whose place changes (the search's `compaction_order` keeps that to one per row dropped), and
    nothing else crosses. The source axis is the longest source present (shorter rows are masked)
    and shrinks when the remaining sentences need at most half of it. Rows at and beyond `count`
    hold nothing the step reads: it is bound to the leading `count` rows.
    """

    def __init__(
        self,
        ops: RowUpdates,
        keys_follow_source: bool,
        cutter: Callable[[tuple[LayerSlice, ...]], ort.InferenceSession] | None = None,
    ) -> None:
        self.ops = ops
        self.keys_follow_source = keys_follow_source  # False for attention "none": keys (B, 1, Dk)
        self.count = 0
        self.version = (
            0  # counts the changes to the rows (a leave and a join keep count and buffers)
        )
        # the layer parts of keys and values that sessions read (service/decode/runtime/encoder_layers.py),
        # cut from the rows of `version` by the session `cutter` gives, on the device
        self.cutter = cutter
        self._parts: dict[tuple[LayerSlice, ...], list[Any]] = {}
        self._parts_version = -1
        # on the CPU provider the parts are kept row by row instead (HostLayerRows): cut as
        # sentences join, moved as they leave
        self.host_parts = isinstance(ops, HostRowOps)
        self._kept: dict[tuple[LayerSlice, ...], HostLayerRows] = {}
        # values (capacity, S, D), keys (capacity, S or 1, Dk), mask (capacity, S) bool, on the device
        self.buffers: list[ort.OrtValue] | None = None
        self.lengths = np.zeros(0, np.int64)  # (capacity,) real source length per row, on the host
        self.D = self.Dk = self.key_len = 0

    @property
    def capacity(self) -> int:
        return len(self.lengths)

    @property
    def source_len(self) -> int:
        return 0 if self.buffers is None else int(self.buffers[2].shape()[1])

    def shapes(self, rows: int, S: int | None = None) -> list[tuple[int, ...]]:
        """The buffers' shapes over `rows` rows (and source length S, by default the current one)."""
        S = self.source_len if S is None else S
        key_len = S if self.keys_follow_source else self.key_len
        return [(rows, S, self.D), (rows, key_len, self.Dk), (rows, S)]

    def append(
        self, sentences: Sequence[EncodedSentence], state: ort.OrtValue | None = None
    ) -> ort.OrtValue:
        """Write joining sentences' rows after the current ones, and return the decoder `state`
        (R, D) on the device (None: none yet) with the sentences' initial states after it.

        Rows left on the device by the encoder are copied there (`RowOps.gather_append`, one call
        per run of sentences of the same encoder call): only indices cross. Host rows cross at
        their own length (the device pads them)."""
        n, S_new = len(sentences), max(s.length for s in sentences)
        first = sentences[0]
        self.version += 1
        if self.buffers is None:
            self.D, self.Dk, self.key_len = first_widths(first)
            capacity = max(16, 2 * n)
            self.buffers = [
                self.ops.empty(shape, dtype)
                for shape, dtype in zip(
                    self.shapes(capacity, S_new), (np.float32, np.float32, np.bool_), strict=True
                )
            ]
            self.lengths = np.zeros(capacity, np.int64)
        elif self.count + n > self.capacity or S_new > self.source_len:
            self.refit(max(self.capacity, 2 * (self.count + n)), max(self.source_len, S_new))
        assert self.buffers is not None
        if state is None:
            empty = np.zeros((0, first.state_width), np.float32)  # (0, D_state)
            state = self.ops.device.upload(empty, "state")
        first_row = self.count
        if all(s.on_device for s in sentences):
            joined = self._gather(sentences, state)
        else:
            joined = self._upload(sentences, state)
        assert joined is not None
        if self._kept:
            stacked = self._stacked_views()
            for kept in self._kept.values():
                kept.write(stacked, first_row, self.count)
        return joined

    def _gather(self, sentences: Sequence[EncodedSentence], state: ort.OrtValue) -> ort.OrtValue:
        """Device rows: one gather per run of sentences of the same encoder call."""
        assert self.buffers is not None
        start = 0
        while start < len(sentences):
            batch = sentences[start].batch
            end = start
            while end < len(sentences) and sentences[end].batch is batch:
                end += 1
            assert batch is not None
            run = sentences[start:end]
            index = np.array([s.row for s in run], np.int64)  # (r,)
            self.lengths[self.count : self.count + len(run)] = [s.length for s in run]
            state = self.ops.gather_append(
                self.buffers, self.shapes(self.capacity), self.count, batch.tensors, index, state
            )
            self.count += len(run)
            start = end
        return state

    def _upload(
        self, sentences: Sequence[EncodedSentence], state: ort.OrtValue
    ) -> ort.OrtValue | None:
        """Host rows, uploaded at their own length, their initial states after `state`."""
        assert self.buffers is not None
        n, S_new = len(sentences), max(s.length for s in sentences)
        first = sentences[0]
        if n == 1:  # one sentence (the usual join under load): its own arrays, no padding
            values, keys = first.values[None], first.keys[None]  # (1, S_i, D), (1, S_i or 1, Dk)
            mask = np.ones((1, first.length), np.bool_)  # (1, S_i)
            self.lengths[self.count] = first.length
        else:  # the joining rows, zero-padded to the longest of them
            values_shape, keys_shape, mask_shape = self.shapes(n, S_new)
            values = np.zeros(values_shape, np.float32)  # (n, S_new, D)
            keys = np.zeros(keys_shape, np.float32)  # (n, S_new or 1, Dk)
            mask = np.zeros(mask_shape, np.bool_)  # (n, S_new)
            for i, sentence in enumerate(sentences):
                values[i, : sentence.length] = sentence.values
                keys[i, : sentence.keys.shape[0]] = sentence.keys
                mask[i, : sentence.length] = True
                self.lengths[self.count + i] = sentence.length
        new_state = np.stack([s.state for s in sentences])  # (n, D_state)
        joined = self.ops.append(
            self.buffers,
            self.shapes(self.capacity),
            self.count,
            [values, keys, mask],
            state,
            new_state,
        )
        self.count += n
        return joined

    def keep(self, keep: np.ndarray) -> None:
        """Keep the rows `keep` (B',), in that order."""
        self.version += 1
        if len(keep) == 0:
            self.count = 0
            self.buffers = None
            self.lengths = np.zeros(0, np.int64)
            self._kept = {}
            return
        assert self.buffers is not None
        moved = np.flatnonzero(keep != np.arange(len(keep)))  # only the rows that change place
        if len(moved):
            sources = keep[moved]
            self.ops.move(self.buffers, self.shapes(self.count), sources, moved)
            self.lengths[moved] = self.lengths[sources]
            for kept in self._kept.values():
                kept.move(sources, moved)
        self.count = len(keep)
        needed = int(self.lengths[: self.count].max())
        if needed <= self.source_len // 2:
            self.refit(self.capacity, needed)

    def refit(self, capacity: int, S: int) -> None:
        """New device buffers of (capacity, S, ·) holding the current rows, cut or zero-padded to S."""
        assert self.buffers is not None
        self.version += 1
        self.buffers = self.ops.refit(
            self.buffers, self.shapes(self.count), self.shapes(capacity, S)
        )
        for kept in self._kept.values():
            kept.refit(self.count, capacity, S)
        lengths = np.zeros(capacity, np.int64)
        lengths[: self.count] = self.lengths[: self.count]
        self.lengths = lengths

    def binding_key(self) -> tuple[int, ...]:
        """What `bind` binds: while it is unchanged, a binding made by `bind` still holds (the
        version: the layer parts are cut anew at every change of the rows)."""
        assert self.buffers is not None
        buffers = (b.data_ptr() for b in self.buffers)
        return (self.version, self.count, *buffers, *self.buffers[2].shape())

    def bind(self, binding: ort.IOBinding, session: ort.InferenceSession) -> None:
        """Bind the live rows as `session`'s values (B, S, D), keys, mask (B, S) (no copy), and the
        layer parts of keys and values it reads (cut when the rows have changed since the last
        cut)."""
        assert self.buffers is not None
        device = self.ops.device
        for name, buffer, shape in zip(
            ("values", "keys", "mask"), self.buffers, self.shapes(self.count), strict=True
        ):
            device.bind_device_input(binding, name, buffer, shape)
        parts = layer_slices(arg.name for arg in session.get_inputs())
        if parts and self.host_parts:
            kept = self._kept_parts(parts)
            for part, value, shape in zip(parts, kept.values, kept.shapes(self.count), strict=True):
                device.bind_device_input(binding, part.name, value, shape)
        elif parts:
            for part, value in zip(parts, self._cut(parts), strict=True):
                device.bind_value(binding, part.name, value)

    def _kept_parts(self, parts: tuple[LayerSlice, ...]) -> HostLayerRows:
        """The parts kept row by row (HostLayerRows), every live row cut the first time."""
        kept = self._kept.get(parts)
        if kept is None:
            kept = self._kept[parts] = HostLayerRows(parts, self.capacity, self.source_len)
            kept.write(self._stacked_views(), 0, self.count)
        return kept

    def _stacked_views(self) -> dict[str, np.ndarray]:
        """The stacked rows' buffers, values (capacity, S, D) and keys, viewed in host memory."""
        assert self.buffers is not None
        shapes = self.shapes(self.capacity)
        values, keys = (host_view(self.buffers[i], shapes[i]) for i in (0, 1))
        return {"values": values, "keys": keys}

    def _cut(self, parts: tuple[LayerSlice, ...]) -> list[Any]:
        """The layer parts of the live rows' keys and values, on the device: one run of the
        cutter's graph per change of the rows (and set of parts)."""
        assert self.buffers is not None and self.cutter is not None
        if self._parts_version != self.version:
            self._parts, self._parts_version = {}, self.version
        cut = self._parts.get(parts)
        if cut is None:
            session = self.cutter(parts)
            binding, device = session.io_binding(), self.ops.device
            sources = {part.source for part in parts}
            for name, buffer, shape in zip(
                ("values", "keys"), self.buffers, self.shapes(self.count), strict=False
            ):
                if name in sources:
                    device.bind_device_input(binding, name, buffer, shape)
            for part in parts:
                device.bind_new_output(binding, part.name)
            session.run_with_iobinding(binding)
            cut = self._parts[parts] = list(device.outputs(binding))
        return cut

    def to_host(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """values (B, S, D), keys (B, S or 1, Dk), mask (B, S) copied to the host (for inspection;
        the decode loop never calls it)."""
        assert self.buffers is not None
        B = self.count
        values, keys, mask = (self.ops.device.download(b, "encoder_rows")[:B] for b in self.buffers)
        return values, keys, mask


class DeclaredStates:
    """A running batch's declared decoder state tensors beside `state` (ModelConfig.decoder_states:
    service/model/graph_contract.py), one row per row of `state`: joined at zeros, reordered by the
    step itself, each written anew by it (`new_<name>`). `positions` (R,) int64 are the state rows'
    tokens decoded so far, which a step that reads a growing tensor is given (its rows' entries
    are the last `positions` of its L); the growing axis is cut to what the rows still read once
    it is twice that (each step adds an entry to every row).

    `lazy_join` (every tensor growing, and `state` zero wide: a Transformer's): a joining
    sentence's rows get no rows of zeros appended to every cache (a copy of all of them, at nearly
    every step under a steady load); until the step writes their first entries they read row 0's,
    all masked (their positions are 0), through `cache_reorder`."""

    def __init__(
        self, specs: Sequence[StateSpec], ops: RowUpdates, lazy_join: bool = False
    ) -> None:
        self.specs = tuple(specs)
        self.ops = ops
        self.growing = any(spec.growing for spec in self.specs)
        self.lazy_join = lazy_join and all(spec.growing for spec in self.specs)
        self.values: dict[str, ort.OrtValue] = {}  # by name: StateSpec's shapes
        self.positions = np.zeros(0, np.int64)  # (R,)

    @classmethod
    def of(cls, cfg: ModelConfig, ops: RowUpdates) -> DeclaredStates | None:
        """The architecture's declared tensors (None where it declares none: the RNNs), joined
        lazily where `state` has no columns."""
        if not cfg.decoder_states:
            return None
        return cls(cfg.decoder_states, ops, lazy_join=cfg.state_dim == 0)

    @property
    def rows(self) -> int:
        """The rows the tensors hold (fewer than `positions` after a lazy join)."""
        return int(next(iter(self.values.values())).shape()[0]) if self.values else 0

    def join(self, n: int) -> None:
        """n joining sentences' rows, after the others (as `state`'s)."""
        self.positions = np.concatenate([self.positions, np.zeros(n, np.int64)])
        if self.lazy_join and self.rows:
            return
        for spec in self.specs:
            value = self.values.get(spec.name)
            if value is None:
                empty = np.zeros(spec.shape(0, 0), np.float32)
                value = self.ops.device.upload(empty, "state")
            self.values[spec.name] = self.ops.zero_rows(value, n)

    def arrange(self, reorder: np.ndarray, lengths: np.ndarray) -> None:
        """Nothing before a step: the step's graph gathers the tensors by the back-pointers."""

    def cache_reorder(self, reorder: np.ndarray) -> np.ndarray:
        """The step's reorder over the rows the tensors hold: a row joined lazily reads row 0."""
        return np.where(reorder < self.rows, reorder, 0) if self.lazy_join else reorder

    def bind(self, binding: ort.IOBinding, positions: np.ndarray | None = None) -> None:
        """The tensors as the step's inputs, and its positions (N,) where given (a step that
        computes them itself: the device search's, from its sentences' steps, binds none)."""
        device = self.ops.device
        for spec in self.specs:
            device.bind_value(binding, spec.name, self.values[spec.name])
        if positions is not None and self.growing:
            device.bind_host_input(binding, "positions", positions, "tokens")

    def bind_outputs(self, binding: ort.IOBinding) -> None:
        device = self.ops.device
        for spec in self.specs:
            device.bind_new_output(binding, "new_" + spec.name)  # on the device

    def stepped(self, outputs: Sequence[ort.OrtValue], positions: np.ndarray) -> None:
        """A step's `new_<name>` outputs (in `specs`' order) and the positions it read: theirs
        after it (one more token each); the growing axis cut where half of it is unread."""
        self.values = {s.name: v for s, v in zip(self.specs, outputs, strict=True)}
        self.positions = positions + 1
        self.cut(int(self.positions.max(initial=0)))

    def cut(self, needed: int) -> None:
        """Each growing tensor cut to its last `needed` entries where it holds twice as many."""
        for spec in self.specs:
            value = self.values.get(spec.name)
            if spec.growing and value is not None and int(value.shape()[-2]) >= max(2 * needed, 8):
                self.values[spec.name] = self.ops.keep_last(value, needed)

    def reset(self) -> None:
        self.values = {}
        self.positions = np.zeros(0, np.int64)


class HostBuffer:
    """A reusable host array that a step's output is copied into; grows, never shrinks."""

    def __init__(self, dtype: type) -> None:
        self.flat: np.ndarray = np.zeros(0, dtype)
        self.generation = 0  # counts the reallocations: a binding to an older array is stale

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        if size > len(self.flat):
            self.flat = np.zeros(max(size, 2 * len(self.flat)), self.flat.dtype)
            self.generation += 1
        return self.flat[:size].reshape(shape)


@dataclass
class SessionBinding:
    """One session's IOBinding, and what is bound to it: the encoder rows and the host outputs are
    rebound only when they change (a join, a leave, a new hypothesis count), not at each step."""

    session: ort.InferenceSession
    binding: ort.IOBinding
    bound_rows: tuple[int, ...] | None = None
    bound_outputs: tuple[int, ...] | None = None

    @classmethod
    def of(cls, session: ort.InferenceSession) -> SessionBinding:
        return cls(session, session.io_binding())


class OnnxDecoder:
    """The decoder side of one running batch; implements `service.decode.search.beam.RowsDecoder`.

    Holds the batch's encoder tensors (one row per sentence) and the state buffer (one row per
    hypothesis produced by the last step, then the initial states of sentences added since), both on
    the device. The arrays of a step's StepOutput are reused by the next step: a caller that keeps
    them across steps copies them (the beam search does not keep them).
    """

    def __init__(self, model: OnnxModel, forced: ort.InferenceSession | None = None) -> None:
        self.model = model
        self.session = forced or model.decoder
        self.full_rows = forced is not None  # the session outputs FULL_LOG_PROBS
        self.device = model.device
        self.rows = EncoderRows(
            model.row_ops,
            keys_follow_source=model.bundle.architecture.attention != "none",
            cutter=model.cut_session,
        )
        self.state: ort.OrtValue | None = None  # (R, D_state) on the device
        # the state tensors the architecture declares beside it (none for the RNNs)
        self.declared = model.declared_states()
        self.log_probs = HostBuffer(np.float32)
        self.token_ids = HostBuffer(np.int64)
        self.attention = HostBuffer(np.float32)
        self.full_log_probs = HostBuffer(np.float32)
        # One binding for every step (`SessionBinding`); a second one, on the graph with its
        # log-softmax exposed, for the steps that need every token's log-prob (`step_rows`)
        self.main = SessionBinding.of(self.session)
        self._rows: SessionBinding | None = None

    @property
    def state_rows(self) -> int:
        return 0 if self.state is None else int(self.state.shape()[0])

    def add_sentences(self, sentences: Sequence[EncodedSentence]) -> int:
        """Append sentences (at the end of the sentence order); returns the state-buffer row of the first one."""
        offset = self.state_rows
        self.state = self.rows.append(sentences, self.state)  # rows and states in one device call
        if self.declared is not None:
            self.declared.join(len(sentences))
        return offset

    def keep_sentences(self, keep: np.ndarray) -> None:
        """Drop finished sentences' encoder rows (the state rows are dropped by the next reorder)."""
        keep = np.asarray(keep, dtype=np.int64)
        self.rows.keep(keep)
        if len(keep) == 0:  # the batch is empty: its state rows are of no use to anyone
            self.state = None
            if self.declared is not None:
                self.declared.reset()

    def _bind_inputs(
        self, bound: SessionBinding, tokens: np.ndarray, reorder: np.ndarray, k: int
    ) -> None:
        """Bind one step's inputs: tokens, reorder and k from the host, the state and the running
        batch's encoder rows on the device (rebound only when the rows changed)."""
        assert self.rows.count and self.state is not None, "step() on an empty batch"
        device, binding = self.device, bound.binding
        device.bind_host_input(binding, "tokens", tokens.astype(np.int64, copy=False), "tokens")
        rows = reorder if self.declared is None else self.declared.cache_reorder(reorder)
        device.bind_host_input(binding, "reorder", rows.astype(np.int64, copy=False), "tokens")
        if self.model.k_on_host:  # read where it is, by the TopK (`topk_reads_k_on_the_host`)
            device.bind_host_argument(binding, "k", np.array([k], dtype=np.int64))
        else:
            device.bind_host_input(binding, "k", np.array(k, dtype=np.int64), "tokens")
        binding.bind_ortvalue_input("state", self.state)
        if self.declared is not None:
            positions = self.declared.positions[reorder]
            self.declared.arrange(reorder, positions)
            self.declared.bind(binding, positions)
        rows_key = self.rows.binding_key()
        if rows_key != bound.bound_rows:
            self.rows.bind(binding, bound.session)
            bound.bound_rows = rows_key

    def _bind_state_outputs(self, binding: ort.IOBinding) -> None:
        """new_state (and the declared tensors' new values) stay on the device; rebound at every
        step: a binding left from the last run would be written in place."""
        self.device.bind_new_output(binding, "new_state")
        if self.declared is not None:
            self.declared.bind_outputs(binding)

    def _take_states(self, binding: ort.IOBinding, reorder: np.ndarray) -> None:
        """The step's new state tensors (bound first: outputs 0, then the declared ones)."""
        self.state = self.device.output(binding, 0)
        if self.declared is not None:
            outputs = [self.device.output(binding, 1 + i) for i in range(len(self.declared.specs))]
            self.declared.stepped(outputs, self.declared.positions[reorder])

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        """One decoder call for every hypothesis: tokens (N,), reorder (N,) → top-k (N, k), attention (N, S)."""
        out, _ = self._run_topk(self.main, tokens, reorder, k, full=False)
        return out

    def step_rows(
        self, tokens: np.ndarray, reorder: np.ndarray, k: int
    ) -> tuple[StepOutput, np.ndarray]:
        """`step`'s output and, from the same call, every token's log-prob (N, V) in vocabulary
        order (the decoding controls' input). On a graph that cannot expose its log-softmax, the
        TopK over every token, scattered back to vocabulary order."""
        if self._rows is None:
            session = self.model.forced_session()
            self._rows = SessionBinding.of(session) if session is not None else self.main
        if self._rows is self.main:
            V = self.model.bundle.architecture.tgt_vocab_size
            out = self.step(tokens, reorder, V)
            full = np.empty_like(out.log_probs)  # (N, V)
            np.put_along_axis(full, out.token_ids, out.log_probs, axis=1)
            top = StepOutput(out.log_probs[:, :k], out.token_ids[:, :k], out.attention)
            return top, full
        out, full_rows = self._run_topk(self._rows, tokens, reorder, k, full=True)
        assert full_rows is not None
        return out, full_rows

    def _run_topk(
        self, bound: SessionBinding, tokens: np.ndarray, reorder: np.ndarray, k: int, full: bool
    ) -> tuple[StepOutput, np.ndarray | None]:
        """One call of `bound`'s session: top-k (N, k), attention (N, S), and with `full` its
        FULL_LOG_PROBS (N, V)."""
        self._bind_inputs(bound, tokens, reorder, k)
        device, binding = self.device, bound.binding
        N, S = len(tokens), self.rows.source_len
        self._bind_state_outputs(binding)
        log_probs = self.log_probs.view((N, k))  # (N, k)
        token_ids = self.token_ids.view((N, k))  # (N, k)
        attention = self.attention.view((N, S))  # (N, S)
        V = self.model.bundle.architecture.tgt_vocab_size if full else 0
        rows = self.full_log_probs.view((N, V)) if full else None  # (N, V)
        outputs_key = (
            N,
            k,
            S,
            self.log_probs.generation,
            self.token_ids.generation,
            self.attention.generation,
            self.full_log_probs.generation if full else -1,
        )
        if outputs_key != bound.bound_outputs:
            device.bind_host_output(binding, "log_probs", log_probs)
            device.bind_host_output(binding, "token_ids", token_ids)
            device.bind_host_output(binding, "attention", attention)
            if rows is not None:
                device.bind_host_output(binding, FULL_LOG_PROBS, rows)
            bound.bound_outputs = outputs_key
        self.model.run_step(bound.session, binding)
        self._take_states(binding, reorder)
        out = StepOutput(
            log_probs=device.fetched(log_probs, "topk"),
            token_ids=device.fetched(token_ids, "topk"),
            attention=device.fetched(attention, "attention"),
        )
        return out, None if rows is None else device.fetched(rows, "topk")

    def step_full(self, tokens: np.ndarray, reorder: np.ndarray) -> StepOutput:
        """One decoder call for teacher forcing: log_probs (N, V) is every token's log-prob in
        vocabulary order (token_ids (N, V) is then arange(V) per row), attention (N, S)."""
        V = self.model.bundle.architecture.tgt_vocab_size
        if not self.full_rows:  # the TopK over every token, scattered back to vocabulary order
            out = self.step(tokens, reorder, V)
            full = np.empty_like(out.log_probs)  # (N, V)
            np.put_along_axis(full, out.token_ids, out.log_probs, axis=1)
            return StepOutput(full, np.broadcast_to(np.arange(V), full.shape), out.attention)
        bound = self.main
        self._bind_inputs(bound, tokens, reorder, 1)
        session, device, binding = self.session, self.device, bound.binding
        N, S = len(tokens), self.rows.source_len
        self._bind_state_outputs(binding)
        log_probs = self.log_probs.view((N, V))  # (N, V)
        attention = self.attention.view((N, S))  # (N, S)
        outputs_key = (N, V, S, self.log_probs.generation, -1, self.attention.generation)
        if outputs_key != bound.bound_outputs:
            device.bind_host_output(binding, FULL_LOG_PROBS, log_probs)
            device.bind_host_output(binding, "attention", attention)
            bound.bound_outputs = outputs_key
        self.model.run_step(session, binding)
        self._take_states(binding, reorder)
        return StepOutput(
            log_probs=device.fetched(log_probs, "topk"),
            token_ids=np.broadcast_to(np.arange(V), (N, V)),
            attention=device.fetched(attention, "attention"),
        )
