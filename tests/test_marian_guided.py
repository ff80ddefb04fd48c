"""export/toolkits/marian_guided.py: word links remapped to the SentencePiece pieces Marian sees."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentencepiece")

from export.toolkits.marian_guided import piece_links, remap, train_spm, word_of_pieces


def test_each_piece_belongs_to_the_word_it_continues() -> None:
    pieces = ["▁Th", "is", "▁is", "▁", "Β", "ί", "▁the"]
    assert word_of_pieces(pieces) == [0, 0, 1, 2, 2, 2, 3]


def test_a_word_link_links_every_piece_of_both_words() -> None:
    src = ["▁a", "b", "▁c"]  # words 0 (two pieces), 1
    tgt = ["▁x", "▁y", "z"]  # words 0, 1 (two pieces)
    assert piece_links([(0, 1), (1, 0)], src, tgt) == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0)]
    assert piece_links([], src, tgt) == []


def test_remap_writes_one_line_of_piece_links_per_pair(tmp_path: Path) -> None:
    """Links over the pieces the trained SentencePiece models cut each side into: every link's
    indices within the pair's pieces, every gold-linked word pair covered."""
    import sentencepiece as spm

    words_src = ["alpha", "beta", "gamma", "delta", "epsilonix"]
    words_tgt = ["one", "two", "three", "four", "fivefold"]
    src_lines = [" ".join(words_src[i % 5] for i in range(k, k + 4)) for k in range(60)]
    tgt_lines = [" ".join(words_tgt[i % 5] for i in range(k, k + 4)) for k in range(60)]
    (tmp_path / "train.src").write_text("\n".join(src_lines) + "\n")
    (tmp_path / "train.tgt").write_text("\n".join(tgt_lines) + "\n")
    (tmp_path / "train.pharaoh").write_text("0-0 1-1 2-2 3-3\n" * 60)
    models = (
        train_spm(tmp_path / "train.src", tmp_path / "source", 20),
        train_spm(tmp_path / "train.tgt", tmp_path / "target", 20),
    )
    out = remap(tmp_path / "train", "src", "tgt", models, tmp_path / "train.align")
    cutters = [spm.SentencePieceProcessor(model_file=str(m)) for m in models]
    for line, source, target in zip(
        out.read_text().splitlines(), src_lines, tgt_lines, strict=True
    ):
        src, tgt = (
            c.encode(t, out_type=str) for c, t in zip(cutters, (source, target), strict=True)
        )
        links = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert all(0 <= i < len(src) and 0 <= j < len(tgt) for i, j in links)
        src_words, tgt_words = word_of_pieces(src), word_of_pieces(tgt)
        assert {(src_words[i], tgt_words[j]) for i, j in links} == {(k, k) for k in range(4)}
