"""loadtest/soak.py: its bounds, its checks on made-up figures, and a 20-second smoke run of the real
thing (the long soak itself runs on a quiet machine: see docs/hardening.md)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

from loadtest import soak


def samples(mib: list[float], every_s: float = 1.0) -> list[soak.Sample]:
    return [soak.Sample(i * every_s, m * soak.MIB, {}) for i, m in enumerate(mib)]


@pytest.mark.parametrize(
    "argv",
    [
        ["--users", "257"],
        ["--users", "0"],
        ["--duration", "31m"],
        ["--duration", "0s"],
        ["--duration", "soon"],
        ["--duration", "1m", "--settle-s", "60"],
        ["--sample-s", "0"],
        ["--max-rss-growth", "-0.1"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        soak.parse_args([*argv, "--out", "x"])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_defaults_scale_with_the_duration() -> None:
    long = soak.parse_args(["--duration", "30m", "--users", "256", "--out", "x"])
    assert (long.duration_s, long.sample_s, long.settle_s) == (1800, 5.0, 120.0)
    assert long.load.duration_s == 1800 and long.load.users == 256 and long.load.force
    short = soak.parse_args(["--duration", "20s", "--out", "x"])
    assert (short.sample_s, short.settle_s) == (1.0, 2.0)


def test_rss_trend_compares_the_first_and_last_thirds() -> None:
    flat = soak.rss_trend(samples([100, 300, 101, 100, 99, 100, 100, 101, 100]), settle_s=0)
    assert flat is not None and flat.first_mib == 101 and flat.last_mib == 100
    assert abs(flat.growth) < 0.02
    leak = soak.rss_trend(samples([100 + i for i in range(60)], every_s=60), settle_s=0)
    assert leak is not None and leak.growth == pytest.approx(40 / 109.5)
    assert leak.slope_mib_per_h == pytest.approx(60.0)  # 1 MiB a minute
    settled = soak.rss_trend(samples([50, 50, 100, 100, 100, 100, 100, 100, 100]), settle_s=2)
    assert settled is not None and settled.growth == 0 and settled.samples == 7
    assert soak.rss_trend(samples([100] * 5)) is None
    assert soak.rss_trend([soak.Sample(t, math.nan, {}) for t in range(10)]) is None


def report(**changes: object) -> soak.SoakReport:
    base = soak.SoakReport(
        users=4,
        duration_s=20,
        requests=100,
        failures=0,
        ok_requests=100,
        gauges_after={"queue_depth": 0, "running": 0, "in_flight": 0},
        server_exit=0,
        rss=None,
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_checks() -> None:
    steady = soak.rss_trend(samples([100] * 9))
    ok = report()
    soak.check(ok, steady, 0.1)
    assert ok.passed and set(ok.checks) == {"errors", "lost", "drained", "rss", "exit"}
    failing = {
        "errors": report(failures=1),
        "lost": report(ok_requests=99),
        "drained": report(gauges_after={"queue_depth": 0, "running": 3, "in_flight": 0}),
        "exit": report(server_exit=1),
    }
    for name, r in failing.items():
        soak.check(r, steady, 0.1)
        assert [n for n, c in r.checks.items() if not c.ok] == [name]
    grown = report()
    soak.check(grown, soak.rss_trend(samples([100, 100, 100, 110, 110, 110, 120, 120, 120])), 0.1)
    assert not grown.checks["rss"].ok and "+20.0%" in grown.checks["rss"].detail
    nothing = report(requests=0, ok_requests=0)
    soak.check(nothing, None, 0.1)
    assert not nothing.checks["lost"].ok and not nothing.checks["rss"].ok


def test_read_series_picks_the_gauges_and_the_ok_count() -> None:
    text = """
# TYPE s2s_queue_depth_sentences gauge
s2s_queue_depth_sentences 3.0
# TYPE s2s_running_sentences gauge
s2s_running_sentences 7.0
# TYPE s2s_requests_in_flight gauge
s2s_requests_in_flight{method="Translate"} 2.0
s2s_requests_in_flight{method="GetModelInfo"} 1.0
# TYPE s2s_request_duration_seconds histogram
s2s_request_duration_seconds_count{code="OK",method="Translate"} 41.0
s2s_request_duration_seconds_count{code="CANCELLED",method="Translate"} 5.0
s2s_request_duration_seconds_count{code="OK",method="GetModelInfo"} 9.0
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.5e8
"""
    assert soak.read_series(text) == {
        "queue_depth": 3,
        "running": 7,
        "in_flight": 2,
        "ok_requests": 41,
        "metric_rss_bytes": 1.5e8,
    }


def test_read_rss_of_this_process() -> None:
    import os

    rss = soak.read_rss(os.getpid())
    if Path("/proc/self/status").is_file():
        assert rss is not None and rss > 10 * soak.MIB
    assert soak.read_rss(2**31 - 1) is None  # no such process


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs the loadtest extra")
def test_a_20_second_soak_passes_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    argv = ["--duration", "20s", "--users", "4", "--sample-s", "1", "--out", str(out)]
    # 20 s is all warm-up for the allocators: the RSS check is exercised, not judged
    status = soak.main([*argv, "--max-rss-growth", "1.0"])
    document = json.loads((out / "soak.json").read_text())
    assert status == 0, json.dumps(document["checks"], indent=1)
    assert document["passed"] and document["requests"] == document["ok_requests"] > 0
    assert document["gauges_after"] == {"queue_depth": 0, "running": 0, "in_flight": 0}
    with open(out / "rss.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 15 and all(int(r["rss_bytes"]) > 20 * soak.MIB for r in rows)
    assert float(rows[-1]["ok_requests"]) == document["ok_requests"]
    assert document["rss"]["samples"] >= 12
    assert (out / "rss.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)
    for name in ("locust_stats.csv", "server.log", "metrics.txt", "summary.json"):
        assert (out / name).is_file(), name


def test_the_chaos_soak_counts_a_failure_held_only_when_a_kill_explains_it() -> None:
    from loadtest.chaos import Event, held
    from loadtest.closed_loop import Outcome

    front = Event(at=100.0, what="front-0", pid=1)
    engine = Event(at=100.0, what="engine-0", pid=2)
    reset = "Stream removed (recvmsg:Connection reset by peer (104))"
    in_flight = Outcome("t", started=99.0, seconds=2.0, code="UNAVAILABLE", details="engine died")
    assert held(in_flight, [engine]) and held(in_flight, [front])
    # sent on the dead front's connection a moment after its kill: the reset is the front's doing
    after_front = Outcome("t", started=100.3, seconds=0.01, code="UNAVAILABLE", details=reset)
    assert held(after_front, [front])
    assert not held(after_front, [engine])  # an engine's kill resets no client connection
    assert not held(Outcome("t", 100.3, 0.01, "UNAVAILABLE", "engine died"), [front])
    assert not held(Outcome("t", 102.0, 0.01, "UNAVAILABLE", reset), [front])  # too late
    assert not held(Outcome("t", 99.0, 0.5, "UNAVAILABLE", reset), [front])  # ended before it
