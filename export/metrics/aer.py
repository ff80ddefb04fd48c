"""Word alignments in Pharaoh format, and their alignment error rate against gold links.

Pharaoh: `i-j i-j ...`, 0-based, source word i with target word j, words being `text.split(" ")`.
AER is Och and Ney's (2003) with every gold link sure (S = P = G):

    AER = 1 - 2|A∩G| / (|A| + |G|),   precision = |A∩G| / |A|,   recall = |A∩G| / |G|

over the gold words: a link of A counts only when its target word has a gold link (a word the
annotators left unaligned, or a sentence without gold, is not scored). Over a corpus the counts are
summed over sentences and the rates taken once (not a mean of per-sentence rates).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Link = tuple[int, int]  # (source word, target word)

_LINK = re.compile(r"(\d+)[-p](\d+)")  # `i-j` (sure) or `ipj` (possible: read as a link)


class PharaohError(ValueError):
    """A Pharaoh line that cannot be read, or links outside the sentence."""


def parse_pharaoh(line: str) -> set[Link]:
    """`0-0 1-2 2-1` → {(0, 0), (1, 2), (2, 1)}; an empty line is no links."""
    links: set[Link] = set()
    for item in line.split():
        match = _LINK.fullmatch(item)
        if match is None:
            raise PharaohError(f"not a Pharaoh link: {item!r} (expected i-j, 0-based)")
        links.add((int(match.group(1)), int(match.group(2))))
    return links


def format_pharaoh(links: Iterable[Link]) -> str:
    """Links → `i-j` sorted by source word then target word, one space apart."""
    return " ".join(f"{i}-{j}" for i, j in sorted(set(links)))


def check_links(links: Iterable[Link], n_src: int, n_tgt: int, what: str = "links") -> None:
    """Raise PharaohError naming the first link outside an n_src x n_tgt sentence."""
    for i, j in sorted(links):
        if not (0 <= i < n_src and 0 <= j < n_tgt):
            raise PharaohError(
                f"{what}: link {i}-{j} lies outside the sentence's {n_src} source and "
                f"{n_tgt} target words"
            )


@dataclass
class AlignmentCounts:
    """|A|, |G| and |A∩G| summed over sentences; the rates are taken from the sums."""

    predicted: int = 0  # |A|: predicted links on gold words
    gold: int = 0  # |G|
    hits: int = 0  # |A ∩ G|
    sentences: int = 0

    def add(self, other: AlignmentCounts) -> None:
        self.predicted += other.predicted
        self.gold += other.gold
        self.hits += other.hits
        self.sentences += other.sentences

    @property
    def aer(self) -> float:
        den = self.predicted + self.gold
        return 1.0 - 2.0 * self.hits / den if den else 0.0

    @property
    def precision(self) -> float:
        return self.hits / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.hits / self.gold if self.gold else 0.0


def score_sentence(predicted: set[Link], gold: set[Link]) -> AlignmentCounts:
    """One sentence's counts: predicted links are kept only on target words with gold links."""
    gold_targets = {j for _, j in gold}
    scored = {(i, j) for i, j in predicted if j in gold_targets}
    return AlignmentCounts(
        predicted=len(scored), gold=len(gold), hits=len(scored & gold), sentences=1
    )


def score_corpus(predicted: Sequence[set[Link]], gold: Sequence[set[Link]]) -> AlignmentCounts:
    """Summed counts over sentences in the same order; a sentence with no gold scores nothing."""
    if len(predicted) != len(gold):
        raise PharaohError(
            f"{len(predicted)} predicted alignments for {len(gold)} gold ones: "
            "are they for the same sentences?"
        )
    total = AlignmentCounts()
    for p, g in zip(predicted, gold, strict=True):
        if g:
            total.add(score_sentence(p, g))
    return total
