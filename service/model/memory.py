"""A model's memory: sources whose targets are known (a translation memory, a pronunciation
dictionary, a user's own entries), consulted before the model (docs/memory.md).

A memory file is UTF-8 text, one entry per line: the source, a tab, the target. Blank lines and
lines starting with "#" are skipped; a source on several lines has several targets, in the file's
order (the n-best, as CMUdict's variant pronunciations). `.gz` files are read through gzip. Sources
are matched exactly after the model's own input rule (`normalize`: what `Translate` applies to a
text), so a file is read once the engine that normalizes is known. A line that does not parse (no
tab, an empty side, not UTF-8) refuses the whole file, naming it and the line: it is not a memory
file. An entry the model cannot use (the rule refuses its source, `check` refuses the pair: a side
over the model's limits, a target with control characters) is refused alone, named by file and
line in `Memory.refused`, and the rest of the file is kept: no valid request may fail because of an
entry. A target the model's vocabulary cannot spell is kept: it is served as written.

Two memories merge by source: a later one's targets replace an earlier one's (the server's file over
the bundle's).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from service.model.bundle import BundleError

Normalize = Callable[[str], str]  # a source as the model reads it; raises ValueError to refuse it
# (source, target) → None; raises ValueError for an entry the model cannot use
Check = Callable[[str, str], None]


class MemoryFileError(BundleError):
    """A memory file that cannot be used, with the file and line that say why."""


@dataclass(frozen=True)
class Memory:
    """source (normalized) → its targets, best first."""

    entries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # the files it was read from
    refused: tuple[str, ...] = ()  # "file:line: why" of each entry left out

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, normalized: str) -> tuple[str, ...]:
        """The targets of a normalized source; () when the memory has none."""
        return self.entries.get(normalized, ())

    def over(self, base: Memory) -> Memory:
        """This memory's entries over `base`'s: a source here replaces its targets there."""
        if not base.entries and not base.refused:
            return self
        return Memory(
            {**base.entries, **self.entries},
            base.sources + self.sources,
            base.refused + self.refused,
        )


EMPTY = Memory()


def lines(
    path: Path, error: type[MemoryFileError] = MemoryFileError, kind: str = "memory file"
) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 file (gzip-compressed when it ends in .gz); `error` (naming
    the file and line) where it cannot be read (a glossary file is read the same way)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except OSError as err:
        raise error(f"{path}: cannot read the {kind}: {err}") from err
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:
            yield number, line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as err:
            raise error(f"{path}:{number}: not UTF-8 ({err.reason})") from err


def read_memory(path: Path, normalize: Normalize, check: Check) -> Memory:
    """A memory file's entries, sources normalized. `check(source, target)` raises ValueError for an
    entry the model cannot use: it is left out and listed in `refused` with its file and line. A
    line that does not parse raises MemoryFileError naming the file and line."""
    entries: dict[str, list[str]] = {}
    refused: list[str] = []
    for number, line in lines(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        source, tab, target = line.partition("\t")
        if not tab:
            raise MemoryFileError(
                f"{path}:{number}: no tab between source and target: {line[:60]!r}"
            )
        if not source.strip() or not target.strip():
            side = "source" if not source.strip() else "target"
            raise MemoryFileError(f"{path}:{number}: the {side} is empty")
        try:
            key = normalize(source).strip()
            check(source, target.strip())
        except ValueError as err:
            refused.append(f"{path}:{number}: {err}")
            continue
        entries.setdefault(key, []).append(target.strip())
    return Memory({k: tuple(v) for k, v in entries.items()}, (str(path),), tuple(refused))


def write_memory(path: Path, pairs: list[tuple[str, str]]) -> None:
    """Entries as a memory file (gzip-compressed when the name ends in .gz), in the given order."""
    text = "".join(f"{s}\t{t}\n" for s, t in pairs).encode("utf-8")
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)
