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
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.beam import StepOutput
from service.bundle import Bundle
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


def make_session(path: str, config: RuntimeConfig) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not config.spin_wait:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    providers = resolve_providers(config.providers)
    provider_options = [
        {"device_id": str(config.device_id)} if p == CUDA else {} for p in providers
    ]
    return ort.InferenceSession(
        path, sess_options=options, providers=providers, provider_options=provider_options
    )


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
        self.encoder = make_session(str(bundle.file("encoder.onnx")), config)
        self.decoder = make_session(str(bundle.file(decoder_file)), config)
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

    def new_decoder(self) -> OnnxDecoder:
        return OnnxDecoder(self)


class OnnxDecoder:
    """The decoder side of one running batch; implements `service.beam.Decoder`.

    Holds the batch's encoder tensors (one row per sentence) and the state buffer (one row per
    hypothesis produced by the last step, then the initial states of sentences added since).
    """

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self.values: np.ndarray | None = None  # host copies for composition changes: (B, S, D)
        self.keys: np.ndarray | None = None
        self.mask: np.ndarray | None = None  # (B, S) bool
        self.device_tensors: tuple[ort.OrtValue, ort.OrtValue, ort.OrtValue] | None = None
        self.state: ort.OrtValue | None = None  # (R, D_state)
        self.fixed_context = model.bundle.architecture.attention == "none"

    @property
    def num_sentences(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def state_rows(self) -> int:
        return 0 if self.state is None else int(self.state.shape()[0])

    def add_sentences(self, encoded: Encoded) -> int:
        """Append sentences (at the end of the sentence order); returns the state-buffer row of the first one."""
        offset = self.state_rows
        new_values, new_keys, new_mask = (
            encoded.values.numpy(),
            encoded.keys.numpy(),
            encoded.mask.numpy(),
        )
        if self.mask is None:
            self.values, self.keys, self.mask = new_values, new_keys, new_mask
        else:
            assert self.values is not None and self.keys is not None
            self.values = concat_padded(self.values, new_values)
            self.mask = concat_padded(self.mask, new_mask)
            self.keys = (
                np.concatenate([self.keys, new_keys])
                if self.fixed_context
                else concat_padded(self.keys, new_keys)
            )
        new_state = encoded.state.numpy()
        state = new_state if self.state is None else np.concatenate([self.state.numpy(), new_state])
        self.state = self.model.to_device(state)
        self.upload_encoder_tensors()
        return offset

    def keep_sentences(self, keep: np.ndarray) -> None:
        """Drop finished sentences' encoder rows; trim the source axis to the longest that remains."""
        assert self.values is not None and self.keys is not None and self.mask is not None
        keep = np.asarray(keep, dtype=np.int64)
        if len(keep) == 0:  # the batch is empty: forget everything
            self.values = self.keys = self.mask = None
            self.device_tensors = None
            self.state = None
            return
        mask = self.mask[keep]  # (B', S)
        S = max(int(mask.sum(axis=1).max()), 1)
        self.mask = mask[:, :S]
        self.values = self.values[keep, :S]
        self.keys = self.keys[keep] if self.fixed_context else self.keys[keep, :S]
        self.upload_encoder_tensors()

    def upload_encoder_tensors(self) -> None:
        assert self.values is not None and self.keys is not None and self.mask is not None
        self.device_tensors = (
            self.model.to_device(self.values),
            self.model.to_device(self.keys),
            self.model.to_device(self.mask),
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


def concat_padded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Concatenate along axis 0, zero-padding axis 1 (the source length) to the longer of the two."""
    S = max(a.shape[1], b.shape[1])
    return np.concatenate([pad_axis1(a, S), pad_axis1(b, S)])


def pad_axis1(x: np.ndarray, S: int) -> np.ndarray:
    if x.shape[1] == S:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, S - x.shape[1])
    return np.pad(x, widths)
