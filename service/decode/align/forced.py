"""Teacher forcing over the decoder step, pure numpy: the `Align` pass.

The same running-batch protocol as the beam search (service/decode/search/beam.py), with one hypothesis
per sentence and its next token given rather than chosen: each step feeds every pair the previous
token of its own target (BOS first), and reads back the log-probability the model gives the
target's next token (EOS after the last one) and this step's attention. A pair of T target tokens
takes T + 1 steps and leaves; pairs join and leave between steps like the search's sentences.

The decoder's `step_full` returns each row's whole log-softmax over the target vocabulary, in
vocabulary order (service/decode/runtime/runtime.py reads it from the step graph's TopK input, so every
bundle, the embedded models included, aligns as it is), and the forced token's log-probability is
read from its row.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from service.decode.align import links as link_modes
from service.decode.search.beam import compaction_order
from service.decode.shared.alignment import Alignment
from service.decode.shared.search_types import StepOutput
from service.model.markup import INVALID_MARKUP, MARKUP_MODES

Matrices = Literal["both", "none", "subword", "word"]
MATRICES: tuple[str, ...] = ("both", "none", "subword", "word")
# The modes with the best AER on the Greek model's dev split (docs/align.md): the link head's where
# the bundle has one, else grow-diag-final-and over the attention.
DEFAULT_LINKS = "grow"
DEFAULT_LINKS_WITH_HEAD = "head"


def default_links(has_link_head: bool) -> str:
    """The link mode an Align request without one gets from a model."""
    return DEFAULT_LINKS_WITH_HEAD if has_link_head else DEFAULT_LINKS


# AlignOptions.attention: a Transformer's decoder layer and head asked (either None: the model's)
Attention = tuple[int | None, int | None] | None


@dataclass(frozen=True)
class AlignOptions:
    links: str = ""  # one of service.decode.align.links.LINK_MODES; "": the model's default_links
    threshold: float = link_modes.DEFAULT_THRESHOLD  # links "threshold" only
    matrices: Matrices = "both"  # which attention matrices the result keeps
    markup: str = "none"  # the sources' markup (service/model/markup.py): none, xml or html
    invalid_markup: str = "refuse"  # markup that does not read: refuse, or text (read as text)
    # A Transformer's cross-attention to align by (service/decode/runtime/attention_choice.py): a decoder
    # layer (0-based; None: the bundle's alignment layer) and a head (None: the heads averaged);
    # both None: the bundle's own alignment heads
    attention_layer: int | None = None
    attention_head: int | None = None

    @property
    def attention(self) -> Attention:
        """The asked layer and head, None where neither was asked (the running batch's key)."""
        if self.attention_layer is None and self.attention_head is None:
            return None
        return self.attention_layer, self.attention_head

    def problems(self) -> list[str]:
        found = []
        for name in ("attention_layer", "attention_head"):
            value = getattr(self, name)
            if value is not None and value < 0:
                found.append(f"{name} must be >= 0 (0 is the first), got {value}")
        if self.markup not in MARKUP_MODES:
            found.append(f"markup must be one of {', '.join(MARKUP_MODES)}, got {self.markup!r}")
        if self.invalid_markup not in INVALID_MARKUP:
            found.append(
                f"invalid_markup must be one of {', '.join(INVALID_MARKUP)}, "
                f"got {self.invalid_markup!r}"
            )
        if self.links and self.links not in link_modes.LINK_MODES:
            found.append(f"links must be one of {link_modes.LINK_MODES}, got {self.links!r}")
        if not 0 < self.threshold <= 1:
            found.append(f"threshold must be in (0, 1], got {self.threshold}")
        if self.matrices not in MATRICES:
            found.append(f"matrices must be one of {MATRICES}, got {self.matrices!r}")
        return found


@dataclass(frozen=True)
class AlignedPair:
    """One pair's answer: see proto/translation/v1/translation.proto's PairAlignment."""

    source_tokens: list[str]
    target_tokens: list[str]
    source_words: list[str]
    target_words: list[str]
    subword: Alignment | None  # (T, S) over pieces
    word: Alignment | None  # (T_w, S_w) over the client's words
    pharaoh: str  # word links by the requested mode
    token_log_probs: list[float]  # (T,)
    eos_log_prob: float
    log_prob: float  # sum(token_log_probs) + eos_log_prob
    confidence: float  # exp(log_prob / (T + 1))
    unknown_source_tokens: list[int]
    unknown_target_tokens: list[int]
    unknown_source_words: list[int]
    unknown_target_words: list[int]
    tagged_target: str = ""  # with markup: the target with the source's markup put back


@dataclass(frozen=True)
class Forced:
    """One pair's teacher-forced pass.

    token_log_probs: (T + 1,) float64, log P(y_t | x, y_<t) of each target token, then of EOS.
    attention: (T + 1, S) float32, each step's attention over the source (the EOS step last).
    """

    token_log_probs: np.ndarray
    attention: np.ndarray

    @property
    def log_prob(self) -> float:
        """log P(target | source): the sum over the target tokens and EOS."""
        return float(self.token_log_probs.sum())


@dataclass
class _Pair:
    id: Hashable
    forced: np.ndarray  # (T + 1,) int64: the target ids, then EOS
    src_len: int
    log_probs: list[float] = field(default_factory=list)
    attention: list[np.ndarray] = field(default_factory=list)  # rows (src_len,)

    @property
    def steps(self) -> int:
        return len(self.log_probs)

    @property
    def done(self) -> bool:
        return self.steps == len(self.forced)

    def result(self) -> Forced:
        return Forced(np.array(self.log_probs, np.float64), np.stack(self.attention))


class ForcedDecoder(Protocol):
    """The model's decoder step over a running batch, every token's log-prob per row."""

    def step_full(self, tokens: np.ndarray, reorder: np.ndarray) -> StepOutput:
        """tokens (N,), reorder (N,) as `beam.Decoder.step`'s; log_probs (N, V) in vocabulary
        order, attention (N, S)."""
        ...

    def keep_sentences(self, keep: np.ndarray) -> None: ...


class ForcedSearch:
    """Teacher forcing for a running batch of pairs, one decoder row each, over one Decoder.

    Order of calls as BeamSearch's: `add` joining pairs (their initial decoder states already
    appended to the state buffer at `state_row`), then `step`; finished pairs are returned by `step`
    and dropped from the batch and the decoder before it returns.
    """

    def __init__(self, decoder: ForcedDecoder, bos_id: int, eos_id: int, vocab_size: int) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self._decoder = decoder
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._vocab_size = vocab_size
        self._pairs: list[_Pair] = []
        self._rows = np.zeros(0, np.int64)  # (B,) the state row each pair continues
        self._ids: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._pairs)

    @property
    def pair_ids(self) -> list[Hashable]:
        return [p.id for p in self._pairs]

    def add(self, pair_id: Hashable, src_len: int, target: list[int], state_row: int) -> None:
        """A pair joins at the end of the batch; its initial state is decoder buffer row state_row."""
        if src_len < 1:
            raise ValueError(f"src_len must be >= 1, got {src_len}")
        if pair_id in self._ids:
            raise ValueError(f"pair {pair_id!r} is already decoding")
        if any(not 0 <= t < self._vocab_size for t in target):
            raise ValueError(f"target ids must be in [0, {self._vocab_size})")
        self._ids.add(pair_id)
        forced = np.array([*target, self._eos_id], np.int64)  # (T + 1,)
        self._pairs.append(_Pair(pair_id, forced, src_len))
        self._rows = np.append(self._rows, np.int64(state_row))

    def step(self) -> list[tuple[Hashable, Forced]]:
        """Advance every pair by one target token; return the pairs done now."""
        if not self._pairs:
            return []
        B = len(self._pairs)
        fed = np.array(  # (B,) each pair's previous token: BOS, then its own target
            [self._bos_id if p.steps == 0 else p.forced[p.steps - 1] for p in self._pairs],
            np.int64,
        )
        wanted = np.array([p.forced[p.steps] for p in self._pairs], np.int64)  # (B,)
        out = self._decoder.step_full(fed, self._rows)
        if out.attention.shape[0] != B or out.log_probs.shape != (B, self._vocab_size):
            raise ValueError(f"decoder returned {out.log_probs.shape} log-probs for {B} pairs")
        log_probs = out.log_probs[np.arange(B), wanted].tolist()  # (B,)
        for b, pair in enumerate(self._pairs):
            pair.log_probs.append(float(log_probs[b]))
            pair.attention.append(out.attention[b, : pair.src_len].copy())  # (src_len,)
        self._rows = np.arange(B, dtype=np.int64)  # each pair continues its own new row
        done = np.array([p.done for p in self._pairs], bool)  # (B,)
        results = [(p.id, p.result()) for p in self._pairs if p.done]
        if results:
            self._drop(done)
        return results

    def remove(self, pair_ids: Collection[Hashable]) -> list[Hashable]:
        """Drop pairs before they finish (cancelled, deadline passed); returns the ids removed."""
        drop = np.array([p.id in pair_ids for p in self._pairs], bool)  # (B,)
        removed = [p.id for p, d in zip(self._pairs, drop, strict=True) if d]
        if removed:
            self._drop(drop)
        return removed

    def _drop(self, done: np.ndarray) -> None:
        keep = compaction_order(done)  # (B',) int64
        self._ids.difference_update(self._pairs[b].id for b in np.flatnonzero(done))
        self._pairs = [self._pairs[b] for b in keep.tolist()]
        self._rows = self._rows[keep]
        self._decoder.keep_sentences(keep)
