"""What the searches and the decoders exchange: a step's output, the decoder protocols, and a
finished hypothesis (service/decode/search/beam.py, device_search.py, runtime.py and the results read
them; none of them holds search logic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class StepOutput:
    """One decoder step for N = B*K hypotheses.

    log_probs: (N, k) float32, log-softmax values sorted descending per row.
    token_ids: (N, k) int64, the tokens of those values.
    attention: (N, S) float32, this step's attention over the batch's padded source positions
        (columns beyond a sentence's own length are 0).
    """

    log_probs: np.ndarray
    token_ids: np.ndarray
    attention: np.ndarray


class Decoder(Protocol):
    """The model's decoder step over the running batch; it keeps the recurrent state itself."""

    def step(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> StepOutput:
        """tokens (N,) int64: the previous token of each of the N = B*K hypotheses.
        reorder (N,) int64: for each new row, the row of the decoder's current state buffer it
        continues (beam back-pointers; also how rows of finished sentences are dropped and new
        sentences' initial states are picked up).
        Returns the top-k next tokens per hypothesis."""
        ...

    def keep_sentences(self, keep: np.ndarray) -> None:
        """keep (B',) int64: sentence indices (into the current B sentences) that stay, in order.
        Drops encoder rows of finished sentences."""
        ...


class RowsDecoder(Decoder, Protocol):
    """A decoder that can also return every token's log-prob, for the decoding controls."""

    def step_rows(
        self, tokens: np.ndarray, reorder: np.ndarray, k: int
    ) -> tuple[StepOutput, np.ndarray]:
        """`step`'s top-k output and the whole log-softmax (N, V) of the same call, in
        vocabulary order."""
        ...


@dataclass(frozen=True, eq=False)
class Hypothesis:
    """One finished translation.

    tokens: the target ids, without EOS.
    score: the normalized score used for ranking (log_prob / lp + cp; the controls' scores where
        they change the model's, as a repetition penalty does).
    log_prob: the sum of the token log-probs, EOS included when the hypothesis ended with it.
    token_log_probs: (len(tokens),) each token's log-prob under the model.
    attention: (len(tokens), src_len) float32, this hypothesis's own attention row per returned
        token over the sentence's real source positions; None unless asked for.
    finished_by_eos: False when the hypothesis was cut at the maximum length.
    """

    tokens: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None
    finished_by_eos: bool
    token_log_probs: np.ndarray | None = None


# a sentence's settled prefix grew (Search.settled): its index among the sentences decoded, the
# prefix (the part of its best translation no later step can change: tokens, log-probs, rows)
Settled = Callable[[int, Hypothesis], None]
