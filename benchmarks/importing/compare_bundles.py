"""Two bundles of one model side by side: the same outputs, and which decodes faster.

    OMP_NUM_THREADS=1 python -m benchmarks.importing.compare_bundles OLD_BUNDLE NEW_BUNDLE \
        --source /work/data/grc-en/test.grc --limit 160 --threads 1 --repeats 5

For a change to the exported graphs that must not change what they compute (an export
optimization, a re-import with a newer version): both bundles translate the first `--limit` lines
of `--source` at beam 5 in batches of 32, decode only, fp32 (benchmarks/importing/import_speed.py's
`ours`); the script first checks that every output is the same, then times the two in interleaved
rounds (import_speed's `time_systems`: a warm-up, medians) and prints sentences/s and the ratio.
Exit status 1 when an output differs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.importing.import_speed import ours, time_systems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", type=Path, help="the bundle to compare against")
    parser.add_argument("new", type=Path)
    parser.add_argument("--source", type=Path, required=True, help="one source sentence a line")
    parser.add_argument("--limit", type=int, default=160, help="the first N lines")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = args.source.read_text(encoding="utf-8").splitlines()[: args.limit]
    systems = {
        "old": ours(args.old, args.threads, int8=False),
        "new": ours(args.new, args.threads, int8=False),
    }
    outputs = {name: system(lines) for name, system in systems.items()}
    differing = sum(a != b for a, b in zip(outputs["old"], outputs["new"], strict=True))
    if differing:
        print(f"{differing}/{len(lines)} outputs differ: not the same computation")
        return 1
    speeds, _ = time_systems(systems, lines, args.repeats)
    print(
        json.dumps(
            {
                "lines": len(lines),
                "identical": f"{len(lines)}/{len(lines)}",
                "threads": args.threads,
                "repeats": args.repeats,
                "old_sent_per_s": speeds["old"],
                "new_sent_per_s": speeds["new"],
                "new_over_old": round(speeds["new"] / speeds["old"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
