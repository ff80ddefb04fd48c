"""The performance report's measurements: every batching policy at several concurrencies, one session.

    python -m loadtest.matrix --duration 30s --out runs/loadtest/matrix      # ~15 minutes
    python -m loadtest.matrix --report runs/loadtest/matrix --doc docs/performance-results.md

Runs `loadtest.run` (a fresh server per run, on loopback) for:
  - the mixed workload at 1, 8, 32 and 64 users under the policies none, request and iteration;
  - beam-1 requests alone at 32 users under none and iteration;
  - short and long beam-5 requests at 32 users under request and iteration (short requests' p99);
then writes a markdown table and a latency-versus-throughput PNG from the runs' summary.json files.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import run as loadtest_run

POLICIES = ("none", "request", "iteration")
USERS = (1, 8, 32, 64)


@dataclass(frozen=True)
class Case:
    mix: str
    policy: str
    users: int

    @property
    def name(self) -> str:
        return f"{self.mix}-{self.policy}-u{self.users}"


def cases() -> list[Case]:
    out = [Case("mixed", p, u) for u in USERS for p in POLICIES]
    out += [Case("beam1", p, 32) for p in ("none", "iteration")]
    out += [Case("short-long", p, 32) for p in ("request", "iteration")]
    return out


def run_case(case: Case, duration: str, out: Path, bundle: str) -> dict[str, Any]:
    folder = out / case.name
    argv = [
        "--users", str(case.users), "--duration", duration, "--mix", case.mix, "--policy", case.policy,
        "--bundle", bundle, "--out", str(folder), "--timeout-s", "60", "--slo-max-error-ratio", "1",
    ]  # fmt: skip
    loadtest_run.main(argv)
    return load_summary(folder)


def load_summary(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def kind(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next((k for k in summary.get("kinds", []) if k["name"] == name), {})


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| mix | policy | users | requests/s | sentences/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases():
        s = results.get(case.name, {})
        if not s:
            continue
        lines.append(
            f"| {case.mix} | {case.policy} | {case.users} | {s['requests_per_s']:.1f} | {s['sentences_per_s']:.1f} "
            f"| {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['p99_ms']:.0f} | {s['failures']}/{s['requests']} |"
        )
    return "\n".join(lines)


def ratios(results: dict[str, dict[str, Any]]) -> list[str]:
    def sps(name: str) -> float:
        return float(results.get(name, {}).get("sentences_per_s", float("nan")))

    short_req = kind(results.get("short-long-request-u32", {}), "short-b5").get(
        "p99_ms", float("nan")
    )
    short_it = kind(results.get("short-long-iteration-u32", {}), "short-b5").get(
        "p99_ms", float("nan")
    )
    return [
        f"- mixed, 32 users: iteration-level / no batching throughput = "
        f"{sps('mixed-iteration-u32') / sps('mixed-none-u32'):.2f}x (floor 2.5x)",
        f"- beam 1 alone, 32 users: iteration-level / no batching throughput = "
        f"{sps('beam1-iteration-u32') / sps('beam1-none-u32'):.2f}x (floor 5x)",
        f"- short requests among long ones, 32 users: p99 of short-b5 = {short_it:.0f} ms (iteration) vs "
        f"{short_req:.0f} ms (request) = {short_it / short_req:.2f}x (ceiling 0.5x)",
    ]


def prometheus_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for name, s in results.items():
        prom = s.get("prometheus") or {}
        if prom:
            out.append(
                f"- {name}: {'agree' if prom.get('agree') else 'DISAGREE'} — {prom.get('text', '')}"
            )
    return out


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in POLICIES:
        points = [results.get(f"mixed-{policy}-u{u}", {}) for u in USERS]
        xs = [p["sentences_per_s"] for p in points if p]
        ys = [p["p95_ms"] for p in points if p]
        ax.plot(xs, ys, marker="o", label=policy)
        for p, u in zip(points, USERS, strict=True):
            if p:
                ax.annotate(f"{u}u", (p["sentences_per_s"], p["p95_ms"]), fontsize=7)
    ax.set_xlabel("throughput (sentences/s)")
    ax.set_ylabel("p95 latency (ms)")
    ax.set_yscale("log")
    ax.set_title("mixed workload: latency vs throughput by batching policy")
    ax.legend(title="policy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path, doc: Path, png: Path) -> None:
    results = {c.name: load_summary(out / c.name) for c in cases()}
    results = {k: v for k, v in results.items() if v}
    plot(results, png)
    text = "\n".join(
        [
            table(results),
            "",
            *ratios(results),
            "",
            "Prometheus histogram quantiles vs locust's (agree = same or adjacent bucket):",
            "",
            *prometheus_lines(results),
            "",
        ]
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", default="30s")
    p.add_argument("--out", type=Path, default=Path("runs/loadtest/matrix"))
    p.add_argument("--bundle", default="models/default")
    p.add_argument("--only", nargs="*", help="case names to run (default: all)")
    p.add_argument("--report", type=Path, help="only write the report from this folder's runs")
    p.add_argument("--doc", type=Path, default=Path("docs/performance-results.md"))
    p.add_argument("--png", type=Path, default=Path("docs/performance-latency-throughput.png"))
    args = p.parse_args(argv)
    if args.report is None:
        for case in cases():
            if args.only and case.name not in args.only:
                continue
            s = run_case(case, args.duration, args.out, args.bundle)
            print(case.name, s.get("line", "no summary"), flush=True)
    write_report(args.report or args.out, args.doc, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
