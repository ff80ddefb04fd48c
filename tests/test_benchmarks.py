"""The benchmark scripts run and report what they measure (their figures are not asserted: timing
belongs in the scripts' output, not in tests)."""

from __future__ import annotations

import re

import pytest

from benchmarks.decoding import decode
from benchmarks.serving import serving_loop
from tests.conftest import TinyModel


class FakeTime:
    """perf_counter/sleep on a clock that only the timed functions move."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_interleaved_timing_takes_turns_and_keeps_each_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeTime()
    monkeypatch.setattr(decode, "time", clock)
    calls: list[str] = []
    durations = {"slow": iter([9.0, 3.0, 2.0, 4.0]), "fast": iter([9.0, 1.0, 2.0, 1.5])}

    def make(name: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            calls.append(name)
            clock.now += next(durations[name])

        return run

    best = decode.best_of_interleaved({"slow": make("slow"), "fast": make("fast")}, repeats=3)
    assert calls == ["slow", "fast"] * 4  # one warm-up each, then three rounds taking turns
    assert best == {"slow": 2.0, "fast": 1.0}  # the warm-up never counts; the pauses never count


def test_serving_loop_benchmark_runs_every_policy_without_errors(
    tiny: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    status = serving_loop.main(
        ["--bundle", str(tiny.bundle), "--users", "4", "--seconds", "1.5", "--mix", "mixed"]
    )
    assert status == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mixed u4")]
    assert [line.split()[2].rstrip(":") for line in lines] == ["none", "request", "iteration"]
    for line in lines:
        match = re.search(r"([\d.]+) sentences/s.*?(\d+) requests, (\d+) errors", line)
        assert match is not None, line
        assert float(match[1]) > 0 and int(match[2]) > 0 and int(match[3]) == 0
