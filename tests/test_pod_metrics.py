"""service/serve/pod_metrics.py: processes' expositions merged into the pod's one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from service.serve.pod_metrics import Merged, Retired, merge_texts


def exposition(requests: int, queue: int, info: bool) -> str:
    r = CollectorRegistry()
    Counter("s2s_requests", "r", ["code"], registry=r).labels("OK").inc(requests)
    Gauge("s2s_queue_depth_sentences", "q", registry=r).set(queue)
    Histogram("s2s_step_seconds", "s", buckets=(0.1, 1.0), registry=r).observe(0.5)
    if info:
        Gauge("s2s_model_info", "i", ["name"], registry=r).labels("m").set(1)
    return generate_latest(r).decode()


def value(text: str, line_start: str) -> float:
    return float(next(ln for ln in text.splitlines() if ln.startswith(line_start)).split()[-1])


def test_counters_histograms_and_gauges_add_up_and_info_counts_once() -> None:
    merged = merge_texts([exposition(3, 5, True), exposition(4, 2, True)])
    assert value(merged, 's2s_requests_total{code="OK"}') == 7
    assert value(merged, "s2s_queue_depth_sentences ") == 7  # the pod's queue: both engines'
    assert value(merged, 's2s_step_seconds_bucket{le="1.0"}') == 2
    assert value(merged, "s2s_step_seconds_count") == 2
    assert value(merged, 's2s_model_info{name="m"}') == 1  # an info series, not a count
    assert merged.count("# TYPE s2s_step_seconds histogram") == 1


def test_a_process_gone_leaves_its_counters_and_not_its_gauges() -> None:
    retired = Retired()
    retired.keep(exposition(10, 9, False))  # the front that exited had answered 10
    merged = Merged()
    merged.add_text(exposition(1, 1, False))  # its successor
    for name, (kind, _, values) in retired.merged.families.items():
        for (sample, labels), v in values.items():
            assert kind in ("counter", "histogram")  # no gauge is kept
            key = (sample, labels)
            merged.families[name][2][key] = merged.families[name][2].get(key, 0) + v
    requests = merged.families["s2s_requests"][2][("s2s_requests_total", (("code", "OK"),))]
    assert requests == 11  # the pod's count does not go down
    assert "s2s_queue_depth_sentences" not in retired.merged.families
