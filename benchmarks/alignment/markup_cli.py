"""Translate with markup as a user runs it: `s2s-translate --markup xml` against the same lines
untagged, with the bundle's link head and another head beside it, in one run.

    python -m benchmarks.alignment.markup_cli --bundle models/grc-en-nt \
        --baseline git:2328693:models/grc-en-nt/link_head.onnx \
        --json docs/benchmarks/markup-cli-john.json

The first `--verses` verses of the split (John) get one pair of tags each, `<b>` around 1-3 words
drawn with `--seed`; the tagged file goes through `s2s-translate --markup xml --verbose --threads 2
--batch-size 64` (`python -m service.cli.translate`, the command's own module, in a fresh process)
and the same verses without tags through `s2s-translate --verbose --threads 2 --batch-size 64`.
The figure is the decode seconds `--verbose` reports (model loading left out), best of
`--rounds` interleaved rounds; the cost is tagged / untagged. The answers are checked: every
tagged answer well-formed, with its tag, and its text without the tag the untagged answer.
`--baseline` is a head graph for the same bundle (a path or `git:REV:PATH`), run from a temporary
copy of the bundle (benchmarks/alignment/link_head.py's `with_head`).
"""

from __future__ import annotations

import argparse
import html
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.alignment.align_modes import read_split
from benchmarks.alignment.link_head import read_graph, report, with_head
from service.model import markup

FLAGS = ("--verbose", "--threads", "2", "--batch-size", "64")
DECODE_SECONDS = re.compile(r"in ([0-9.]+) s of decoding")


def one_tag(source: str, rng: random.Random) -> str:
    """The verse with `<b>…</b>` around 1-3 of its words (XML: other text escaped)."""
    words = [html.escape(w, quote=False) for w in source.split()]
    size = rng.randint(1, min(3, len(words)))
    first = rng.randrange(len(words) - size + 1)
    words[first] = "<b>" + words[first]
    words[first + size - 1] += "</b>"
    return " ".join(words)


def run_cli(bundle: Path, lines: Path, tagged: bool) -> tuple[float, list[str]]:
    """s2s-translate over a file: (decode seconds from --verbose, the answers)."""
    command = [sys.executable, "-m", "service.cli.translate", "--bundle", str(bundle), *FLAGS]
    if tagged:
        command += ["--markup", "xml"]
    with lines.open("rb") as stdin:
        done = subprocess.run(command, stdin=stdin, capture_output=True, check=True)
    found = DECODE_SECONDS.search(done.stderr.decode())
    if found is None:
        raise RuntimeError(f"no decode time in s2s-translate's stderr: {done.stderr.decode()}")
    return float(found.group(1)), done.stdout.decode("utf-8").splitlines()


def checked(answers: list[str], untagged: list[str]) -> dict[str, float]:
    """The shares of tagged answers well-formed with their one tag, and equal to the untagged
    answer once the tag is taken out."""
    formed = same = 0
    for answer, plain in zip(answers, untagged, strict=True):
        try:
            back = markup.parse(answer, "xml", (markup.NO_PROTECT,))
        except markup.MarkupError:
            continue
        formed += answer.count("<b>") == answer.count("</b>") == 1
        same += back.plain == plain
    return {"well_formed": formed / len(answers), "plain_identical": same / len(answers)}


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    pairs, _ = read_split(args.data, args.split, "grc", "en")
    rng = random.Random(args.seed)
    sources = [one_tag(s, rng) for s, _ in pairs[: args.verses]]
    tagged, plain = folder / "tagged.xml", folder / "plain.txt"
    tagged.write_text("\n".join(sources) + "\n", encoding="utf-8")
    plain.write_text(
        "\n".join(markup.parse(s, "xml").plain for s in sources) + "\n", encoding="utf-8"
    )
    baseline = with_head(
        args.bundle, read_graph(args.baseline, folder / "baseline.onnx"), folder / "baseline"
    )
    heads = {"bundle": args.bundle, "baseline": baseline}
    seconds: dict[str, list[float]] = {"untagged": [], **{name: [] for name in heads}}
    answers: dict[str, list[str]] = {}
    for _ in range(args.rounds):  # interleaved: every run sees the same machine
        took, answers["untagged"] = run_cli(args.bundle, plain, tagged=False)
        seconds["untagged"].append(took)
        for name, bundle in heads.items():
            took, answers[name] = run_cli(bundle, tagged, tagged=True)
            seconds[name].append(took)
    untagged_s = min(seconds["untagged"])
    return {
        "split": args.split,
        "verses": len(sources),
        "flags": " ".join(FLAGS),
        "rounds": args.rounds,
        "untagged_seconds": untagged_s,
        "heads": {
            name: {
                "graph": str(args.bundle / "link_head.onnx") if name == "bundle" else args.baseline,
                "tagged_seconds": min(seconds[name]),
                "cost": round(min(seconds[name]) / untagged_s, 3),
                **checked(answers[name], answers["untagged"]),
            }
            for name in heads
        },
        "seconds": seconds,
    }


def table(r: dict[str, Any]) -> str:
    lines = [
        f"s2s-translate {r['flags']} on {r['verses']} verses of {r['split']}, one <b> each, "
        f"best of {r['rounds']} interleaved rounds: untagged {r['untagged_seconds']:.2f} s",
        "",
        "| head | --markup xml s | cost | well-formed, one tag | text = untagged |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, h in r["heads"].items():
        lines.append(
            f"| {name}: {h['graph']} | {h['tagged_seconds']:.2f} | {h['cost']:.2f}× | "
            f"{h['well_formed']:.1%} | {h['plain_identical']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.alignment.markup_cli", description=__doc__
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument(
        "--baseline",
        default="git:2328693:models/grc-en-nt/link_head.onnx",
        help="the head to compare with: a graph's path or git:REV:PATH (default: %(default)s)",
    )
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--split", default="test", help="whose verses (default: John)")
    p.add_argument("--verses", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the figures here, and the table beside it")
    return report(p.parse_args(argv), measure, table)


if __name__ == "__main__":
    raise SystemExit(main())
