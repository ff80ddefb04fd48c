"""Give a bundle a memory (docs/memory.md): a source<TAB>target file listed and hashed in its
manifest, consulted before the model.

    python -m export.memory --bundle DIR --entries my-entries.tsv     # any model
    python -m export.memory --bundle models/g2p --g2p-train-split 1   # CMUdict's training words

The G2P memory is CMUdict (the release its training used) restricted to the words of the model's
training split (export/data/g2p.py, seed 1): every dictionary word the model was trained on is
answered from the dictionary, every variant pronunciation as the n-best in CMUdict's order, and the
held-out words (dev and test) stay the model's, so its held-out WER/PER do not change. The command
checks that no held-out word is in the memory it writes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from export.data import g2p
from service.model.bundle import add_files
from service.model.memory import write_memory

NAME = "memory.tsv.gz"


def g2p_memory(seed: int) -> tuple[list[tuple[str, str]], set[str]]:
    """The training split's (word, pronunciation) entries, variants in CMUdict's order, and the
    held-out words."""
    split = g2p.split_words(g2p.load_cmudict(), seed)
    held_out = set(split.dev) | set(split.test)
    entries = split.pairs("train")
    return sorted(entries, key=lambda e: e[0]), held_out


def read_entries(path: Path) -> list[tuple[str, str]]:
    """source<TAB>target lines (blank and # lines skipped); SystemExit naming a bad line."""
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        source, tab, target = line.partition("\t")
        if not tab or not source.strip() or not target.strip():
            raise SystemExit(f"{path}:{number}: not 'source<TAB>target': {line[:60]!r}")
        entries.append((source.strip(), target.strip()))
    return entries


def attach(bundle: Path, entries: list[tuple[str, str]]) -> Path:
    """Write the entries as the bundle's memory and list it in the manifest."""
    path = bundle / NAME
    write_memory(path, entries)
    add_files(bundle, [NAME], info={"memory_entries": len(entries)}, sections={"memory": NAME})
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--entries", type=Path, help="a source<TAB>target file")
    source.add_argument(
        "--g2p-train-split", type=int, metavar="SEED", help="CMUdict's training words"
    )
    args = p.parse_args(argv)
    if args.entries is not None:
        entries = read_entries(args.entries)
    else:
        entries, held_out = g2p_memory(args.g2p_train_split)
        leaked = held_out & {word for word, _ in entries}
        if leaked:
            raise SystemExit(f"{len(leaked)} held-out words would be in the memory")
        print(f"{len(held_out)} held-out words, none in the memory")
    path = attach(args.bundle, entries)
    print(f"{path}: {len(entries)} entries, {len({s for s, _ in entries})} sources")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
