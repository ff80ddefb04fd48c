"""The decoder's own settings: ONNX Runtime's (providers, threads, CUDA options, row ops) and the
input limits the engine enforces. The server's settings (service/serve/config.py) hold one of each
and build them from flags; `setting` is the field kind both use for a flag's help text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CUDA_ARENA_EXTEND: tuple[str, ...] = ("kSameAsRequested", "kNextPowerOfTwo")
ROW_OPS: tuple[str, ...] = ("auto", "graph", "host")
REQUIRE_PROVIDER: tuple[str, ...] = ("", "cuda")  # --require-provider's values ("": none)
AUTO = "auto"  # --providers auto: the GPU (CUDA) where one is usable, else the CPU
SEARCHES: tuple[str, ...] = ("device", "host")  # where a running batch's beam search runs


def setting(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A settable field with its --help text (and its choices, if it has a fixed set)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class RuntimeConfig:
    """ONNX Runtime: which execution providers, which device, how many threads."""

    providers: tuple[str, ...] = setting(
        (AUTO,),
        "ONNX Runtime execution providers, comma-separated, in order of preference (those not "
        "installed are skipped); auto = the GPU where one is usable, else the CPU, said in one "
        "line at start; naming CUDAExecutionProvider asks for the GPU: a warning if a model "
        "then runs on the CPU",
    )
    require_provider: str = setting(
        "",
        "refuse to start (and to load a model) unless this provider loads: cuda; empty = fall "
        "back to the next provider",
        REQUIRE_PROVIDER,
    )
    device_id: int = setting(0, "the GPU used by the CUDA provider")
    intra_op_threads: int = setting(
        0, "threads of the decoder-step session; 0 = ONNX Runtime's default (one per core)"
    )
    # The encoder session runs beside the decoder's (service/decode/engine/encode_ahead.py), so by default it
    # takes one thread rather than competing for every core.
    encoder_threads: int = setting(
        1, "threads of the encoder session, which runs beside the decoder's; 0 = one per core"
    )
    inter_op_threads: int = setting(0, "ONNX Runtime inter-op threads; 0 = its default")
    int8_decoder: bool = setting(False, "use the bundle's int8-quantized decoder-step graph")
    # service/decode/runtime/cache_in_place.py: a Transformer's caches in place, on the CPU provider
    cache_in_place: bool = setting(
        True,
        "on the CPU, keep a Transformer's self-attention caches in place, each row attending over "
        "its own entries (off: the graph gathers and grows them at every step)",
    )
    # ONNX Runtime's intra-op threads spin while waiting for work by default: good for a dedicated
    # core, bad when the gRPC loop and the search share the cores with them. Off unless asked for.
    spin_wait: bool = setting(
        False, "let ONNX Runtime's threads spin while idle (only with cores to spare)"
    )
    # CUDA execution provider (service/decode/runtime/runtime.py's cuda_provider_options says why each is set so).
    # Every session of a process allocates its CPU tensors from one arena (ONNX Runtime's
    # environment allocator) instead of an arena of its own: a model's device-search variants are
    # many sessions, and each arena kept its own peak (service/decode/runtime/runtime.py: shared_cpu_arena).
    shared_cpu_arena: bool = setting(
        True, "one CPU memory arena for every session of the process (off: one per session)"
    )
    max_search_sessions: int = setting(
        24,
        "device-search graph variants a model keeps (a beam size and what its sentences need: up "
        "to sixteen a beam size); the least recently used goes first, made again when needed",
    )
    # service/decode/runtime/runtime.py's search_variant_for: each variant is a session with its own
    # packed copy of the decoder's weights (14 MiB on grc-en-nt-transformer, 9 on grc-en-nt), and
    # a mixed load asks for many of them: up to sixteen a beam size held about 235 MiB an engine
    # more than the host search under the mixed soak (median and peak; docs/soak.md).
    search_graphs_per_beam: int = setting(
        2,
        "device-search graph variants a model makes for one beam size before a batch runs on one "
        "that does more than its sentences need (coverage, controls, attention rows, n-best "
        "lists: the same answers, some work they do not use); each holds its own packed copy of "
        "the decoder's weights",
    )
    # service/decode/runtime/runtime.py's ArenaShrink: the CPU arena keeps the peak of the largest batch
    # it ran (an engine that took its killed peer's load kept it), unless a run frees it.
    arena_shrink_s: float = setting(
        5.0,
        "at most this often for each model, one of its decoder steps frees what the CPU memory "
        "arena holds beyond its live tensors, and the heap's freed pages go back to the system; "
        "0 = never",
    )
    cuda_arena_extend: str = setting(
        "kSameAsRequested",
        "how the CUDA memory arena grows: by what is requested, or to the next power of two",
        CUDA_ARENA_EXTEND,
    )
    cuda_mem_limit_mb: int = setting(0, "cap on the CUDA memory arena in MiB; 0 = no cap")
    cuda_copy_in_default_stream: bool = setting(
        True, "host<->device copies on the compute stream (off: on a copy stream of their own)"
    )
    # The running batch's row updates (service/decode/runtime/device.py): tiny graphs on the model's device, or
    # numpy writes where that device's memory is the host's. "auto" picks by the device.
    row_ops: str = setting(
        "auto",
        "how a running batch's rows are joined and compacted: graphs on the model's device, "
        "numpy writes in host memory (CPU only), or auto (host on the CPU, graphs on a GPU)",
        ROW_OPS,
    )
    cuda_tf32: bool = setting(
        False, "TF32 matrix products on the GPU (faster on Ampere and later, not fp32 rounding)"
    )
    # service/decode/runtime/runtime.py's float16_decoder: the decoder step's weights and arithmetic in
    # float16, its log-softmax, top k and outputs (and so the search's scores) in float32.
    fp16_decoder: bool = setting(
        False,
        "run the decoder step in float16 (its log-softmax, top k and outputs stay float32): for a "
        "GPU; the CPU provider runs such a graph with casts around the nodes it has no float16 "
        "kernel for (no faster)",
    )
    # service/decode/search/device_search.py: the step's graph ends with the next beam; "host" is the
    # numpy search over the step's top k (service/decode/search/beam.py), kept as the reference.
    search: str = setting(
        "device",
        "where a running batch's beam search runs: device (each decoder call returns the next "
        "beam, the history stays on the device) or host (numpy over the step's top k)",
        SEARCHES,
    )

    def __post_init__(self) -> None:
        if not self.providers:
            raise ValueError("providers must name at least one execution provider")
        if self.require_provider not in REQUIRE_PROVIDER:
            raise ValueError(
                f"require_provider must be 'cuda' or empty, got {self.require_provider!r}"
            )
        if AUTO in self.providers and len(self.providers) > 1:
            raise ValueError(f"providers: auto stands alone, got {','.join(self.providers)}")
        named = self.providers != (AUTO,)  # auto may find CUDA: --require-provider says if not
        if self.require_provider and named and "CUDAExecutionProvider" not in self.providers:
            raise ValueError(
                "require_provider cuda needs CUDAExecutionProvider among the providers "
                "(or providers auto)"
            )
        if self.cuda_arena_extend not in CUDA_ARENA_EXTEND:
            raise ValueError(
                f"cuda_arena_extend must be one of {CUDA_ARENA_EXTEND}, got {self.cuda_arena_extend!r}"
            )
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.row_ops not in ROW_OPS:
            raise ValueError(f"row_ops must be one of {ROW_OPS}, got {self.row_ops!r}")
        if self.cuda_mem_limit_mb < 0:
            raise ValueError("cuda_mem_limit_mb must be >= 0 (0: no cap)")
        if self.max_search_sessions < 1:
            raise ValueError("max_search_sessions must be >= 1")
        if self.arena_shrink_s < 0:
            raise ValueError("arena_shrink_s must be >= 0 (0: never)")
        if self.search_graphs_per_beam < 1:
            raise ValueError("search_graphs_per_beam must be >= 1")
        if (
            min(self.device_id, self.intra_op_threads, self.encoder_threads, self.inter_op_threads)
            < 0
        ):
            raise ValueError("device_id and thread counts must be >= 0")


@dataclass(frozen=True)
class EngineLimits:
    """Input limits the engine enforces (the server reports them in ModelInfo)."""

    max_source_tokens: int = setting(256, "the most subword tokens of one source text")
    max_length: int = setting(512, "the most target tokens a request may ask for (max_length)")
    max_beam_size: int = setting(16, "the largest beam a request may ask for")
    max_prefix_tokens: int = setting(
        128, "the most target tokens of one text's target_prefix (after tokenization)"
    )
    max_ngram_size: int = setting(16, "the largest no_repeat_ngram_size a request may ask for")
    max_alternatives: int = setting(16, "the most alternatives (return_alternatives) per text")
    max_suppress: int = setting(256, "the most suppress entries of one request")
    max_protect: int = setting(32, "the most protect entries of one request")
    max_glossary_terms: int = setting(
        32, "the most glossary terms of one request, and the most terms one text may match"
    )
    max_term_tokens: int = setting(16, "the most target tokens of one glossary term")
    min_confidence: float = setting(
        -1.0,
        "mark hypotheses whose confidence is below this in [0, 1] (low_confidence) and count them; "
        '-1 = the bundle\'s manifest threshold ("confidence": {"threshold": x}), if any',
    )

    def __post_init__(self) -> None:
        if (
            min(
                self.max_source_tokens,
                self.max_length,
                self.max_beam_size,
                self.max_prefix_tokens,
                self.max_ngram_size,
                self.max_alternatives,
                self.max_suppress,
                self.max_protect,
                self.max_glossary_terms,
                self.max_term_tokens,
            )
            < 1
        ):
            raise ValueError("engine limits must be >= 1")
        if self.max_glossary_terms > 63:  # a hypothesis's constraints met are bits of an int64
            raise ValueError("max_glossary_terms must be <= 63")
        if not (self.min_confidence == -1 or 0 <= self.min_confidence <= 1):
            raise ValueError("min_confidence must be in [0, 1] (or -1: the bundle's threshold)")
