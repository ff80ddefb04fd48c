"""Served sentences/s of whole servers, laid out several ways, side by side in one run.

    python -m benchmarks.serving.layouts --bundle models/grc-en-nt --users 64 --seconds 20 \
        --repeat 3 --baseline /tmp/base \
        --layout "default=" --layout "single=--fronts 0" \
        --layout "1 front, 2 engines x 1 thread=--engines 2 --intra-op-threads 1" [--json PATH]

Each layout is `NAME=FLAGS`: the server started as users start it (`python -m service.serve.server`
with those flags; "default" with none, so on this machine's cores), measured by
benchmarks.serving.served's closed loop (`--users` clients in `--client-processes` processes, one
text of the bundle's sample texts a request, beam 5, n-best 2, word alignment; requests that start
and end inside the window count). `--baseline DIR` adds the server of another checkout (today's
single-process server: `git archive` of the commit before the split, with the generated stubs copied
in), started from DIR. The layouts take turns `--repeat` times, so that a machine shared with other
work weighs on each alike; the report gives every run and each layout's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.sample_texts import bundle_texts
from benchmarks.serving.served import measure
from loadtest.harness import LocalServer, RunFailed

REPO = Path(__file__).resolve().parent.parent.parent
BASE_FLAGS = ["--http-port", "-1", "--log-level", "WARNING", "--providers", "CPUExecutionProvider"]


def run_layout(
    name: str, flags: list[str], cwd: Path | None, args: argparse.Namespace, texts: list[str]
) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    if cwd is not None:  # the baseline imports its own tree
        env["PYTHONPATH"] = str(cwd)
    out = Path(tempfile.mkdtemp(prefix="layout-"))
    started = time.monotonic()
    server = LocalServer.start(
        str(args.bundle), "iteration", out, args.start_timeout_s, extra=[*BASE_FLAGS, *flags],
        env=env, cwd=cwd,
    )  # fmt: skip
    ready_s = time.monotonic() - started
    rows = []
    try:
        for users in args.users:
            row = measure(server.target, texts, users, args.client_processes, args.warmup_s,
                          args.seconds)  # fmt: skip
            row.update(layout=name, flags=flags, ready_s=round(ready_s, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = sorted({(r["layout"], r["users"]) for r in rows}, key=str)
    out = []
    for layout, users in keys:
        mine = [r for r in rows if (r["layout"], r["users"]) == (layout, users)]
        out.append({
            "layout": layout, "users": users, "runs": len(mine),
            "sentences_per_s": [round(r["sentences_per_s"], 1) for r in mine],
            "median_sentences_per_s": round(statistics.median(r["sentences_per_s"] for r in mine), 1),
            "median_p50_ms": round(statistics.median(r["p50_ms"] or 0 for r in mine), 1),
            "median_p99_ms": round(statistics.median(r["p99_ms"] or 0 for r in mine), 1),
        })  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", type=Path, default=REPO / "models" / "grc-en-nt")
    p.add_argument("--layout", action="append", default=[], help="NAME=FLAGS")
    p.add_argument("--baseline", type=Path, help="another checkout's server, as 'baseline'")
    p.add_argument("--users", type=int, nargs="+", default=[64])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--client-processes", type=int, default=1)
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    layouts: list[tuple[str, list[str], Path | None]] = []
    if args.baseline:
        layouts.append(("baseline (single process, before the split)", [], args.baseline))
    for item in args.layout or ["default="]:
        name, _, flags = item.partition("=")
        layouts.append((name, flags.split(), None))
    texts = bundle_texts(args.bundle)
    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for _ in range(args.repeat):
        for name, flags, cwd in layouts:
            try:
                rows += run_layout(name, flags, cwd, args, texts)
            except (RunFailed, OSError) as err:
                errors[name] = f"{type(err).__name__}: {err}"
                print(f"{name}: failed: {err}", flush=True)
    report: dict[str, Any] = {"bundle": str(args.bundle), "cores": os.cpu_count(), "runs": rows,
              "summary": summary(rows), "errors": errors}  # fmt: skip
    for row in report["summary"]:
        print(json.dumps(row))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
