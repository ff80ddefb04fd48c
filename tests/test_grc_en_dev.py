"""benchmarks/quality/grc_en_dev.py: dev scores per decoding setting, for choosing a model without John."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.quality import grc_en_dev
from tests.conftest import TinyModel


def write_dev(folder: Path, tiny: TinyModel) -> Path:
    sources = tiny.sources[:12]
    (folder / "dev.grc").write_text("".join(s + "\n" for s in sources))
    (folder / "dev.en").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in sources))
    (folder / "dev.pharaoh").write_text("\n" * len(sources))
    return folder


def test_one_row_per_setting_and_the_bundles_defaults_without_any(
    tiny: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_dev(tmp_path, tiny)
    argv = ["--bundle", str(tiny.bundle), "--data", str(data), "--beam", "2"]
    assert grc_en_dev.main([*argv, "--decoding", "1.0,0.0", "--decoding", "0.6,0.2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["decoding"] for r in rows] == [
        {"length_penalty": 1.0, "coverage_penalty": 0.0},
        {"length_penalty": 0.6, "coverage_penalty": 0.2},
    ]
    assert all(r["verses"] == 12 and 0 <= r["chrf"] <= 100 and r["length_ratio"] > 0 for r in rows)
    assert grc_en_dev.main(argv) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["decoding"] == {}  # the tiny bundle has no defaults of its own


def test_a_malformed_setting_says_what_it_takes() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="LENGTH_PENALTY,COVERAGE_PENALTY"):
        grc_en_dev.parse_setting("1.0")
