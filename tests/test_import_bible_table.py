"""benchmarks/importing/import_bible_table.py's parts that need no toolkit: the interleaved timing it shares
with benchmarks/importing/import_speed.py, the int8 copy of a bundle, and the table it prints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.importing import import_bible_table, import_speed
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from tests.conftest import TinyModel


class FakeTime:
    """perf_counter on a clock that only the timed systems move."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_systems_take_turns_and_report_the_median_round(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(import_speed, "time", clock)
    calls: list[tuple[str, int]] = []
    durations = {"a": iter([9.0, 1.0, 5.0, 2.0]), "b": iter([9.0, 4.0, 4.0, 40.0])}

    def make(name: str):  # type: ignore[no-untyped-def]
        def run(lines: list[str]) -> list[str]:
            calls.append((name, len(lines)))
            clock.now += next(durations[name])
            return [name.upper()] * len(lines)

        return run

    lines = ["x"] * 100
    speeds, outputs = import_speed.time_systems({"a": make("a"), "b": make("b")}, lines, repeats=3)
    assert calls == [("a", 64), ("b", 64)] + [("a", 100), ("b", 100)] * 3  # warm-up, then turns
    assert speeds == {"a": 50.0, "b": 25.0}  # 100 lines / the median round (2 s, 4 s)
    assert outputs == {"a": ["A"] * 100, "b": ["B"] * 100}


def test_int8_copy_adds_a_quantized_decoder_and_leaves_the_bundle(
    tiny: TinyModel, tmp_path: Path
) -> None:
    fp32_only = tmp_path / "tiny"
    shutil.copytree(tiny.bundle, fp32_only)
    (fp32_only / "decoder.int8.onnx").unlink()
    manifest = json.loads((fp32_only / "manifest.json").read_text())
    del manifest["files"]["decoder.int8.onnx"]
    (fp32_only / "manifest.json").write_text(json.dumps(manifest))

    copy = import_bible_table.int8_copy(fp32_only, tmp_path / "work")
    assert not (fp32_only / "decoder.int8.onnx").exists()
    int8 = RuntimeConfig(providers=("CPUExecutionProvider",), int8_decoder=True)
    options = SearchOptions(beam_size=2)
    ours, exported = (
        [t.hypotheses[0].tokens for t in Engine.load(b, int8).translate(tiny.sources, options)]
        for b in (copy, tiny.bundle)
    )
    assert ours == exported  # quantized as the exporter's --int8 quantizes
    # a bundle whose decoder changed gets a new copy, not the old one
    assert import_bible_table.int8_copy(fp32_only, tmp_path / "work") == copy
    manifest = json.loads((fp32_only / "manifest.json").read_text())
    manifest["files"]["decoder.onnx"] = "0" * 64  # what a re-export's new decoder looks like here
    (fp32_only / "manifest.json").write_text(json.dumps(manifest))
    stale = (copy / "decoder.int8.onnx").stat().st_mtime_ns
    import_bible_table.int8_copy(fp32_only, tmp_path / "work")
    assert (copy / "decoder.int8.onnx").stat().st_mtime_ns != stale


def test_the_table_has_a_row_per_system_and_leaves_phases_not_run_empty() -> None:
    rows = [
        {"system": "ours", "bleu": 12.26, "chrf": 35.25, "aer_argmax": 0.473,
         "ours_sent_per_s_1t": 40.0, "ours_int8_sent_per_s_1t": 70.0},
        {"system": "toolkit model", "identical_greedy": "877/877", "identical_beam5": "876/877",
         "ours_sent_per_s_1t": 300.0, "ours_int8_sent_per_s_1t": 450.0,
         "toolkit_sent_per_s_1t": 100.0, "ratio_1t": 3.0, "ratio_int8_1t": 4.5},
    ]  # fmt: skip
    table = import_bible_table.format_table(rows, [1], "title").splitlines()
    header = [c.strip() for c in table[2].strip("|").split("|")]
    ours = [c.strip() for c in table[4].strip("|").split("|")]
    toolkit = [c.strip() for c in table[5].strip("|").split("|")]
    assert len(table) == 6 and len(ours) == len(header) == len(toolkit)
    assert ours[header.index("BLEU")] == "12.3" and ours[header.index("AER argmax")] == "0.473"
    assert ours[header.index("AER grow")] == "" and ours[header.index("1t toolkit")] == ""
    assert toolkit[header.index("beam 5 identical")] == "876/877"
    assert toolkit[header.index("1t ours/toolkit (int8)")] == "3.00x (4.50x)"
