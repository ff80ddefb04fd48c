"""Align on documents: a pair whose source and given translation are texts of many sentences.

Each side is cut into sentences (service/model/sentences.py, each side in its own language); when
both sides hold as many sentences, the k-th source sentence is aligned with the k-th target
sentence, each pair teacher-forced as a pair of its own in the forced batch, and the answers are
joined: tokens and words one after another (the client's whitespace words of the whole texts),
the matrices block-diagonal (links only within a sentence pair), the hard links and unknown
indices offset, the log-probabilities summed (eos_log_prob: every sentence's end). Where the sides
hold different numbers of sentences (a translation that merged or split sentences), or with
markup, the pair is aligned whole, as without documents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.decode.align.forced import AlignedPair
from service.decode.shared import alignment as align
from service.decode.shared.errors import InvalidInput
from service.model.sentences import split_sentences


@dataclass(frozen=True)
class PairCut:
    """A request's pairs as sentence pairs: `pairs[j]` is of pair `owners[j]`."""

    pairs: list[tuple[str, str]]
    owners: list[int]

    def parts_of(self, owner: int) -> list[int]:
        return [j for j, o in enumerate(self.owners) if o == owner]


def cut_pairs(
    pairs: Sequence[tuple[str, str]],
    mode: str,
    languages: tuple[str, str],
    max_sentences: int | None,
) -> PairCut:
    """Each pair cut into sentence pairs where both sides hold as many (the module docstring);
    InvalidInput when the request holds more than `max_sentences` sentence pairs."""
    out: list[tuple[str, str]] = []
    owners: list[int] = []
    for i, (source, target) in enumerate(pairs):
        sides = [] if mode == "off" else [
            split_sentences(text, mode, language)
            for text, language in zip((source, target), languages, strict=True)
        ]  # fmt: skip
        if len(sides) == 2 and len(sides[0]) == len(sides[1]) > 1:
            for (a, b), (c, d) in zip(*sides, strict=True):
                out.append((source[a:b], target[c:d]))
                owners.append(i)
        else:
            out.append((source, target))
            owners.append(i)
    if max_sentences is not None and len(out) > max_sentences:
        raise InvalidInput(
            f"the request's pairs hold {len(out)} sentence pairs, over the limit of "
            f"{max_sentences} (Limits.max_sentences): send the documents in parts"
        )
    return PairCut(out, owners)


def join_cut(cut: PairCut, answers: Sequence[AlignedPair], pairs: int) -> list[AlignedPair]:
    """Each pair's answer: its sentence pairs' joined, or as aligned."""
    out = []
    for i in range(pairs):
        parts = [answers[j] for j in cut.parts_of(i)]
        out.append(parts[0] if len(parts) == 1 else join_aligned(parts))
    return out


def join_aligned(parts: Sequence[AlignedPair]) -> AlignedPair:
    """Sentence pairs' answers as one pair's (the module docstring)."""

    def joined(name: str) -> align.Alignment | None:
        found = [getattr(p, name) for p in parts]
        if any(a is None for a in found):
            return None
        return align.block_join(found)

    def indices(name: str, sizes: str) -> list[int]:
        got = [getattr(p, name) for p in parts]
        return list(align.offset_indices(got, [len(getattr(p, sizes)) for p in parts]))

    log_prob = sum(p.log_prob for p in parts)
    tokens = sum(len(p.target_tokens) + 1 for p in parts)  # each sentence's end counted
    return AlignedPair(
        source_tokens=[t for p in parts for t in p.source_tokens],
        target_tokens=[t for p in parts for t in p.target_tokens],
        source_words=[w for p in parts for w in p.source_words],
        target_words=[w for p in parts for w in p.target_words],
        subword=joined("subword"),
        word=joined("word"),
        pharaoh=align.offset_pharaoh(
            [(p.pharaoh, len(p.source_words), len(p.target_words)) for p in parts]
        ),
        token_log_probs=[x for p in parts for x in p.token_log_probs],
        eos_log_prob=sum(p.eos_log_prob for p in parts),
        log_prob=log_prob,
        confidence=math.exp(log_prob / tokens) if tokens else 0.0,
        unknown_source_tokens=indices("unknown_source_tokens", "source_tokens"),
        unknown_target_tokens=indices("unknown_target_tokens", "target_tokens"),
        unknown_source_words=indices("unknown_source_words", "source_words"),
        unknown_target_words=indices("unknown_target_words", "target_words"),
    )
