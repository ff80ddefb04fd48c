"""ONNX Runtime sessions for a bundle's encoder and decoder-step graphs.

The decoder runs through IOBinding: the recurrent state and the encoder tensors are OrtValues on the
session's device (GPU memory under the CUDA provider) and stay there between steps; only token ids and
back-pointers go in, and only the top-k candidates and the attention row come back to the host, into
reusable host buffers. The same code runs under the CPU provider in the tests.

Sentences joining or leaving the running batch change the device buffers in place
(`service.decode.runtime.row_ops.RowOps`): a join uploads only the joining sentences' rows and initial states, a leave
moves rows on the device, and the decoder state never leaves it. Every host↔device copy is counted
in the model's `TransferLedger` (`service.decode.runtime.transfers`), so the bytes per step are a tested quantity:
O(joining sentences + hypotheses × (k + source length)), never O(batch × source length).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnxruntime as ort

from service.decode.runtime.attention_choice import AttentionChoice, choose_attention
from service.decode.runtime.batch_graphs import finished_graph, grow_graph, select_graph
from service.decode.runtime.blocked_topk import block_topk
from service.decode.runtime.cache_in_place import (
    SLOT_INPUTS,
    CachesInPlace,
    attend_in_place,
    cacheable,
)
from service.decode.runtime.device import Device
from service.decode.runtime.encoded import (
    Encoded,
    EncodedSentence,
    length_buckets,
    pad_ids,
    split_sentences,
)
from service.decode.runtime.encoder_layers import (
    LayerSlice,
    parse_slice,
    split_encoder_inputs,
    split_graph,
)
from service.decode.runtime.encoder_rows import DeclaredStates, EncoderRows, HostBuffer
from service.decode.runtime.providers import CPU, CUDA, check_model_providers
from service.decode.runtime.row_ops import make_row_ops
from service.decode.runtime.search_graph import (
    controls_problem,
    graph_problem,
    search_scores_output,
    search_step_graph,
)
from service.decode.runtime.search_variant import (
    SearchVariant,
    covers_needs,
    extra_needs,
    full,
    same_beam,
)
from service.decode.runtime.sessions import (
    ArenaShrink,
    SharedWeights,
    make_session,
    provider_options,
    release_freed_memory,
)
from service.decode.runtime.step_graph import (
    FULL_LOG_PROBS,
    GraphInput,
    decoder_graph,
    float16_decoder,
    topk_reads_k_on_the_host,
)
from service.decode.runtime.transfers import TransferLedger
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.search_types import StepOutput
from service.model.architecture import StateSpec
from service.model.bundle import Bundle
from service.model.int8 import warn_once_if_saturating

log = logging.getLogger(__name__)

# Align's sessions with a chosen cross-attention kept (OnnxModel.choice_session)
CHOICE_SESSIONS = 4


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
        # guards every session made on first use (Align's, the choices, the searches, their helpers, the
        # cut ones): two threads asking for one make it once
        self._lazy_sessions_lock = threading.Lock()
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
        with self._lazy_sessions_lock:
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
        with self._lazy_sessions_lock:
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
        with self._lazy_sessions_lock:
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
        with self._lazy_sessions_lock:
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
        with self._lazy_sessions_lock:
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
        with self._lazy_sessions_lock:
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
