"""More English targets for the training verses, from SWORD Bible modules read with `diatheke`.

    apt-get install diatheke sword-text-web      # the World English Bible (engWEB2015eb)
    python -m export.data.sword --data data/grc-en --module engWEB2015eb --out data/grc-en-web

Writes a copy of export/data/bible.py's corpus (`--data`) whose training split has, after its own
lines, one more line per training verse and module: the same Greek, the module's English of that
verse, and an empty Pharaoh line (no gold links: the pair is trained without guided alignment).
Dev and test are copied unchanged, so the translation is still chosen and scored on the BSB alone.
The English is made like the BSB words of the corpus: the verse's text with its markup and footnote
markers removed, dashes as spaces, punctuation stripped from the ends of words (internal
apostrophes and hyphens kept). Only verses of the training split are read: books 58-66 and the
held-out verses never are. A verse the module lacks is skipped and counted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from export.data.bible import strip_punctuation

# SWORD's English names of books 40-57 (the corpus's books), by the corpus's book number.
BOOK_NAMES = {
    40: "Matthew", 41: "Mark", 42: "Luke", 43: "John", 44: "Acts", 45: "Romans",
    46: "1 Corinthians", 47: "2 Corinthians", 48: "Galatians", 49: "Ephesians",
    50: "Philippians", 51: "Colossians", 52: "1 Thessalonians", 53: "2 Thessalonians",
    54: "1 Timothy", 55: "2 Timothy", 56: "Titus", 57: "Philemon",
}  # fmt: skip
VERSE_HEAD = re.compile(r"^(?P<book>.+?) (?P<chapter>\d+):(?P<verse>\d+): ?(?P<text>.*)$")
MODULE_LINE = re.compile(r"^\([A-Za-z0-9_]+\)$")  # diatheke's closing "(engWEB2015eb)"
TAG = re.compile(r"<[^>]*>")
DASHES = re.compile("[\u2010-\u2015]")  # hyphen-like dashes between words: ‐ ‑ ‒ – — ―

# A book's text as diatheke prints it (OSIS markup, a verse per "Book C:V: " line).
Reader = Callable[[str, str], str]


class SwordError(RuntimeError):
    """diatheke is missing, or the module is not installed."""


def diatheke(module: str, book: str) -> str:
    """`diatheke -b MODULE -f OSIS -k BOOK`'s output."""
    if shutil.which("diatheke") is None:
        raise SwordError("diatheke is not installed: apt-get install diatheke sword-text-web")
    done = subprocess.run(
        ["diatheke", "-b", module, "-f", "OSIS", "-k", book],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not VERSE_HEAD.match(done.stdout.split("\n", 1)[0]):
        raise SwordError(
            f"diatheke has no {book} in module {module!r} (installed modules: "
            f"`diatheke -b system -k modulelist`): {done.stderr.strip() or done.stdout[:200]}"
        )
    return done.stdout


def parse_book(text: str) -> dict[tuple[int, int], str]:
    """(chapter, verse) → the verse's raw text; a verse's further lines (poetry) joined to it."""
    verses: dict[tuple[int, int], list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head = VERSE_HEAD.match(line)
        if head:
            current = verses.setdefault((int(head["chapter"]), int(head["verse"])), [])
            current.append(head["text"])
        elif current is not None and not MODULE_LINE.match(line.strip()):
            current.append(line)
    return {key: " ".join(parts) for key, parts in verses.items()}


def words_of(raw: str) -> str:
    """A verse's markup → its words as the corpus writes the BSB's: tags out (a tag separates
    words: the modules write `<w>Christ</w><w>Jesus</w>`), dashes as spaces, punctuation stripped
    from the ends of words, single spaces."""
    return strip_punctuation(DASHES.sub(" ", TAG.sub(" ", raw)))


def verse_key(verse: str) -> tuple[int, int, int]:
    """BBCCCVVV → (book, chapter, verse)."""
    return int(verse[:2]), int(verse[2:5]), int(verse[5:8])


def extra_targets(
    verses: Sequence[str], module: str, read: Reader = diatheke
) -> tuple[list[str | None], int]:
    """The module's English words of each verse (None where it has none), and how many it lacks."""
    books: dict[int, dict[tuple[int, int], str]] = {}
    out: list[str | None] = []
    for verse in verses:
        book, chapter, number = verse_key(verse)
        if book not in BOOK_NAMES:
            raise ValueError(f"verse {verse}: book {book} is not one of the corpus's books 40-57")
        if book not in books:
            books[book] = parse_book(read(module, BOOK_NAMES[book]))
        raw = books[book].get((chapter, number))
        text = words_of(raw) if raw else ""
        out.append(text or None)
    return out, sum(1 for t in out if t is None)


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def write_lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def write_corpus(data: Path, out: Path, modules: Sequence[str], read: Reader = diatheke) -> str:
    """out/: data's corpus with every module's English of each training verse added to train;
    returns a summary line."""
    columns = {ext: read_lines(data / f"train.{ext}") for ext in ("grc", "en", "pharaoh", "verses")}
    if len({len(lines) for lines in columns.values()}) != 1:
        raise ValueError(f"{data}: train.grc, .en, .pharaoh and .verses differ in line count")
    added: dict[str, list[str]] = {ext: [] for ext in columns}
    missing = {}
    for module in modules:
        targets, missing[module] = extra_targets(columns["verses"], module, read)
        for i, target in enumerate(targets):
            if target is not None:
                added["grc"].append(columns["grc"][i])
                added["en"].append(target)
                added["pharaoh"].append("")  # no gold links: unguided
                added["verses"].append(columns["verses"][i])
    out.mkdir(parents=True, exist_ok=True)
    for ext, lines in columns.items():
        write_lines(out / f"train.{ext}", lines + added[ext])
    for split in ("dev", "test"):
        for ext in ("grc", "en", "pharaoh", "verses"):
            shutil.copyfile(data / f"{split}.{ext}", out / f"{split}.{ext}")
    lacking = ", ".join(f"{m} lacks {n}" for m, n in missing.items())
    return (
        f"train: {len(columns['grc'])} BSB pairs + {len(added['grc'])} from {', '.join(modules)} "
        f"({lacking}); dev and test copied"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="export/data/bible.py's --out")
    parser.add_argument("--module", action="append", required=True, help="a SWORD module name")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        print(write_corpus(args.data, args.out, args.module))
    except SwordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
