"""Translate with markup as the server answers it: the same texts with one tag each and untagged,
at 64 closed-loop clients, in both layouts, side by side in one run.

    python -m benchmarks.alignment.markup_served --bundle models/grc-en-nt --users 64 \
        --seconds 20 --rounds 3 --json docs/benchmarks/markup-served.json

For each layout (`processes`: `--fronts 1 --engines 1`, the default on more than one core; `single`:
`--fronts 0`, one process) a server is started as users start it, on the CPU. Its answers are checked
first, one request at a time: every tagged answer well-formed with its one tag, and its
`plain_text` the untagged answer's text (the tags change nothing in the decode); the tagged answers
must be the same in both layouts. Then `--rounds` interleaved rounds of `--seconds` each, untagged
then tagged, `--users` clients (in `--client-processes` processes) each sending one text at a time
(beam 5, no alignment asked: what a user who wants the tags back sends): sentences/s, p50 and p99.
The figure is the cost, untagged sentences/s over tagged (best round of each; 1.0 = free), beside
the CLI's (`benchmarks.alignment.markup_cli`).

The texts are the bundle's sample texts (loadtest/grc_sources.txt for the Greek models), each with
`<b>` around 1-3 of its words (`--seed`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.alignment.markup_cli import one_tag
from benchmarks.sample_texts import bundle_texts
from loadtest.harness import LocalServer
from service.model import markup

LAYOUTS = {"processes": ["--fronts", "1", "--engines", "1"], "single": ["--fronts", "0"]}
CHECKED_TEXTS = 24


def request(text: str, tagged: bool) -> Any:
    from proto.translation.v1 import translation_pb2 as pb

    options = pb.DecodingOptions(beam_size=5, n_best=1, alignment=pb.ALIGNMENT_MODE_NONE)
    if tagged:
        options.markup = "xml"
    return pb.TranslateRequest(texts=[text], options=options)


def client_process(
    target: str, texts: list[str], tagged: bool, users: int, seconds: float, seed: int, out: Any
) -> None:
    """One process's share of the users for `seconds`: sends back (start, seconds, code)."""
    from loadtest.closed_loop import Call, ClosedLoop, Kind

    kind = Kind(
        "tagged" if tagged else "untagged",
        1,
        lambda rng, stub: Call(stub.Translate, request(rng.choice(texts), tagged)),
    )
    loop = ClosedLoop(target, [kind], users, seed=seed)
    loop.start()
    time.sleep(seconds)
    loop.stop()
    _, outcomes = loop.tally.snapshot()
    out.put([(o.started, o.seconds, o.code) for o in outcomes])


def measure(
    target: str, texts: list[str], tagged: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop window: sentences/s, p50, p99 of the requests inside it."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    n = args.client_processes
    shares = [args.users // n + (1 if i < args.users % n else 0) for i in range(n)]
    total = args.warmup_s + args.seconds
    workers = [
        context.Process(
            target=client_process, args=(target, texts, tagged, share, total, i + 1, queue)
        )
        for i, share in enumerate(shares)
        if share
    ]
    for w in workers:
        w.start()
    time.sleep(args.warmup_s)
    start = time.monotonic()
    time.sleep(args.seconds)
    end = time.monotonic()
    outcomes = [o for _ in workers for o in queue.get(timeout=total + 120)]
    for w in workers:
        w.join()
    inside = [o for o in outcomes if o[0] >= start and o[0] + o[1] <= end]
    ok = [o[1] for o in inside if o[2] == "OK"]
    return {
        "sentences_per_s": len(ok) / (end - start),
        "p50_ms": float(np.percentile(ok, 50) * 1000) if ok else None,
        "p99_ms": float(np.percentile(ok, 99) * 1000) if ok else None,
        "ok": len(ok),
        "errors": sorted({o[2] for o in inside if o[2] != "OK"}),
    }


def answers(target: str, texts: list[str], tagged: bool) -> list[tuple[str, str]]:
    """(text, plain_text) of each text's best hypothesis, one request at a time."""
    import grpc

    from proto.translation.v1 import translation_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        out = []
        for text in texts:
            best = stub.Translate(request(text, tagged), timeout=60).translations[0].hypotheses[0]
            out.append((best.text, best.plain_text))
    return out


def checked(tagged: list[tuple[str, str]], untagged: list[tuple[str, str]]) -> dict[str, float]:
    """The shares of tagged answers well-formed with their one tag, and whose plain text is the
    untagged answer."""
    formed = same = 0
    for (text, plain), (untagged_text, _) in zip(tagged, untagged, strict=True):
        try:
            markup.parse(text, "xml", (markup.NO_PROTECT,))
        except markup.MarkupError:
            continue
        formed += text.count("<b>") == text.count("</b>") == 1
        same += plain == untagged_text
    return {"well_formed": formed / len(tagged), "plain_identical": same / len(tagged)}


def run_layout(
    name: str, tagged: list[str], plain: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    flags = [*LAYOUTS[name], "--providers", "CPUExecutionProvider", "--log-level", "WARNING"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    out = Path(tempfile.mkdtemp(prefix=f"markup-served-{name}-"))
    server = LocalServer.start(str(args.bundle), "iteration", out, 300, extra=flags, env=env)
    try:
        checked_tagged = answers(server.target, tagged[:CHECKED_TEXTS], True)
        checked_plain = answers(server.target, plain[:CHECKED_TEXTS], False)
        rounds: dict[str, list[dict[str, Any]]] = {"untagged": [], "tagged": []}
        for _ in range(args.rounds):  # interleaved: both see the same machine
            rounds["untagged"].append(measure(server.target, plain, False, args))
            rounds["tagged"].append(measure(server.target, tagged, True, args))
    finally:
        server.stop()
    best = {k: max(v, key=lambda r: r["sentences_per_s"]) for k, v in rounds.items()}
    return {
        "layout": name,
        "flags": " ".join(LAYOUTS[name]),
        "untagged": best["untagged"],
        "tagged": best["tagged"],
        "cost": round(best["untagged"]["sentences_per_s"] / best["tagged"]["sentences_per_s"], 3),
        **checked(checked_tagged, checked_plain),
        "answers": [t for t, _ in checked_tagged],
        "rounds": rounds,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['bundle']}: {report['users']} clients, one text a request (beam 5), "
        f"best of {report['rounds']} interleaved rounds of {report['seconds']} s",
        "",
        "| layout | untagged sent/s (p50/p99 ms) | tagged sent/s (p50/p99 ms) | cost | "
        "well-formed | plain identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["layouts"]:
        u, t = r["untagged"], r["tagged"]
        lines.append(
            f"| {r['layout']} ({r['flags']}) | {u['sentences_per_s']:.1f} "
            f"({u['p50_ms']:.0f}/{u['p99_ms']:.0f}) | {t['sentences_per_s']:.1f} "
            f"({t['p50_ms']:.0f}/{t['p99_ms']:.0f}) | {r['cost']:.2f}x | {r['well_formed']:.2f} | "
            f"{r['plain_identical']:.2f} |"
        )
    lines.append(f"\nthe tagged answers equal in both layouts: {report['same_in_both_layouts']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tagged = [one_tag(t, rng) for t in bundle_texts(args.bundle)]
    plain = [markup.parse(t, "xml").plain for t in tagged]
    layouts = [run_layout(name, tagged, plain, args) for name in args.layouts]
    report = {
        "bundle": str(args.bundle),
        "users": args.users,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "layouts": layouts,
        "same_in_both_layouts": len({tuple(r["answers"]) for r in layouts}) == 1,
    }
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        args.json.with_suffix(".txt").write_text(table(report) + "\n")


if __name__ == "__main__":
    main()
