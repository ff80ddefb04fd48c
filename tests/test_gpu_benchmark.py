"""benchmarks.gpu runs on a machine without a GPU: CPU rows only, with the ledger's bytes per step."""

from __future__ import annotations

import argparse

from benchmarks import gpu


def test_gpu_benchmark_runs_on_the_cpu_provider_and_reports_bytes_per_step() -> None:
    args = argparse.Namespace(batches=[1, 6], models=["default"], repeats=1, steps=4)
    report = gpu.run(args)
    rows = [r for r in report["models"]["default"] if r["provider"] == "cpu"]
    assert [r["sentences"] for r in rows] == [1, 6]
    for r in rows:
        for kind in ("static", "churn"):
            figures = r[kind]
            assert figures["hyp_steps_per_s"] > 0 and figures["speedup_over_cpu"] == 1.0
            # every step moves at least the tokens, back-pointers and the top-k of each hypothesis
            assert figures["bytes_per_step"] >= r["hypotheses"] * (8 + 8 + (gpu.BEAM + 1) * 12)
            assert figures["bytes_by_reason"]["topk"] == r["hypotheses"] * (gpu.BEAM + 1) * 12
    # in the churn run one sentence joins per step: its rows cross, the running ones never do (a
    # re-upload of the batch on each join would make B 6 move ~6x what B 1 moves)
    churn = rows[1]["churn"]["bytes_by_reason"]
    assert 0 < churn["encoder_rows"] < 3 * rows[0]["churn"]["bytes_by_reason"]["encoder_rows"]
