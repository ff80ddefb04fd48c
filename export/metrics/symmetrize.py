"""Symmetrization of two directional word alignments (Koehn et al. 2003), as Moses and atools do.

Both inputs are source-target links (i, j) of one sentence: `forward` from the aligner that gives
each target word at most one source word, `reverse` from the other direction.
"""

from __future__ import annotations

from collections.abc import Iterable

Link = tuple[int, int]  # (source word, target word)

NEIGHBOURS: tuple[Link, ...] = (
    (-1, 0),
    (0, -1),
    (1, 0),
    (0, 1),
    (-1, -1),
    (-1, 1),
    (1, -1),
    (1, 1),
)


class _Alignment:
    """A growing set of links with the aligned words of each side."""

    def __init__(self, links: Iterable[Link]) -> None:
        self.links: set[Link] = set()
        self.src: set[int] = set()
        self.tgt: set[int] = set()
        for link in links:
            self.add(link)

    def covers(self, link: Link) -> bool:
        """Both words of the link are aligned already."""
        return link[0] in self.src and link[1] in self.tgt

    def add(self, link: Link) -> None:
        self.links.add(link)
        self.src.add(link[0])
        self.tgt.add(link[1])


def _grow_diag(alignment: _Alignment, union: set[Link]) -> None:
    """Add union links next to (8 ways) a link, while one of their words is still unaligned."""
    added = True
    while added:
        added = False
        for i, j in sorted(alignment.links):
            for di, dj in NEIGHBOURS:
                new = (i + di, j + dj)
                if new in union and new not in alignment.links and not alignment.covers(new):
                    alignment.add(new)
                    added = True


def _final_and(alignment: _Alignment, directional: set[Link]) -> None:
    """Add the directional links whose two words are both still unaligned."""
    for i, j in sorted(directional):
        if i not in alignment.src and j not in alignment.tgt:
            alignment.add((i, j))


def grow_diag_final_and(forward: Iterable[Link], reverse: Iterable[Link]) -> set[Link]:
    """The intersection, grown along diagonals within the union, then final-and both ways."""
    fwd, rev = set(forward), set(reverse)
    alignment = _Alignment(fwd & rev)
    _grow_diag(alignment, fwd | rev)
    _final_and(alignment, fwd)
    _final_and(alignment, rev)
    return alignment.links


def intersect(forward: Iterable[Link], reverse: Iterable[Link]) -> set[Link]:
    return set(forward) & set(reverse)


def attach_unaligned_targets(
    links: Iterable[Link], n_target: int, first: str = "right"
) -> set[Link]:
    """Every target word left unaligned joins the source words of the nearest aligned target word,
    looking `first` ("right" or "left") at equal distance. People link a function word to the
    content word it belongs to ("he will come" all to one verb, "of God" to one noun), where a
    statistical aligner leaves it to NULL; in English the content word follows, hence "right"."""
    if first not in ("right", "left"):
        raise ValueError(f"first must be 'right' or 'left', got {first!r}")
    out = set(links)
    sources_of: dict[int, set[int]] = {}
    for i, j in out:
        sources_of.setdefault(j, set()).add(i)
    step = 1 if first == "right" else -1
    for j in range(n_target):
        if j in sources_of:
            continue
        for distance in range(1, n_target):
            nearest = next(
                (k for k in (j + step * distance, j - step * distance) if k in sources_of), None
            )
            if nearest is not None:
                out |= {(i, j) for i in sources_of[nearest]}
                break
    return out
