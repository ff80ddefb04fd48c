"""Tests for export/data/corpus.py: TSV I/O and the generated English→French corpus."""

from __future__ import annotations

import random
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("num2words")
pytest.importorskip("babel")

from export.data.corpus import (
    MAX_LONG_SOURCE_CHARS,
    MAX_SOURCE_CHARS,
    Pair,
    cardinal_pair,
    generate_splits,
    main,
    normalize_spaces,
    pick_connector,
    read_tsv,
    write_tsv,
)

SIZES: dict[str, Any] = {"n_train": 300, "n_dev": 50, "n_test": 50, "n_test_long": 20}
MONTHS_EN = "January|February|March|April|May|June|July|August|September|October|November|December"
MONTHS_FR = "janvier|février|mars|avril|mai|juin|juillet|août|septembre|octobre|novembre|décembre"
EN_MONTH_DAY = re.compile(rf"\b(?:{MONTHS_EN}) \d{{1,2}}, \d{{4}}")
FR_DAY_MONTH = re.compile(rf"\b\d{{1,2}}(?:er)? (?:{MONTHS_FR}) \d{{4}}")


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Pair]]:
    """Small splits for seed 1."""
    return generate_splits(seed=1, **SIZES)


def _all_pairs(splits: dict[str, list[Pair]]) -> list[Pair]:
    """Every pair of every split."""
    return [pair for pairs in splits.values() for pair in pairs]


def test_same_seed_gives_identical_splits(splits: dict[str, list[Pair]]) -> None:
    assert generate_splits(seed=1, **SIZES) == splits


def test_other_seed_gives_different_splits(splits: dict[str, list[Pair]]) -> None:
    assert generate_splits(seed=2, **SIZES)["train"] != splits["train"]


def test_split_sizes(splits: dict[str, list[Pair]]) -> None:
    assert len(splits["train"]) == SIZES["n_train"]
    assert len(splits["dev"]) == SIZES["n_dev"]
    assert len(splits["test"]) == SIZES["n_test"] + SIZES["n_test_long"]


def test_splits_are_disjoint_by_source(splits: dict[str, list[Pair]]) -> None:
    sources = [source for source, _ in _all_pairs(splits)]
    assert len(sources) == len(set(sources))


def test_length_caps(splits: dict[str, list[Pair]]) -> None:
    regular = splits["train"] + splits["dev"] + splits["test"][: SIZES["n_test"]]
    assert all(1 <= len(source) <= MAX_SOURCE_CHARS for source, _ in regular)
    long = splits["test"][SIZES["n_test"] :]
    assert all(len(source) <= MAX_LONG_SOURCE_CHARS for source, _ in long)


def test_long_test_sources_are_longer_than_every_train_source(
    splits: dict[str, list[Pair]],
) -> None:
    train_max = max(len(source) for source, _ in splits["train"])
    long = splits["test"][SIZES["n_test"] :]
    assert len(long) == SIZES["n_test_long"]
    assert min(len(source) for source, _ in long) > train_max


def test_no_empty_side_and_no_unicode_spaces(splits: dict[str, list[Pair]]) -> None:
    for pair in _all_pairs(splits):
        for side in pair:
            assert side and side == side.strip()
            assert "  " not in side and "\t" not in side and "\n" not in side
            assert not any(unicodedata.category(c) == "Zs" and c != " " for c in side), side


def test_normalize_spaces_maps_babel_spaces() -> None:
    assert normalize_spaces("\u00a01\u202f234,50\u00a0\u2009 €  ") == "1 234,50 €"


def test_cardinal_reorders() -> None:
    assert cardinal_pair(97) == ("ninety-seven", "quatre-vingt-dix-sept")


@pytest.mark.parametrize(
    "left", ["one thousand", "two hundred", "one hundred thousand", "three million"]
)
def test_no_ambiguous_connector_after_a_scale_word(left: str) -> None:
    rng = random.Random(0)
    connectors = {pick_connector(rng, left, "five") for _ in range(50)}
    assert connectors == {(", then ", ", puis ")}


def test_all_connectors_used_elsewhere() -> None:
    rng = random.Random(0)
    connectors = {pick_connector(rng, "one thousand", "March 5, 2021") for _ in range(50)}
    assert len(connectors) == 3


def test_dates_reorder_month_and_day(splits: dict[str, list[Pair]]) -> None:
    reordered = [
        (en, fr)
        for en, fr in _all_pairs(splits)
        if EN_MONTH_DAY.search(en) and FR_DAY_MONTH.search(fr)
    ]
    assert reordered


def test_tsv_round_trip(tmp_path: Path, splits: dict[str, list[Pair]]) -> None:
    path = tmp_path / "train.tsv"
    write_tsv(path, splits["train"])
    assert read_tsv(path) == splits["train"]


def test_read_tsv_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "blank.tsv"
    path.write_text("one\tun\n\n  \ntwo\tdeux\n", encoding="utf-8")
    assert read_tsv(path) == [("one", "un"), ("two", "deux")]


@pytest.mark.parametrize("bad_line", ["no tab here", "a\tb\tc", "\tun", "one\t"])
def test_read_tsv_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text(f"one\tun\n\n{bad_line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.tsv:3\b"):
        read_tsv(path)


def test_write_tsv_rejects_tab_inside_a_side(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_tsv(tmp_path / "x.tsv", [("a\tb", "c")])


def test_cli_writes_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "corpus"
    argv = ["--out", str(out), "--seed", "3", "--train", "40", "--dev", "5", "--test", "5"]
    assert main([*argv, "--test-long", "2"]) == 0
    assert len(read_tsv(out / "train.tsv")) == 40
    assert len(read_tsv(out / "test.tsv")) == 7
    assert "train: 40 pairs" in capsys.readouterr().out
