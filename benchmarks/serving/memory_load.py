"""How long a memory of N entries takes to load and how much memory it holds (docs/memory.md).

Generates N distinct entries (a source of three to six words of letters, a target of as many), writes
them as a memory file, and reads it the way the server does (`Engine.read_memory`: each entry
checked against the model, its source through the input rule and its token limit, the pair's
sizes as the forced pass reads them, the target's spelling), timing it and measuring the
process's resident memory before and after; then times 100,000 lookups.

    python -m benchmarks.serving.memory_load --bundle models/g2p --entries 1000000 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import string
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.model.memory import write_memory


def rss_bytes() -> int:
    """The process's resident set size now (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def code(i: int) -> str:
    """i in base 26 letters: makes every source distinct."""
    out = ""
    while True:
        i, r = divmod(i, 26)
        out += string.ascii_lowercase[r]
        if i == 0:
            return out


def entries(n: int, one_word: bool, seed: int = 0) -> list[tuple[str, str]]:
    """n distinct (source, target) entries: sentences of 3-5 words, or single words."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8)))

    out = []
    for i in range(n):
        if one_word:
            out.append((word() + code(i), " ".join(rng.choices(["AH0", "K", "T", "IY1"], k=5))))
        else:
            words = [word() for _ in range(rng.randint(2, 4))] + [code(i)]
            out.append((" ".join(words), " ".join(word() for _ in words)))
    return out


def run(bundle: Path, n: int) -> dict[str, Any]:
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    rows = entries(n, one_word=engine.bundle.input_rule is not None)  # the G2P rule: a word
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.tsv"
        write_memory(path, rows)
        size = path.stat().st_size
        del rows
        before = rss_bytes()
        started = time.perf_counter()
        memory = engine.read_memory(path)
        seconds = time.perf_counter() - started
        after = rss_bytes()
    engine.user_memory = memory
    keys = list(memory.entries)[:100_000]
    started = time.perf_counter()
    found = sum(1 for k in keys if engine.recall(k))
    lookup_us = (time.perf_counter() - started) / max(len(keys), 1) * 1e6
    return {
        "bundle": str(bundle),
        "entries": len(memory),
        "file_bytes": size,
        "load_seconds": round(seconds, 2),
        "resident_bytes_added": after - before,
        "bytes_per_entry": round((after - before) / max(len(memory), 1), 1),
        "lookup_microseconds": round(lookup_us, 2),
        "lookups_found": found,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/g2p"))
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = run(args.bundle, args.entries)
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
