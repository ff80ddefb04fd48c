"""Hard word links from a soft word-level alignment matrix, for forced alignment (`Align`).

A matrix is (T, S): one row per target word, one column per source word, each row the target word's
attention over the source words (rows sum to 1). A link is (s, t), source index first, as Pharaoh
writes it. One matrix gives both directions: a row's argmax says which source word a target word
looks at most, a column's argmax which target word looks at a source word most; the symmetrised
modes combine the two as statistical aligners combine two directional models (Koehn et al., 2003).
What each mode gave on the Greek model's dev split is in docs/align.md.

Mode "head" is not read from the attention: the bundle's link head (service/decode/runtime/link_head.py),
a supervised aligner that sees the whole pair, gives the links.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Link = tuple[int, int]  # (source word, target word)

LINK_MODES: tuple[str, ...] = (
    "argmax",
    "source_argmax",
    "intersect",
    "union",
    "grow",
    "threshold",
    "head",
)
HEAD = "head"  # the link head's own links (service/decode/runtime/link_head.py), not an attention reading
DEFAULT_THRESHOLD = 0.3


def argmax_links(matrix: np.ndarray) -> set[Link]:
    """Each target word to its most attended source word: one link per row."""
    T, S = matrix.shape
    if T == 0 or S == 0:
        return set()
    return {(int(s), t) for t, s in enumerate(matrix.argmax(axis=1).tolist())}


def source_argmax_links(matrix: np.ndarray) -> set[Link]:
    """Each source word to the target word that attends to it most: one link per column."""
    T, S = matrix.shape
    if T == 0 or S == 0:
        return set()
    return {(s, int(t)) for s, t in enumerate(matrix.argmax(axis=0).tolist())}


def intersect_links(matrix: np.ndarray) -> set[Link]:
    return argmax_links(matrix) & source_argmax_links(matrix)


def union_links(matrix: np.ndarray) -> set[Link]:
    return argmax_links(matrix) | source_argmax_links(matrix)


NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def grow_links(matrix: np.ndarray) -> set[Link]:
    """grow-diag-final-and (Koehn et al., 2003) over the two argmax directions: start from their
    intersection, add union links next to (or diagonal to) a link while one of their words is still
    unaligned, then union links whose words are both unaligned."""
    union = union_links(matrix)
    links = intersect_links(matrix)
    grown = True
    while grown:
        grown = False
        for s, t in sorted(links):
            for ds, dt in NEIGHBOURS:
                cand = (s + ds, t + dt)
                if cand in union and cand not in links and _has_unaligned(links, cand):
                    links.add(cand)
                    grown = True
    for cand in sorted(union - links):
        src_free = all(s != cand[0] for s, _ in links)
        tgt_free = all(t != cand[1] for _, t in links)
        if src_free and tgt_free:
            links.add(cand)
    return links


def _has_unaligned(links: set[Link], cand: Link) -> bool:
    s, t = cand
    return all(ls != s for ls, _ in links) or all(lt != t for _, lt in links)


def threshold_links(matrix: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> set[Link]:
    """Every cell at or above `threshold`; a target word with none keeps its argmax link."""
    T, S = matrix.shape
    if T == 0 or S == 0:
        return set()
    rows, cols = np.nonzero(matrix >= threshold)  # (L,), (L,)
    links = {(int(s), int(t)) for t, s in zip(rows.tolist(), cols.tolist(), strict=True)}
    covered = {t for _, t in links}
    links |= {(s, t) for s, t in argmax_links(matrix) if t not in covered}
    return links


EXTRACTORS: dict[str, Callable[[np.ndarray], set[Link]]] = {
    "argmax": argmax_links,
    "source_argmax": source_argmax_links,
    "intersect": intersect_links,
    "union": union_links,
    "grow": grow_links,
}


def extract_links(matrix: np.ndarray, mode: str, threshold: float = DEFAULT_THRESHOLD) -> set[Link]:
    """The links of `mode` (one of LINK_MODES) from a (T, S) word matrix."""
    if matrix.ndim != 2:
        raise ValueError(f"alignment matrix must be 2-D (target, source), got {matrix.shape}")
    if mode == "threshold":
        return threshold_links(matrix, threshold)
    if mode == HEAD:
        raise ValueError(
            "links 'head' come from the link head (service/decode/runtime/link_head.py), not a matrix"
        )
    if mode not in EXTRACTORS:
        raise ValueError(f"link mode must be one of {LINK_MODES}, got {mode!r}")
    return EXTRACTORS[mode](matrix)


def to_pharaoh(links: set[Link]) -> str:
    """ "s-t ..." sorted by target then source, as Marian and fast_align write it."""
    return " ".join(f"{s}-{t}" for s, t in sorted(links, key=lambda link: (link[1], link[0])))


def parse_pharaoh(text: str) -> set[Link]:
    """ "s-t ..." → {(s, t)}; ValueError naming the first link that is not two integers."""
    links: set[Link] = set()
    for item in text.split():
        s, sep, t = item.partition("-")
        if not sep or not s.isdigit() or not t.isdigit():
            raise ValueError(f"not a Pharaoh link (source-target): {item!r}")
        links.add((int(s), int(t)))
    return links
