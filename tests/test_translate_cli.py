"""The translate CLI: lines on stdin, translations on stdout, alignments on request."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from service import translate
from tests.conftest import TinyModel


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: str, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = translate.main(
        [*args, "--providers", "CPUExecutionProvider", "--threads", "1", "--max-len-b", "4"]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plain_align_and_json(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = str(tiny.bundle)
    code, out, _ = run(
        monkeypatch, capsys, "one\nninety-seven\n", "--bundle", bundle, "--beam", "2"
    )
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(monkeypatch, capsys, "ninety-seven\n", "--bundle", bundle, "--align")
    text, pharaoh = out.rstrip("\n").split("\t")
    assert text.strip()
    assert all(len(pair.split("-")) == 2 for pair in pharaoh.split())
    code, out, _ = run(
        monkeypatch,
        capsys,
        "ninety-seven\n",
        "--bundle",
        bundle,
        "--json",
        "--nbest",
        "2",
        "--beam",
        "3",
    )
    record = json.loads(out)
    assert len(record["hypotheses"]) == 2
    first = record["hypotheses"][0]
    assert len(first["alignment"]["matrix"]) == len(first["tokens"])


def test_heatmap_png(
    tiny: TinyModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    png = tmp_path / "a.png"
    code, _, _ = run(
        monkeypatch, capsys, "ninety-seven\n", "--bundle", str(tiny.bundle), "--heatmap", str(png)
    )
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_lines_are_reported_and_the_rest_translated(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(monkeypatch, capsys, "one\n   \ntwo\n", "--bundle", str(tiny.bundle))
    assert code == 1
    assert len(out.splitlines()) == 3 and out.splitlines()[1] == ""
    assert "empty" in err


def test_missing_bundle_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "one\n", "--bundle", str(tmp_path / "nope"))
    assert code == 2 and "not found" in err
