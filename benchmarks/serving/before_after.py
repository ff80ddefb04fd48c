"""A restructuring's speed check: this checkout against an earlier one (a worktree of the commit
before), served and offline, in interleaved rounds on the same machine.

    git worktree add /tmp/before <commit> && cp proto/translation/v1/*_pb2*.py /tmp/before/proto/translation/v1/
    python -m benchmarks.serving.before_after --before /tmp/before --rounds 2 \
        [--bundles models/grc-en-nt-transformer models/grc-en-nt] [--json PATH]

Per round and bundle, before then after, then after then before in the next round (so neither
side always runs first):

- served: `python -m service.serve.server` from each checkout on the bundle (its defaults),
  `--users` closed-loop gRPC clients each sending one text at a time (beam 5, n-best 2, word
  alignment: benchmarks/serving/served.py's `measure`), sentences/s and p50/p99;
Each checkout serves and translates with its own models/NAME (the same weights; a manifest's
format may differ).

- offline: `s2s-translate --json --nbest 2` from each checkout over `--sentences` texts, wall
  seconds of the whole command (start-up included) → sentences/s.

The ratios are after / before of the medians over rounds (rates: above 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from benchmarks.serving.served import measure
from loadtest.harness import LocalServer

REPO = Path(__file__).resolve().parent.parent.parent


def served_rate(checkout: Path, bundle: Path, texts: list[str], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        server = LocalServer.start(
            str(bundle), "iteration", Path(scratch), ready_timeout_s=180, cwd=checkout
        )
        try:
            return measure(
                server.target, texts, args.users, args.client_processes, args.warmup_s, args.seconds
            )
        finally:
            server.stop()


def offline_rate(checkout: Path, bundle: Path, texts: list[str]) -> float:
    command = [sys.executable, "-m", "service.cli.translate", "--bundle", str(bundle),
               "--json", "--nbest", "2"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, input="\n".join(texts) + "\n", capture_output=True, text=True,
                   cwd=checkout, check=True)  # fmt: skip
    return len(texts) / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sides = {"before": args.before.resolve(), "after": REPO}
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for bundle in args.bundles:
            bundle = bundle.resolve()
            texts = bundle_texts(bundle)[: args.sentences]
            row = rows.setdefault(bundle.name, {})
            for side in order:
                got = row.setdefault(side, {"served": [], "p50": [], "p99": [], "offline": []})
                # each checkout serves its own copy of the bundle (its manifest's format)
                own = sides[side] / "models" / bundle.name
                served = served_rate(sides[side], own, texts, args)
                got["served"].append(served["sentences_per_s"])
                got["p50"].append(served["p50_ms"] or 0.0)
                got["p99"].append(served["p99_ms"] or 0.0)
                got["offline"].append(offline_rate(sides[side], own, texts))
                print(f"round {r + 1} {bundle.name} {side}: served "
                      f"{served['sentences_per_s']:.1f} sent/s p50 {served['p50_ms']:.0f} ms, "
                      f"offline {got['offline'][-1]:.1f} sent/s", flush=True)  # fmt: skip
    summary = {}
    for name, row in rows.items():
        med = {s: {k: statistics.median(v) for k, v in row[s].items()} for s in row}
        summary[name] = {
            **med,
            "served_ratio": med["after"]["served"] / med["before"]["served"],
            "offline_ratio": med["after"]["offline"] / med["before"]["offline"],
            "p50_ratio": med["after"]["p50"] / med["before"]["p50"],
        }
    return {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rows, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the earlier checkout")
    parser.add_argument("--bundles", type=Path, nargs="+",
                        default=[REPO / "models/grc-en-nt-transformer", REPO / "models/grc-en-nt"])  # fmt: skip
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=200, help="texts per bundle")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run(args)
    for name, s in report["summary"].items():
        print(f"{name}: served after/before {s['served_ratio']:.2f}x (p50 {s['p50_ratio']:.2f}x), "
              f"s2s-translate {s['offline_ratio']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
