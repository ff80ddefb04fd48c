"""What the runtime needs of a bundle: graphs with the contract's inputs and outputs, tokenizers
that agree with the manifest. Checked once at load, with messages that name the file.

Checksums only prove the files are the ones the manifest lists; a bundle whose checksums were
recomputed after a file was damaged or swapped passed them and then failed at the first request
(`Failed to find NodeArg with name: src`), or, with a wrong `eos_id` in the manifest, served
hypotheses full of `</s>` that never finished. The graph contract is declared here once:
export/onnx/to_onnx.py names its graphs from it and service/decode/runtime/runtime.py binds by these names.
Independent of the tokenizer kind: a vocabulary is anything with a size and special ids.

The decoder's state is named tensors: `state` (R, D_state), the encoder's per sentence (D_state may
be 0), and those the architecture declares (`ModelConfig.decoder_states`: service/model/
architecture.py's StateSpec), each read as input `name` and written as `new_<name>`, its hypothesis
axis 0, reordered inside the step by `reorder`; one that grows a step at a time is (R, L, width)
with its entries along axis 1, left-padded where a row has fewer (a sentence that joined later),
and the step then reads `positions` (N,) int64, each hypothesis's tokens decoded so far: its
entries are the last `positions` of the L it reads (a Transformer's self-attention cache, one such
tensor for the keys and one for the values of each layer). The per-sentence tensors, computed once
by the encoder, are `values` (B, S, enc_out_dim), `keys` (B, S_key, D_key) and `mask` (B, S): a
Transformer's cross-attention keys and values of every layer fit there, side by side on their last
axis. docs/architecture.md shows where a new model family plugs in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from service.model.architecture import ModelConfig, StateSpec
from service.model.bundle import BundleError

Dim = int | str | None  # None: any size; str: the ModelConfig property the size must equal


@dataclass(frozen=True)
class Port:
    """One graph input or output: its name, ONNX Runtime's type string and its shape."""

    name: str
    type: str
    shape: tuple[Dim, ...]


ENCODER_INPUTS = (
    Port("src", "tensor(int64)", (None, None)),  # (B, S) padded source ids
    Port("src_lengths", "tensor(int64)", (None,)),  # (B,)
)
ENCODER_OUTPUTS = (
    Port("values", "tensor(float)", (None, None, "enc_out_dim")),  # (B, S, 2*H_enc)
    Port("keys", "tensor(float)", (None, None, None)),  # (B, S_key, D_key)
    Port("mask", "tensor(bool)", (None, None)),  # (B, S)
    Port("state", "tensor(float)", (None, "state_dim")),  # (B, D_state)
)
DECODER_INPUTS = (
    Port("tokens", "tensor(int64)", (None,)),  # (N,)
    Port("state", "tensor(float)", (None, "state_dim")),  # (R, D_state)
    Port("reorder", "tensor(int64)", (None,)),  # (N,) back-pointers into state's rows
    Port("values", "tensor(float)", (None, None, "enc_out_dim")),
    Port("keys", "tensor(float)", (None, None, None)),
    Port("mask", "tensor(bool)", (None, None)),
    Port("k", "tensor(int64)", ()),  # scalar
)
DECODER_OUTPUTS = (
    Port("log_probs", "tensor(float)", (None, None)),  # (N, k)
    Port("token_ids", "tensor(int64)", (None, None)),  # (N, k)
    Port("new_state", "tensor(float)", (None, "state_dim")),  # (N, D_state)
    Port("attention", "tensor(float)", (None, None)),  # (N, S)
)
POSITIONS = Port("positions", "tensor(int64)", (None,))  # (N,) tokens decoded so far


def state_port(spec: StateSpec, prefix: str = "") -> Port:
    """A declared state tensor's port: (R, width), or (R, L, width) where it grows, or
    (R, heads, L, width / heads) where it grows head by head."""
    return Port(prefix + spec.name, "tensor(float)", spec.shape(None, None))


def decoder_inputs(cfg: ModelConfig) -> tuple[Port, ...]:
    """The decoder step's inputs for this architecture: the contract's, its declared state
    tensors, and `positions` where one of them grows."""
    extra = tuple(state_port(spec) for spec in cfg.decoder_states)
    return DECODER_INPUTS + extra + ((POSITIONS,) if cfg.growing_state else ())


def decoder_outputs(cfg: ModelConfig) -> tuple[Port, ...]:
    return DECODER_OUTPUTS + tuple(state_port(spec, "new_") for spec in cfg.decoder_states)


class GraphArg(Protocol):
    """What onnxruntime's NodeArg offers (session.get_inputs() / get_outputs())."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def shape(self) -> Sequence[int | str | None]: ...


class Vocabulary(Protocol):
    """What a loaded tokenizer offers, whatever its kind."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def special_ids(self) -> dict[str, int]: ...  # "pad", "bos", "eos", "unk" → id


def port_problems(
    kind: str, want: Sequence[Port], got: Sequence[GraphArg], cfg: ModelConfig, exact: bool
) -> list[str]:
    """Every way `got` differs from `want` (missing names, types, ranks, sizes the architecture
    fixes); with exact, names the contract does not know are problems too."""
    problems: list[str] = []
    by_name = {arg.name: arg for arg in got}
    for port in want:
        arg = by_name.get(port.name)
        if arg is None:
            problems.append(f"no {kind} {port.name!r} (has {sorted(by_name)})")
            continue
        if arg.type != port.type:
            problems.append(f"{kind} {port.name!r} is {arg.type}, expected {port.type}")
        shape = list(arg.shape)
        if len(shape) != len(port.shape):
            problems.append(
                f"{kind} {port.name!r} has rank {len(shape)} {shape}, expected {len(port.shape)}"
            )
            continue
        for axis, (size, dim) in enumerate(zip(shape, port.shape, strict=True)):
            expected = getattr(cfg, dim) if isinstance(dim, str) else dim
            if isinstance(size, int) and expected is not None and size != expected:
                problems.append(
                    f"{kind} {port.name!r} axis {axis} is {size}, the manifest's architecture "
                    f"gives {dim} = {expected}"
                )
    if exact:
        known = {port.name for port in want}
        problems += [f"unexpected {kind} {name!r}" for name in sorted(set(by_name) - known)]
    return problems


def check_graph(
    path: Path,
    role: str,
    inputs: Sequence[GraphArg],
    outputs: Sequence[GraphArg],
    cfg: ModelConfig,
) -> None:
    """Raise BundleError naming `path` unless its graph is the `role` ("encoder"/"decoder") graph."""
    want_in, want_out = (
        (ENCODER_INPUTS, ENCODER_OUTPUTS)
        if role == "encoder"
        else (decoder_inputs(cfg), decoder_outputs(cfg))
    )
    problems = port_problems("input", want_in, inputs, cfg, exact=True)
    problems += port_problems("output", want_out, outputs, cfg, exact=False)
    if problems:
        raise BundleError(
            f"{path} is not the {role} graph this bundle's manifest describes: "
            + "; ".join(problems)
        )


def check_vocabularies(
    manifest: Path, cfg: ModelConfig, source: Vocabulary, target: Vocabulary
) -> None:
    """Raise BundleError unless the architecture's vocabulary sizes and special ids are the loaded
    tokenizers' (the search stops on cfg.eos_id; the graphs embed cfg's vocabulary sizes)."""
    problems: list[str] = []
    for side, vocab, field in (("source", source, "src"), ("target", target, "tgt")):
        size = getattr(cfg, f"{field}_vocab_size")
        if vocab.vocab_size != size:
            problems.append(
                f"{field}_vocab_size is {size} but the {side} tokenizer has {vocab.vocab_size} entries"
            )
        for name, tok_id in sorted(vocab.special_ids.items()):
            arch_id = getattr(cfg, f"{name}_id")
            if tok_id != arch_id:
                problems.append(f"{name}_id is {arch_id} but the {side} tokenizer's is {tok_id}")
    if problems:
        raise BundleError(
            f"{manifest}: the architecture disagrees with the bundle's tokenizers: "
            + "; ".join(problems)
        )
