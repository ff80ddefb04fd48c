"""One interface for a running batch's beam searches, and the host's.

A running batch (service/decode/engine/engine.py's RunningBatch) holds its searches in order of preference
and gives each joining sentence to the first that takes it; nothing above this interface knows which
search it is. Two implement it:

- `DeviceSearch` (service/decode/search/device_search.py): the search appended to the decoder step's graph,
  one device call a step; it takes the sentences whose controls it can apply on the device;
- `HostSearch` (below): the numpy search of service/decode/search/beam.py over the decoder step's top k (and
  every token's log-prob where a control reads it): the reference, and the path of the controls
  that read a hypothesis's own tokens; it takes every sentence.

Sentences join in groups (`add`): the rows of one encoder call side by side join the search's
device buffers in one copy.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.runtime import OnnxDecoder, OnnxModel
from service.decode.search.beam import BeamSearch
from service.decode.shared.controls import NO_CONTROLS, Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis

Finished = list[tuple[Hashable, list[Hypothesis]]]  # each sentence done at a step: its n-best


@dataclass(frozen=True)
class Joining:
    """A sentence joining a search: its id, its encoder rows, its options and its controls."""

    id: Hashable
    encoded: EncodedSentence
    options: SearchOptions
    controls: Controls = NO_CONTROLS


class Search(Protocol):
    @property
    def beam_size(self) -> int:
        """K: each sentence's hypothesis slots (its own beam may be smaller)."""
        ...

    def __len__(self) -> int:
        """The sentences decoding (joined ones included)."""
        ...

    def takes(self, options: SearchOptions, controls: Controls) -> bool:
        """Whether it decodes a sentence with these options and controls."""
        ...

    def add(self, joining: Sequence[Joining]) -> None:
        """These sentences join at the next step, after the others, in this order (ValueError for
        one it cannot take)."""
        ...

    def step(self) -> Finished:
        """Advance every sentence by one token; the sentences done now, with their n-best."""
        ...

    def remove(self, sentence_ids: Collection[Hashable]) -> list[Hashable]:
        """Drop sentences before they finish; returns the ids it had."""
        ...

    def take_failed(self) -> list[tuple[Hashable, Exception]]:
        """The sentences that failed on their own since the last call (their controls), which
        left it without an answer."""
        ...

    def settled(self, sentence_ids: Collection[Hashable]) -> dict[Hashable, Hypothesis]:
        """Of these sentences (those it holds that have stepped), the prefix of the best
        translation no later step can change: the tokens every live hypothesis and every
        finished one it keeps share (whichever of them, or of their continuations, wins, it begins
        so), with the first one's log-probs and attention rows cut to it."""
        ...


class HostSearch:
    """The numpy beam search (beam.BeamSearch) over the model's decoder step (runtime.OnnxDecoder),
    which holds the batch's encoder rows and decoder states on the device."""

    def __init__(
        self,
        model: OnnxModel,
        beam_size: int,
        bos_id: int,
        eos_id: int,
        vocab_size: int,
        narrow_on_eos: bool = False,
        continues_word: np.ndarray | None = None,
    ) -> None:
        self.decoder: OnnxDecoder = model.new_decoder()
        self.search = BeamSearch(
            self.decoder,
            beam_size,
            bos_id,
            eos_id,
            vocab_size=vocab_size,
            narrow_on_eos=narrow_on_eos,
            continues_word=continues_word,
        )

    @property
    def beam_size(self) -> int:
        return self.search.beam_size

    def __len__(self) -> int:
        return len(self.search)

    def takes(self, options: SearchOptions, controls: Controls) -> bool:
        return True

    def add(self, joining: Sequence[Joining]) -> None:
        """Their encoder rows and initial states join the decoder's buffers in one call, then the
        search (each sentence's state row: its place after the others')."""
        if not joining:
            return
        row = self.decoder.add_sentences([j.encoded for j in joining])
        for i, j in enumerate(joining):
            self.search.add(j.id, j.encoded.length, j.options, row + i, controls=j.controls)

    def step(self) -> Finished:
        return self.search.step()

    def remove(self, sentence_ids: Collection[Hashable]) -> list[Hashable]:
        return self.search.remove(sentence_ids)

    def take_failed(self) -> list[tuple[Hashable, Exception]]:
        return self.search.take_failed()

    def settled(self, sentence_ids: Collection[Hashable]) -> dict[Hashable, Hypothesis]:
        return self.search.settled(sentence_ids)
