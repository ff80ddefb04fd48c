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
import tempfile
from collections.abc import Sequence
from pathlib import Path

from export.data import g2p
from service.decode.config import RuntimeConfig
from service.decode.engine import Engine
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


def refused_entries(bundle: Path, path: Path) -> list[str]:
    """The entries of a memory file the bundle's model cannot use, as serving checks them at load
    (the input rule and the source limit, the target's length and spelling: Engine.read_memory),
    each named "file:line: why"."""
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    return list(engine.read_memory(path).refused)


def attach(bundle: Path, entries: list[tuple[str, str]], checked: Path | None = None) -> Path:
    """Write the entries as the bundle's memory and list it in the manifest; SystemExit naming
    every entry the model cannot use, and nothing written then: a bundle ships no bad entry.
    `checked`: the file the entries were read from (refusals name its lines); None: the entries
    are checked as written (lines counted among them)."""
    with tempfile.TemporaryDirectory() as tmp:
        written = Path(tmp) / NAME
        write_memory(written, entries)
        refused = refused_entries(bundle, checked or written)
    if refused:
        shown = refused[:20] + ([f"... and {len(refused) - 20} more"] if len(refused) > 20 else [])
        raise SystemExit(
            f"{len(refused)} entries the model cannot use; nothing written:\n" + "\n".join(shown)
        )
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
    path = attach(args.bundle, entries, args.entries)
    print(f"{path}: {len(entries)} entries, {len({s for s, _ in entries})} sources")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
