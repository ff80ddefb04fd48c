"""loadtest/soak_hour.py's short run: the tooling end to end (server of every embedded model, mixed
requests with cancellations, a SIGHUP reload, samples, windows, checks), not the hour's verdict."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest import closed_loop, soak_hour
from tests.conftest import REPO


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))


def test_a_short_soak_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    argv = [
        sys.executable, "-m", "loadtest.soak_hour", "--duration", "45s", "--users", "4",
        "--sample-s", "3", "--window", "15s", "--settle", "6s", "--max-p99-growth", "0",
        "--max-rss-growth", "0.25", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "soak.json").read_text())
    assert report["passed"]
    assert set(report["checks"]) >= {
        "errors",
        "answered",
        "server",
        "drained",
        "reload",
        "rss",
        "fds",
        "exit",
    }
    assert report["reloaded"] and 15 <= report["reload_s"] <= 30  # SIGHUP at the middle
    assert report["sent"] == report["answered"] + report["cancelled"] > 0
    assert report["cancelled"] > 0  # the mix cancels some requests itself
    rows = read_csv(out / "samples.csv")
    assert len(rows) >= 12 and all(int(r["fds"]) > 0 and int(r["rss_bytes"]) > 0 for r in rows)
    windows = read_csv(out / "windows.csv")
    assert len(windows) == 3 and all(int(w["answered"]) > 0 for w in windows)
    assert "PASS" in done.stdout.splitlines()[-1]


def test_windows_group_by_start_time_and_count_outcomes() -> None:
    outcomes = [
        closed_loop.Outcome("a", 100.0 + t, 0.010 * (1 + i), code)
        for i, (t, code) in enumerate(
            [(1, "OK"), (2, "OK"), (11, "OK"), (12, "UNAVAILABLE"), (13, "CANCELLED_BY_CLIENT")]
        )
    ]
    rows = soak_hour.windows(outcomes, 100.0, 10.0, 25.0)
    assert [(r["answered"], r["errors"], r["cancelled"], r["full"]) for r in rows] == [
        (2, 0, 0, True),
        (1, 1, 1, True),
        (0, 0, 0, False),
    ]
    assert rows[0]["p50_ms"] == pytest.approx(10.0) and rows[0]["p99_ms"] == pytest.approx(20.0)


def test_bounds_are_refused() -> None:
    for argv in (["--duration", "3h"], ["--users", "0"], ["--reload-at", "1.5"]):
        with pytest.raises(SystemExit):
            soak_hour.parse_args([*argv, "--out", "/tmp/x"])
    assert (
        soak_hour.parse_args(["--duration", "3h", "--force", "--out", "/tmp/x"]).duration_s
        == 3 * 3600
    )
