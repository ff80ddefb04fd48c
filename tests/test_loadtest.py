"""The load test: Prometheus quantiles on hand-made scrapes, the workload, the summary, and a smoke run.

locust is never imported here (it monkey-patches the process with gevent): it runs as a subprocess.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from loadtest import prom, run, workload
from service.serve.metrics import Metrics

# A hand-made scrape: Translate OK has 100 observations, 10 <= 0.1 s, 60 <= 0.5 s, 90 <= 1 s.
SCRAPE = """\
# HELP s2s_request_duration_seconds Time to answer one RPC, by method and gRPC status code.
# TYPE s2s_request_duration_seconds histogram
s2s_request_duration_seconds_bucket{code="OK",le="0.1",method="Translate"} 10.0
s2s_request_duration_seconds_bucket{code="OK",le="0.5",method="Translate"} 60.0
s2s_request_duration_seconds_bucket{code="OK",le="1.0",method="Translate"} 90.0
s2s_request_duration_seconds_bucket{code="OK",le="+Inf",method="Translate"} 100.0
s2s_request_duration_seconds_count{code="OK",method="Translate"} 100.0
s2s_request_duration_seconds_sum{code="OK",method="Translate"} 52.0
s2s_request_duration_seconds_bucket{code="INVALID_ARGUMENT",le="0.1",method="Translate"} 7.0
s2s_request_duration_seconds_bucket{code="INVALID_ARGUMENT",le="0.5",method="Translate"} 7.0
s2s_request_duration_seconds_bucket{code="INVALID_ARGUMENT",le="1.0",method="Translate"} 7.0
s2s_request_duration_seconds_bucket{code="INVALID_ARGUMENT",le="+Inf",method="Translate"} 7.0
s2s_request_duration_seconds_count{code="INVALID_ARGUMENT",method="Translate"} 7.0
s2s_request_duration_seconds_sum{code="INVALID_ARGUMENT",method="Translate"} 0.01
s2s_request_duration_seconds_bucket{code="OK",le="0.1",method="GetModelInfo"} 3.0
s2s_request_duration_seconds_bucket{code="OK",le="0.5",method="GetModelInfo"} 3.0
s2s_request_duration_seconds_bucket{code="OK",le="1.0",method="GetModelInfo"} 3.0
s2s_request_duration_seconds_bucket{code="OK",le="+Inf",method="GetModelInfo"} 3.0
s2s_request_duration_seconds_count{code="OK",method="GetModelInfo"} 3.0
s2s_request_duration_seconds_sum{code="OK",method="GetModelInfo"} 0.003
# HELP s2s_translated_sentences_total Sentences translated to the end.
# TYPE s2s_translated_sentences_total counter
s2s_translated_sentences_total 400.0
"""


# --- prom: parsing and quantiles -----------------------------------------------------------------


def test_parse_histogram_keeps_only_translate_ok() -> None:
    hist = prom.parse_histogram(SCRAPE)
    assert hist.buckets == ((0.1, 10.0), (0.5, 60.0), (1.0, 90.0), (math.inf, 100.0))
    assert hist.count == 100.0
    assert hist.sum == pytest.approx(52.0)


def test_parse_histogram_sums_the_series_that_match() -> None:
    hist = prom.parse_histogram(SCRAPE, labels={"method": "Translate"})  # OK + INVALID_ARGUMENT
    assert hist.buckets == ((0.1, 17.0), (0.5, 67.0), (1.0, 97.0), (math.inf, 107.0))


def test_parse_histogram_without_the_series_is_an_error() -> None:
    with pytest.raises(ValueError, match="no s2s_request_duration_seconds_bucket"):
        prom.parse_histogram(SCRAPE, labels={"method": "Translate", "code": "INTERNAL"})


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.05, 0.05),  # rank 5 in (0, 0.1]: halfway
        (0.10, 0.1),  # rank 10: the top of the first bucket
        (0.50, 0.42),  # rank 50 in (0.1, 0.5]: 40 of 50 -> 0.1 + 0.4 * 0.8
        (0.75, 0.75),  # rank 75 in (0.5, 1]: 15 of 30
        (0.90, 1.0),
        (0.95, 1.0),  # rank 95 falls in +Inf: the highest finite bound, as PromQL
        (0.0, 0.0),
        (1.0, 1.0),
    ],
)
def test_histogram_quantile_interpolates_like_promql(q: float, expected: float) -> None:
    assert prom.histogram_quantile(q, prom.parse_histogram(SCRAPE)) == pytest.approx(expected)


def test_histogram_quantile_edge_cases() -> None:
    hist = prom.parse_histogram(SCRAPE)
    assert prom.histogram_quantile(-0.1, hist) == -math.inf
    assert prom.histogram_quantile(1.1, hist) == math.inf
    assert math.isnan(prom.histogram_quantile(math.nan, hist))
    empty = prom.Histogram(((0.1, 0.0), (math.inf, 0.0)))
    assert math.isnan(prom.histogram_quantile(0.5, empty))
    no_inf = prom.Histogram(((0.1, 1.0), (0.5, 2.0)))
    assert math.isnan(prom.histogram_quantile(0.5, no_inf))
    # a scrape caught mid-update (a lower bucket ahead of a higher one) is made monotonic
    bumpy = prom.Histogram(((0.1, 10.0), (0.5, 9.0), (1.0, 20.0), (math.inf, 20.0)))
    assert prom.histogram_quantile(0.5, bumpy) == pytest.approx(0.1)


def test_subtract_leaves_the_observations_between_two_scrapes() -> None:
    after = prom.parse_histogram(SCRAPE)
    before = prom.Histogram(((0.1, 10.0), (0.5, 10.0), (1.0, 10.0), (math.inf, 10.0)), 2.0)
    delta = prom.subtract(after, before)
    assert delta.buckets == ((0.1, 0.0), (0.5, 50.0), (1.0, 80.0), (math.inf, 90.0))
    assert delta.sum == pytest.approx(50.0)
    assert prom.histogram_quantile(0.5, delta) == pytest.approx(0.1 + 0.4 * 45 / 50)
    with pytest.raises(ValueError, match="bounds differ"):
        prom.subtract(after, prom.Histogram(((1.0, 1.0), (math.inf, 1.0))))


def test_quantiles_of_the_servers_own_metrics() -> None:
    """The exposition of service.serve.metrics parses, and a known spread gives the expected estimates."""
    metrics = Metrics()
    for _ in range(50):
        metrics.observe_request("Translate", "OK", 0.03)  # (0.025, 0.05]
    for _ in range(50):
        metrics.observe_request("Translate", "OK", 0.2)  # (0.1, 0.25]
    metrics.observe_request("Translate", "RESOURCE_EXHAUSTED", 9.0)  # not OK: ignored
    hist = prom.parse_histogram(generate_latest(metrics.registry).decode())
    assert hist.count == 100
    q = prom.quantiles(hist)
    assert q[0.5] == pytest.approx(0.05)  # rank 50 = the top of (0.025, 0.05]
    assert q[0.95] == pytest.approx(0.1 + 0.15 * 45 / 50)
    assert q[0.99] == pytest.approx(0.1 + 0.15 * 49 / 50)


# --- prom: the cross-check with locust --------------------------------------------------------------


def test_compare_agrees_within_one_bucket() -> None:
    hist = prom.parse_histogram(
        SCRAPE
    )  # p5 0.05 s in (0, 0.1]; p50 0.42 s in (0.1, 0.5]; p75 0.75 s in (0.5, 1]
    agreements = prom.compare(hist, {0.5: 300.0, 0.75: 450.0, 0.05: 900.0})
    assert [a.quantile for a in agreements] == [0.05, 0.5, 0.75]
    low, mid, high = agreements
    assert mid.agree and mid.prometheus_bucket == mid.locust_bucket == (0.1, 0.5)  # same bucket
    assert high.agree and high.prometheus_bucket == (0.5, 1.0) and high.locust_bucket == (0.1, 0.5)
    assert not low.agree  # 0.05 s vs 0.9 s: two buckets apart
    assert low.prometheus_s == pytest.approx(0.05) and low.locust_s == 0.9


def test_compare_without_observations_does_not_agree() -> None:
    empty = prom.Histogram(((0.1, 0.0), (math.inf, 0.0)))
    assert [a.agree for a in prom.compare(empty, {0.5: 10.0})] == [False]


def test_format_comparison() -> None:
    text = prom.format_comparison(
        prom.compare(prom.parse_histogram(SCRAPE), {0.5: 300.0, 0.05: 900.0})
    )
    assert text == "p5 900 vs 50 ms DIFFERENT BUCKETS, p50 300 vs 420 ms ok"


# --- the workload ---------------------------------------------------------------------------------


def test_committed_sentences_are_the_default_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "EVAL_TEST_TSV", Path("/nonexistent/test.tsv"))
    sources, origin = workload.load_sources()
    assert origin == str(workload.COMMITTED_TSV)
    assert len(sources) == 300 and all(s.strip() for s in sources)
    short, long = workload.split_by_length(sources)
    assert len(short) == len(long) == 75
    assert max(map(len, short)) < 40 < 90 < min(map(len, long))


def test_sentences_from_a_tsv(tmp_path: Path) -> None:
    path = tmp_path / "s.tsv"
    path.write_text(
        "one\tun\n\nfour five six seven\tquatre\ntwo three\tdeux trois\n", encoding="utf-8"
    )
    sources, origin = workload.load_sources(str(path))
    assert (sources, origin) == (["one", "four five six seven", "two three"], str(path))
    assert workload.split_by_length(sources) == (["one"], ["four five six seven"])
    (tmp_path / "empty.tsv").write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no sentences"):
        workload.read_sources(tmp_path / "empty.tsv")


def test_mixes_name_known_request_kinds() -> None:
    for mix in workload.MIXES:
        assert set(workload.mix_weights(mix)) <= set(workload.REQUEST_KINDS)
    assert all(workload.REQUEST_KINDS[k].beam == 1 for k in workload.mix_weights("beam1"))
    assert set(workload.mix_weights("short-long")) == {"short-b5", "long-b5"}
    assert workload.texts_per_request("batch16-b5") == 16
    assert workload.texts_per_request("short-b1") == 1
    with pytest.raises(ValueError, match="unknown workload mix"):
        workload.mix_weights("everything")


def test_config_from_env() -> None:
    config = workload.LoadTestConfig.from_env(
        {
            "S2S_LOADTEST_MIX": "beam1",
            "S2S_LOADTEST_ALIGNMENT": "word",
            "S2S_LOADTEST_WAIT_S": "0.1,0.5",
        }
    )
    assert (config.mix, config.alignment, config.wait_s) == ("beam1", "word", (0.1, 0.5))
    assert (config.target, config.timeout_s) == ("127.0.0.1:50051", 10.0)
    with pytest.raises(ValueError, match="S2S_LOADTEST_ALIGNMENT"):
        workload.LoadTestConfig.from_env({"S2S_LOADTEST_ALIGNMENT": "all"})
    with pytest.raises(ValueError, match="S2S_LOADTEST_WAIT_S"):
        workload.parse_wait("0.5,0.1")
    assert workload.parse_wait("0") == (0.0, 0.0)


def test_the_models_a_workload_names() -> None:
    assert workload.LoadTestConfig.from_env({}).models == (("", 1),)  # the server's default
    config = workload.LoadTestConfig.from_env({"S2S_LOADTEST_MODELS": "numbers:3, g2p"})
    assert config.models == (("numbers", 3), ("g2p", 1))
    for bad in ("numbers:0", ":2", "numbers:x"):
        with pytest.raises(ValueError, match="S2S_LOADTEST_MODELS"):
            workload.parse_models(bad)
    # stats rows are KIND@MODEL; the sentences per request still come from the kind
    assert workload.request_name("batch16-b5", "g2p") == "batch16-b5@g2p"
    assert workload.request_name("short-b5", "") == "short-b5"
    assert workload.texts_per_request("batch16-b5@g2p") == workload.BATCH_TEXTS


# --- run: arguments and the summary ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("90", 90)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert run.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "argv",
    [
        ["--users", "257"],
        ["--duration", "16m"],
        ["--duration", "5 minutes"],
        ["--users", "0"],
        ["--target", "10.0.0.1:50051", "--policy", "request"],
        ["--slo-max-error-ratio", "2"],
        ["--mix", "beam1", "--slo-name", "short-b5"],
        ["--users", "3", "--processes", "4"],
        ["--processes", "0"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.parse_args(argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize(("users", "processes"), [(1, 1), (8, 1), (16, 2), (32, 4), (64, 4)])
def test_locust_processes_follow_the_user_count(users: int, processes: int) -> None:
    args = run.parse_args(["--users", str(users), "--out", "x"])
    assert args.processes == processes == run.default_processes(users)


def test_force_allows_big_runs() -> None:
    args = run.parse_args(["--users", "300", "--duration", "20m", "--force", "--out", "x"])
    assert (args.users, args.duration_s, args.spawn_rate, args.policy) == (
        300,
        1200,
        300.0,
        "iteration",
    )


STATS_HEADER = (
    "Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,"
    "Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,"
    "50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%"
)


def write_stats(path: Path, rows: list[tuple[str, int, int, float, int, int, int]]) -> None:
    """rows: (name, requests, failures, requests/s, p50, p95, p99)."""
    lines = [STATS_HEADER]
    for name, n, fails, rps, p50, p95, p99 in rows:
        kind = "" if name == "Aggregated" else "grpc"
        lines.append(
            f"{kind},{name},{n},{fails},{p50},{p50},1,{p99},100,{rps},0.0,"
            f"{p50},{p50},{p95},{p95},{p95},{p95},{p99},{p99},{p99},{p99},{p99}"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_summary_and_slos_from_locust_csv(tmp_path: Path) -> None:
    stats = tmp_path / "locust_stats.csv"
    write_stats(
        stats,
        [
            ("batch16-b5", 10, 0, 1.0, 400, 600, 700),
            ("short-b5", 90, 1, 9.0, 20, 40, 50),
            ("Aggregated", 100, 1, 10.0, 25, 450, 650),
        ],
    )
    rows = run.read_stats(stats)
    hist = prom.parse_histogram(SCRAPE)
    args = run.parse_args(
        ["--users", "4", "--duration", "10s", "--slo-p99-ms", "1000", "--out", "x"]
    )
    s = run.summarize(args, "127.0.0.1:1", rows, hist)
    assert (s.requests, s.failures, s.requests_per_s) == (100, 1, 10.0)
    assert s.sentences_per_s == pytest.approx((10 * 16 + 89) / 10.0)  # answered sentences / 10 s
    assert s.error_ratio == pytest.approx(0.01) and s.slo_missed == []
    assert s.prometheus is not None and len(s.prometheus["quantiles"]) == 3
    assert "24.9 sentences/s" in s.line and "p99 650 ms" in s.line and s.line.endswith("SLO met")

    strict = run.parse_args(["--slo-p99-ms", "100", "--slo-max-error-ratio", "0", "--out", "x"])
    s = run.summarize(strict, "127.0.0.1:1", rows, None)
    assert s.slo_missed == ["error ratio 1.00% > 0.00%", "p99 650 ms > 100 ms"]
    assert s.prometheus is None and "SLO MISSED" in s.line

    short_only = run.parse_args(["--slo-p99-ms", "100", "--slo-name", "short-b5", "--out", "x"])
    assert run.summarize(short_only, "t", rows, None).slo_missed == []


# --- the real thing -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs the loadtest extra")
def test_smoke_run_against_a_server_it_starts(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ok"
    common = [
        "--users",
        "3",
        "--spawn-rate",
        "3",
        "--bundle",
        str(tiny.bundle),
        "--policy",
        "iteration",
    ]
    # two locust processes (a master and its workers): the path every report run above 8 users takes
    status = run.main(
        [
            *common,
            "--processes",
            "2",
            "--duration",
            "5s",
            "--out",
            str(out),
            "--slo-p99-ms",
            "20000",
        ]
    )
    assert status == 0, (out / "locust.log").read_text()
    for name in (
        "locust_stats.csv",
        "locust_failures.csv",
        "report.html",
        "metrics.txt",
        "summary.json",
    ):
        assert (out / name).is_file(), name
    with open(out / "locust_stats.csv", newline="") as f:
        total = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["requests"] > 0 and summary["error_ratio"] == 0 and summary["sentences_per_s"] > 0
    )
    # every answered request is in the server's histogram too
    assert summary["prometheus"]["requests"] == summary["requests"]

    missed = tmp_path / "missed"
    status = run.main([*common, "--duration", "2s", "--out", str(missed), "--slo-p99-ms", "0.001"])
    assert status == run.EXIT_SLO
    assert json.loads((missed / "summary.json").read_text())["slo_missed"][0].startswith("p99")


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run.main(
        [
            "--users",
            "1",
            "--duration",
            "1s",
            "--bundle",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path),
        ]
    )
    assert status == run.EXIT_FAILED
    assert "model bundle not found" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs the loadtest extra")
def test_protocols_compares_grpc_and_http_on_one_server(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from loadtest import protocols

    out = tmp_path / "protocols"
    argv = ["--users", "2", "--duration", "3s", "--rounds", "1", "--bundle", str(tiny.bundle)]
    assert protocols.main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["protocol"] for r in summary["runs"]] == ["grpc", "http"]
    for result in summary["runs"]:  # both faces answered every request
        assert result["requests"] > 0 and result["failures"] == 0, result
    assert summary["ratios"]["requests_per_s"] > 0
