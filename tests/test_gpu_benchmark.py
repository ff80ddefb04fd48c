"""benchmarks.gpu.decode_loop runs on a machine without a GPU: CPU rows only, with the ledger's bytes per step,
both searches side by side."""

from __future__ import annotations

import argparse

from benchmarks.gpu import decode_loop as gpu


def test_gpu_benchmark_runs_on_the_cpu_provider_and_reports_bytes_per_step() -> None:
    args = argparse.Namespace(
        batches=[1, 6], models=["default"], repeats=1, steps=4, searches=["host", "device"]
    )
    report = gpu.run(args)
    rows = [r for r in report["models"]["default"] if r["provider"] == "cpu"]
    assert [(r["sentences"], r["search"]) for r in rows] == [
        (1, "host"),
        (1, "device"),
        (6, "host"),
        (6, "device"),
    ]
    for r in rows:
        for kind in ("static", "churn"):
            figures = r[kind]
            assert figures["hyp_steps_per_s"] > 0 and figures["speedup_over_cpu"] == 1.0
            reasons = figures["bytes_by_reason"]
            if r["search"] == "host":
                # every step moves the tokens, back-pointers and the top-k of each hypothesis
                assert figures["bytes_per_step"] >= r["hypotheses"] * (8 + 8 + (gpu.BEAM + 1) * 12)
                assert reasons["topk"] == r["hypotheses"] * (gpu.BEAM + 1) * 12
            else:  # the device search: a done flag per sentence, no top k, no attention row
                assert reasons["topk"] == reasons["attention"] == 0
                assert reasons["done"] == r["sentences"]
    # in the churn run one sentence joins per step: its encoder rows and initial state go from
    # the encoder's outputs to the running batch on the device, and nothing of them crosses
    for r in rows:
        reasons = r["churn"]["bytes_by_reason"]
        assert reasons["encoder_rows"] == reasons["state"] == 0, r["search"]
        assert reasons["indices"] < 24 * r["sentences"] + 64  # the join's and leave's indices
