"""Give a bundle a memory (docs/memory.md): a source<TAB>target file listed and hashed in its
manifest, consulted before the model. Every entry is checked against the bundle's model first, as
serving checks it at load (Engine.read_memory); one the model cannot use refuses the command,
named by file and line, and nothing is written.

    python -m export.memory --bundle DIR --entries my-entries.tsv     # any model
    python -m export.memory --bundle models/g2p --g2p-dictionary      # CMUdict, every word

The G2P memory is the whole of CMUdict (the release its training used, every word in the model's
alphabet): every dictionary word is answered from the dictionary, with its variant pronunciations
as the n-best in CMUdict's order, and the model answers the words CMUdict does not have. The
model's held-out words (dev and test) are in it too, so the model's own figures on them are
measured with the memory off (`use_memory = false`; s2s-evaluate and benchmarks.quality.g2p_common's
"model alone" never consult it).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from export.data import g2p
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.model.bundle import add_files
from service.model.memory import write_memory

NAME = "memory.tsv.gz"


def g2p_memory() -> list[tuple[str, str]]:
    """Every CMUdict word in the model's alphabet with each of its pronunciations (variants in
    CMUdict's order), words sorted."""
    pronunciations = g2p.load_cmudict()
    return [(w, " ".join(p)) for w in sorted(pronunciations) for p in pronunciations[w]]


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
    (the input rule and the source limit, the target's length and control characters:
    Engine.read_memory), each named "file:line: why"."""
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
        "--g2p-dictionary", action="store_true", help="CMUdict, every word (the G2P model's)"
    )
    args = p.parse_args(argv)
    entries = read_entries(args.entries) if args.entries is not None else g2p_memory()
    path = attach(args.bundle, entries, args.entries)
    print(f"{path}: {len(entries)} entries, {len({s for s, _ in entries})} sources")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
