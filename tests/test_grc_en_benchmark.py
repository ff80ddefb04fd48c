"""benchmarks/alignment/grc_en.py and its baselines, on tiny inputs (the tiny model, a few lines of data)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from benchmarks.alignment import grc_en
from benchmarks.alignment.grc_en_baselines import TranslationMemory, eflomal_directions, fold
from export.data import bible
from export.metrics.aer import parse_pharaoh
from tests.conftest import TinyModel


def test_fold_lowercases_and_strips_greek_accents() -> None:
    assert fold("Ἐν ἀρχῇ ἦν ὁ λόγος") == "εν αρχη ην ο λογος"
    assert fold("Word") == "word"


def test_strip_punctuation_keeps_inner_marks() -> None:
    assert bible.strip_punctuation("“Truly, I tell you: God’s mother-in-law!” ( ) ...") == (
        "Truly I tell you God’s mother-in-law"
    )
    assert bible.strip_punctuation("") == ""


def test_translation_memory_returns_the_nearest_verse() -> None:
    memory = TranslationMemory(
        ["ὁ λόγος ἦν", "καὶ εἶπεν αὐτοῖς", "ἐν ἀρχῇ"],
        ["the word was", "and he said", "in beginning"],
    )
    assert memory.translate(["ΚΑΙ ειπεν"]) == ["and he said"]  # folded before comparing
    assert memory.translate(["λόγος ἐν ἀρχῇ"]) == ["in beginning"]  # two rarer words beat one
    assert memory.translate(["οὐδέν"]) == ["the word was"]  # no shared word: the first


def test_eflomal_links_stay_inside_the_pairs() -> None:
    sources = ["a b c", "b c", "a c d", "d a", "c b a"] * 4
    targets = ["x y z", "y z", "x z w", "w x", "z y x"] * 4
    forward, reverse = eflomal_directions(sources, targets)
    assert len(forward) == len(reverse) == len(sources)
    for src, tgt, f, r in zip(sources, targets, forward, reverse, strict=True):
        n_src, n_tgt = len(src.split()), len(tgt.split())
        assert all(i < n_src and j < n_tgt for i, j in f | r)
        assert len({j for _, j in f}) == len(f)  # forward: one source word per target word
        assert len({i for i, _ in r}) == len(r)  # reverse: one target word per source word


def test_extraction_modes_on_a_matrix() -> None:
    matrix = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])  # (T=3, S=3)
    assert grc_en.argmax_links(matrix) == {(0, 0), (0, 1), (2, 2)}
    assert grc_en.source_argmax_links(matrix) == {(0, 0), (1, 1), (2, 2)}
    # intersection 0-0, 2-2; grow from 0-0: its neighbour 0-1 (target 1 unaligned), then its
    # diagonal 1-1 (source 1 unaligned): every link of the union
    assert grc_en.gdfa_links(matrix) == {(0, 0), (0, 1), (1, 1), (2, 2)}


def _write_data(directory: Path, sources: list[str]) -> None:
    """Tiny splits in export/data/bible.py's layout: the target is the source reversed."""
    for name, chunk in (("train", sources[:20]), ("dev", sources[20:25]), ("test", sources[25:31])):
        targets = [" ".join(reversed(s.split(" "))) for s in chunk]
        gold = [
            " ".join(f"{i}-{len(s.split(' ')) - 1 - i}" for i in range(len(s.split(" "))))
            for s in chunk
        ]
        for ext, lines in (("grc", chunk), ("en", targets), ("pharaoh", gold)):
            (directory / f"{name}.{ext}").write_text("".join(f"{x}\n" for x in lines), "utf-8")


def test_benchmark_prints_every_row(
    tiny: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_data(tmp_path, tiny.sources)
    out = tmp_path / "report.json"
    argv = ["--bundle", str(tiny.bundle), "--checkpoint", str(tiny.checkpoint)]
    argv += ["--data", str(tmp_path), "--limit", "4", "--beam", "2", "--json", str(out)]
    assert grc_en.main(argv) == 0
    table = capsys.readouterr().out
    for system in (
        "forced attention (PyTorch), argmax",
        "forced attention (PyTorch), grow-diag-final-and",
        "eflomal 2.0.0, grow-diag-final-and",
        "Translate, beam 2",
        "translation memory (tf-idf)",
    ):
        assert f"| {system} |" in table
    assert "John: 4 verses" in table
    assert out.is_file() and '"aer"' in out.read_text()


def test_forced_alignment_links_are_inside_each_pair(tiny: TinyModel, tmp_path: Path) -> None:
    _write_data(tmp_path, tiny.sources)
    test = grc_en.read_split(tmp_path, "test")
    args = argparse.Namespace(bundle=tiny.bundle, threads=1)
    aligner = grc_en.ForcedAligner(tiny.model, grc_en.load_engine(args))
    for mode in grc_en.EXTRACTORS:
        lines = grc_en.align_pairs(aligner, test.pairs, mode)
        assert len(lines) == len(test)
        for (src, tgt), line in zip(test.pairs, lines, strict=True):
            links = parse_pharaoh(line)
            n_src, n_tgt = len(src.split(" ")), len(tgt.split(" "))
            assert links and all(i < n_src and j < n_tgt for i, j in links)
            if mode == "argmax":
                assert sorted(j for _, j in links) == list(range(n_tgt))  # one link per word
