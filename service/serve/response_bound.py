"""How large a response can grow, known before decoding: a request whose answer could exceed the
server's message limit is refused before any work (grpc could not send it, and decoding it would
hold that much, several times over as Python objects, for nothing). Translate's bound reads each
input's shape (`input_shape`, a segmented input's segments capped one by one); Align's each pair's
tokens and words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions

if TYPE_CHECKING:  # the client imports service/serve/: keep onnxruntime out of its imports
    from service.decode.text.preparation import Prepared


class SegmentedShape(NamedTuple):
    """A segmented input's size for the bound: each segment is capped by max_length on its own."""

    cols: int  # source tokens reported: the segments' and the separators' pieces
    segment_lengths: tuple[int, ...]  # source tokens of each segment
    separator_rows: int  # target pieces of the separators, in all


def input_shape(sentence: Prepared) -> int | SegmentedShape:
    """What the response bound needs of one prepared input: its source length, or its segments'."""
    if not sentence.segments:
        return len(sentence.ids)
    return SegmentedShape(
        len(sentence.pieces),
        tuple(len(s.ids) for s in sentence.segments),
        sum(len(s.target_pieces) for s in sentence.separators),
    )


def text_shape(sentences: Sequence[Prepared]) -> int | SegmentedShape:
    """A text's shape for the bound: its one input's, or a text cut into sentences (each capped
    by max_length on its own, as segments are, its matrix over every sentence's tokens)."""
    if len(sentences) == 1:
        return input_shape(sentences[0])
    shapes = [input_shape(s) for s in sentences]
    return SegmentedShape(
        sum(s if isinstance(s, int) else s.cols for s in shapes) + len(shapes) - 1,
        tuple(n for s in shapes for n in ((s,) if isinstance(s, int) else s.segment_lengths)),
        sum(0 if isinstance(s, int) else s.separator_rows for s in shapes),
    )


def worst_case_response_bytes(
    source_lengths: Sequence[int | SegmentedShape],
    options: SearchOptions,
    alignment: str,
    piece_bytes: int,
) -> int:
    """An upper bound on the TranslateResponse's size for texts of these source lengths (tokens),
    known before decoding: every hypothesis of the n-best list at the maximum target length, each
    token the longest piece (`piece_bytes` UTF-8 bytes), the alignment matrix full (float32).

    Word alignment has no more rows, columns or characters than subword alignment, so one bound
    serves both. The field overheads (tags, lengths, varints) are counted generously."""
    token = piece_bytes + 3  # a repeated string: tag, length, bytes
    total = 64  # request_id (bounded separately), model_version, their tags
    for src_len in source_lengths:
        if isinstance(src_len, SegmentedShape):  # every segment at its own maximum length
            cols = src_len.cols + 1
            rows = src_len.separator_rows + sum(
                options.max_len(n) + 1 for n in src_len.segment_lengths
            )
        else:
            cols = src_len + 1  # the source's pieces and its end-of-sentence
            rows = options.max_len(src_len) + 1  # target tokens, end-of-sentence included
        hypothesis = rows * piece_bytes + 6 + rows * token + 5 + 5 + 2 + 6  # text, tokens, ...
        if alignment != "none":
            weights = 4 * rows * cols + 6  # packed float32
            strings = (rows + cols) * token
            pharaoh = rows * 14 + 6  # "src-tgt " per target token
            hypothesis += weights + strings + pharaoh + 12 + 6  # rows, cols, the message
        total += cols * token + 6 + options.n_best * hypothesis
    return total


def check_response_bound(
    source_lengths: Sequence[int | SegmentedShape],
    options: SearchOptions,
    alignment: str,
    piece_bytes: int,
    limit: int,
) -> None:
    """Refuse, before any decoding, a request whose response could exceed the message limit:
    grpc could not send it, and decoding it would hold that much (several times over as Python
    objects) for nothing."""
    bound = worst_case_response_bytes(source_lengths, options, alignment, piece_bytes)
    if bound > limit:
        raise InvalidInput(
            f"the response could reach {bound} bytes ({len(source_lengths)} texts x n_best "
            f"{options.n_best} x up to max_length {options.max_length} target tokens"
            f"{', with alignment' if alignment != 'none' else ''}), over the server's message "
            f"limit of {limit}: send fewer or shorter texts, or ask for a smaller n_best, a smaller "
            "max_length (or max_length_a/max_length_b)"
            + (", or alignment NONE" if alignment != "none" else "")
        )


def align_response_bytes(pairs: Sequence[tuple[int, int, int, int, int]], piece_bytes: int) -> int:
    """An upper bound on an AlignResponse's size, known before decoding: for each pair (source
    tokens, target tokens, source words, target words, UTF-8 bytes of its text), both matrices
    full (float32), every token the longest piece, links and scores generously counted."""
    token = piece_bytes + 3
    total = 64
    for S, T, S_w, T_w, text_bytes in pairs:
        matrices = 4 * (T * S + T_w * S_w) + 2 * (12 + 6)
        strings = 2 * (S + T) * token + text_bytes + 3 * (S_w + T_w) * 2
        links = 12 * S_w * T_w + 14 * T  # "s-t " per link (at most one per word cell)
        scores = 5 * (T + 8) + 6 * (S + T + S_w + T_w)
        total += matrices + strings + links + scores + 16
    return total
