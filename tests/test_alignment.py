"""Tests for service/decode/shared/alignment.py: Pharaoh strings, subword merging, text heatmaps."""

from __future__ import annotations

import numpy as np
import pytest

from service.decode.shared.alignment import merge_subwords, pharaoh, render_text_heatmap, word_index

# 3 target rows over 4 source columns, rows sum to 1
MATRIX = np.array(
    [
        [0.1, 0.7, 0.1, 0.1],
        [0.6, 0.2, 0.1, 0.1],
        [0.0, 0.1, 0.3, 0.6],
    ],
    np.float32,
)


def test_pharaoh_writes_source_first_in_target_order() -> None:
    assert pharaoh(MATRIX) == "1-0 0-1 3-2"


def test_pharaoh_of_empty_matrix_is_empty() -> None:
    assert pharaoh(np.zeros((0, 5), np.float32)) == ""
    assert pharaoh(np.zeros((3, 0), np.float32)) == ""


def test_pharaoh_rejects_non_matrix() -> None:
    with pytest.raises(ValueError, match="2-D"):
        pharaoh(np.zeros(3))


def test_word_index_starts_words_at_marker_and_first_piece() -> None:
    assert word_index(["un", "▁chat", "s", "▁noir"]).tolist() == [0, 1, 1, 2]
    assert word_index([]).tolist() == []


def test_bare_marker_piece_is_no_word_of_its_own() -> None:
    # A beam can emit a lone "▁" before "▁soixante": it joins the next word, or the last at the end.
    assert word_index(["▁", "▁soixante", "▁et", "▁on", "ze"]).tolist() == [0, 0, 1, 2, 2]
    assert word_index(["▁cinq", "▁", "▁"]).tolist() == [0, 0, 0]
    assert word_index(["▁"]).tolist() == [0]
    merged, _, tgt_words = merge_subwords(
        np.full((4, 1), 1.0, dtype=np.float32), ["▁x"], ["▁", "▁soixante", "▁et", "▁"]
    )
    assert tgt_words == ["soixante", "et"] and merged.shape == (2, 1)


def test_merge_sums_source_columns_and_averages_target_rows() -> None:
    src = ["▁the", "▁cat", "s", "▁sat"]  # words: the, cats, sat
    tgt = ["▁les", "▁chat", "s"]  # words: les, chats
    merged, src_words, tgt_words = merge_subwords(MATRIX, src, tgt)
    assert src_words == ["the", "cats", "sat"]
    assert tgt_words == ["les", "chats"]
    expected = np.array(
        [
            [0.1, 0.8, 0.1],  # row 0, columns 1+2 summed
            [(0.6 + 0.0) / 2, (0.3 + 0.4) / 2, (0.1 + 0.6) / 2],  # rows 1 and 2 averaged
        ]
    )
    assert merged.shape == (2, 3) and merged.dtype == np.float32
    np.testing.assert_allclose(merged, expected, atol=1e-6)
    np.testing.assert_allclose(merged.sum(axis=1), 1.0, atol=1e-6)


def test_merge_without_markers_is_one_word_per_side() -> None:
    merged, src_words, tgt_words = merge_subwords(MATRIX, ["a", "b", "c", "d"], ["x", "y", "z"])
    assert src_words == ["abcd"] and tgt_words == ["xyz"]
    np.testing.assert_allclose(merged, [[1.0]], atol=1e-6)


def test_merge_rejects_label_count_mismatch() -> None:
    with pytest.raises(ValueError, match="4 source columns but 3 source labels"):
        merge_subwords(MATRIX, ["▁a", "▁b", "▁c"], ["▁x", "▁y", "▁z"])


def test_heatmap_has_header_lines_plus_one_line_per_target() -> None:
    text = render_text_heatmap(MATRIX, ["the", "cat", "sat", "down"], ["le", "chat", "assis"])
    lines = text.split("\n")
    assert len(lines) == 4 + 3  # the longest source label ("down") + one per target row
    assert lines[0] == "      t c s d"  # source labels top-down over 2-character columns
    assert lines[4:] == ["   le   ▓▓", " chat ▒▒░░", "assis     ░░▒▒"]  # weight → shade


def test_heatmap_cuts_long_labels() -> None:
    text = render_text_heatmap(
        MATRIX, ["a", "b", "c", "abcdefghij"], ["x", "y", "z"], max_label_len=4
    )
    assert len(text.split("\n")) == 4 + 3
    assert "…" in text


def test_heatmap_of_empty_matrix_is_empty() -> None:
    assert render_text_heatmap(np.zeros((0, 2), np.float32), ["a", "b"], []) == ""
