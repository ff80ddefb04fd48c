"""Alignments from back-traced attention matrices: Pharaoh strings, subword→word merging, text heatmaps.

A matrix is (T, S): one row per target token, one column per source token, each row this
token's attention over the source (rows sum to 1). Pure numpy and string ops.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a new word
SHADES = " ░▒▓█"  # heatmap cells from weight 0 to weight 1
_WORD = re.compile(r"\S+")


def _check_matrix(matrix: np.ndarray, rows: int | None = None, cols: int | None = None) -> None:
    """Raise ValueError unless matrix is 2-D with the given number of rows and columns."""
    if matrix.ndim != 2:
        raise ValueError(f"alignment matrix must be 2-D (target, source), got shape {matrix.shape}")
    T, S = matrix.shape
    if rows is not None and rows != T:
        raise ValueError(f"matrix has {T} target rows but {rows} target labels")
    if cols is not None and cols != S:
        raise ValueError(f"matrix has {S} source columns but {cols} source labels")


def pharaoh(matrix: np.ndarray) -> str:
    """Hard alignment "s-t ..." (source index first), each target row t to its argmax column s.

    Sorted by target then source, as Marian and fast_align write it; "" for an empty matrix.
    """
    _check_matrix(matrix)
    T, S = matrix.shape
    if T == 0 or S == 0:
        return ""
    best = matrix.argmax(axis=1)  # (T,) source column per target row
    return " ".join(f"{s}-{t}" for t, s in enumerate(best.tolist()))


def word_index(pieces: list[str]) -> np.ndarray:
    """(P,) int64: the word of each piece; a "▁" piece, or the first piece, begins a word.

    A piece with no text of its own (a bare "▁", which a beam can emit before "▁soixante") is no
    word: it joins the word after it, or the word before it at the end. Otherwise the word rows
    would outnumber the words of the detokenized text (`['', 'soixante', ...]`).
    """
    index = np.zeros(len(pieces), dtype=np.int64)  # (P,)
    word, has_text = 0, False  # the current word, and whether a piece with text is in it yet
    for i, piece in enumerate(pieces):
        if piece.startswith(WORD_START) and has_text:
            word, has_text = word + 1, False
        index[i] = word
        has_text = has_text or bool(piece.replace(WORD_START, ""))
    if len(pieces) and not has_text and word > 0:
        index[index == word] = word - 1  # trailing pieces without text join the last word
    return index


def piece_surfaces(pieces: list[str]) -> list[str]:
    """The text each SentencePiece piece writes, read off the piece itself ("▁" → a space).

    The tokenizer's own surfaces (`surfaces()` of service/model/tokenizer.py) are exact, e.g. for
    <unk>; this is for callers that have only the pieces."""
    return [piece.replace(WORD_START, " ") for piece in pieces]


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each of text.split()'s words in text (a str pattern's \\s is str.isspace(),
    what split() cuts at: the same words, without a loop over characters in Python)."""
    return [m.span() for m in _WORD.finditer(text)]


def word_membership(surfaces: list[str]) -> tuple[list[str], np.ndarray]:
    """As `_word_membership` (below), cached: every hypothesis of an answer has the same source
    side, and a server sees the same texts again. The matrix is read-only."""
    words, member = _cached_membership(tuple(surfaces))
    return list(words), member


@functools.lru_cache(maxsize=4096)
def _cached_membership(surfaces: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray]:
    words, member = _word_membership(list(surfaces))
    member.flags.writeable = False
    return tuple(words), member


def _word_membership(surfaces: list[str]) -> tuple[list[str], np.ndarray]:
    """The words of the text the pieces write ("".join(surfaces).split()) and which pieces make each.

    Returns (words, member) with member (W, P) bool: piece p writes part of word w. The words are
    the text's by construction, so word labels always match the answer's text, whatever the pieces'
    marks say (a segmented answer's separator " et " before a segment whose first piece "5" has no
    "▁" makes two words, "et" and "5-sept"). A piece that writes no visible text (a lone "▁", a
    control piece) belongs to the word after it, or the last word at the end.
    """
    text = "".join(surfaces)
    spans = word_spans(text)  # (W,)
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    member = np.zeros((len(spans), len(surfaces)), dtype=bool)  # (W, P)
    begin = 0
    for p, surface in enumerate(surfaces):
        end = begin + len(surface)
        w = bisect.bisect_right(ends, begin)  # the first word ending after this piece begins
        hit = False
        while w < len(spans) and starts[w] < end:
            member[w, p], hit, w = True, True, w + 1
        if not hit and spans:
            member[min(bisect.bisect_left(starts, end), len(spans) - 1), p] = True
        begin = end
    return [text[s:e] for s, e in spans], member


def merge_subwords(
    matrix: np.ndarray,
    src_pieces: list[str],
    tgt_pieces: list[str],
    src_surfaces: list[str] | None = None,
    tgt_surfaces: list[str] | None = None,
) -> tuple[np.ndarray, list[str], list[str]]:
    """Word-level alignment from a SentencePiece-level matrix (T, S).

    The columns of one source word are summed (the attention mass on that word); the rows of one
    target word are averaged (so rows still sum to 1). The words are those of the text the pieces
    write: `*_surfaces`, each piece's text as the tokenizer decodes it (default: read off the
    pieces). Returns the (T', S') matrix, the source words and the target words.
    """
    _check_matrix(matrix, rows=len(tgt_pieces), cols=len(src_pieces))
    src_surfaces = piece_surfaces(src_pieces) if src_surfaces is None else src_surfaces
    tgt_surfaces = piece_surfaces(tgt_pieces) if tgt_surfaces is None else tgt_surfaces
    if len(src_surfaces) != len(src_pieces) or len(tgt_surfaces) != len(tgt_pieces):
        raise ValueError("one surface per piece is needed on each side")
    src_words, src_member = word_membership(src_surfaces)  # (S', S)
    tgt_words, tgt_member = word_membership(tgt_surfaces)  # (T', T)
    # a piece's attention mass is shared by the words it writes (one, for SentencePiece pieces)
    src_share = src_member / np.maximum(src_member.sum(axis=0, keepdims=True), 1)  # (S', S)
    summed = matrix @ src_share.T.astype(matrix.dtype)  # (T, S')
    counts = np.maximum(tgt_member.sum(axis=1, keepdims=True), 1)  # (T', 1)
    merged = (tgt_member / counts).astype(matrix.dtype) @ summed  # (T', S')
    return merged.astype(matrix.dtype, copy=False), src_words, tgt_words


def words_holding(
    pieces: list[str], marked: Sequence[int], surfaces: list[str] | None = None
) -> tuple[int, ...]:
    """The words of merge_subwords (by index) that hold any of the marked pieces."""
    if not marked:
        return ()
    surfaces = piece_surfaces(pieces) if surfaces is None else surfaces
    _, member = word_membership(surfaces)  # (W, P)
    return tuple(int(w) for w in np.flatnonzero(member[:, list(marked)].any(axis=1)))


def _one_hot(index: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """(P, n) with a 1 at (p, index[p])."""
    return (index[:, None] == np.arange(n)[None, :]).astype(dtype)  # (P, n)


def mean_pool(index: np.ndarray, n: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """(n, P): row w averages the pieces p with index[p] == w (a row of none stays 0)."""
    groups = _one_hot(index, n, np.dtype(dtype)).T  # (n, P)
    return groups / np.maximum(groups.sum(axis=1, keepdims=True), 1)


def merge_by_index(
    matrix: np.ndarray, src_index: np.ndarray, tgt_index: np.ndarray, S_words: int, T_words: int
) -> np.ndarray:
    """(T, S) → (T', S') given each piece's word, src_index (S,) and tgt_index (T,): a source word's
    columns summed, a target word's rows averaged (rows still sum to 1)."""
    _check_matrix(matrix, rows=len(tgt_index), cols=len(src_index))
    summed = matrix @ _one_hot(src_index, S_words, matrix.dtype)  # (T, S')
    merged = mean_pool(tgt_index, T_words, matrix.dtype) @ summed  # (T', S')
    return merged.astype(matrix.dtype, copy=False)


def _clip_label(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def render_text_heatmap(
    matrix: np.ndarray, src_labels: list[str], tgt_labels: list[str], max_label_len: int = 12
) -> str:
    """A terminal heatmap: one line per target label, source labels written top-down above columns.

    Each cell is two shade characters from " ░▒▓█" by weight (0 → blank, 1 → full block).
    The result has max(len(source label)) header lines (labels cut at max_label_len) plus one
    line per target row; "" for an empty matrix.
    """
    _check_matrix(matrix, rows=len(tgt_labels), cols=len(src_labels))
    T, S = matrix.shape
    if T == 0 or S == 0:
        return ""
    src = [_clip_label(label, max_label_len) for label in src_labels]
    tgt = [_clip_label(label, max_label_len) for label in tgt_labels]
    margin = max(len(label) for label in tgt)
    levels = np.clip(np.rint(matrix * (len(SHADES) - 1)), 0, len(SHADES) - 1).astype(int)  # (T, S)
    height = max(1, max(len(label) for label in src))
    header = [
        " " * (margin + 1) + "".join(f"{label[i] if i < len(label) else ' '} " for label in src)
        for i in range(height)
    ]
    body = [
        f"{label:>{margin}} " + "".join(SHADES[level] * 2 for level in row)
        for label, row in zip(tgt, levels.tolist(), strict=True)
    ]
    return "\n".join(line.rstrip() for line in header + body)


@dataclass(frozen=True)
class Alignment:
    """One hypothesis's alignment, as the engine returns it and the client receives it."""

    matrix: np.ndarray  # (T_y, T_x): row t is target token t's attention over the source tokens
    source_tokens: list[str]
    target_tokens: list[str]
    pharaoh: str  # hard alignment "src-tgt ..." (argmax per target token)
    # rows the target vocabulary cannot spell (read as its unknown token), by index into
    # target_tokens: a memory's target served as written (service/decode/requests/recall.py)
    unknown_target_tokens: tuple[int, ...] = ()


def offset_indices(indices: Sequence[Sequence[int]], sizes: Sequence[int]) -> tuple[int, ...]:
    """Each part's indices (into its own tokens) as indices into the parts' tokens one after
    another; sizes: each part's token count."""
    out: list[int] = []
    offset = 0
    for found, size in zip(indices, sizes, strict=True):
        out.extend(i + offset for i in found)
        offset += size
    return tuple(out)


def offset_pharaoh(parts: Sequence[tuple[str, int, int]]) -> str:
    """Pharaoh strings of parts (each with its source and target token counts) as one over the
    parts' tokens one after another."""
    links, sources, targets = [], 0, 0
    for text, n_source, n_target in parts:
        for link in text.split():
            s, t = link.split("-")
            links.append(f"{int(s) + sources}-{int(t) + targets}")
        sources, targets = sources + n_source, targets + n_target
    return " ".join(links)


def block_join(parts: Sequence[Alignment]) -> Alignment:
    """Parts' alignments (a document's sentences') as one: each matrix on the diagonal (links only
    within a part), the tokens one after another, the hard links recomputed."""
    rows = sum(a.matrix.shape[0] for a in parts)
    cols = sum(a.matrix.shape[1] for a in parts)
    dtype = parts[0].matrix.dtype if parts else np.float32
    matrix = np.zeros((rows, cols), dtype=dtype)  # (T, S)
    r = c = 0
    for a in parts:
        t, s = a.matrix.shape
        matrix[r : r + t, c : c + s] = a.matrix
        r, c = r + t, c + s
    return Alignment(
        matrix=matrix,
        source_tokens=[t for a in parts for t in a.source_tokens],
        target_tokens=[t for a in parts for t in a.target_tokens],
        pharaoh=pharaoh(matrix),
        unknown_target_tokens=offset_indices(
            [a.unknown_target_tokens for a in parts], [len(a.target_tokens) for a in parts]
        ),
    )
