"""ONNX Runtime sessions as this service makes them: the CUDA provider's options, weights shared
between a model's sessions, the CPU arena and its shrinking, and a graph handed to ONNX Runtime as
a file when it is too large for bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from service.decode.runtime.providers import CUDA, resolve_providers
from service.decode.shared.config import RuntimeConfig
from service.model.bundle import BundleError


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
