"""The Greek New Testament → English corpus, with Biblica's manual word alignments.

Reads the data files of the PyPI package `bible-alignments` 0.4.2 (installed with `--no-deps`:
only its data is used): the SBL Greek New Testament (CC-BY-4.0), the Berean Standard Bible (public
domain) and Biblica's manual SBLGNT–BSB alignments (CC-BY-4.0). A verse is one sentence pair:

- source: the verse's SBLGNT words, in id order, joined by single spaces;
- target: the verse's BSB words without the `exclude` rows (punctuation), joined by single spaces;
- gold: every (Greek word, English word) pair of every alignment record, as Pharaoh `i-j` indices
  over those words (0-based, source-target, sorted).

An English word belongs to the Greek verse named by its `source_verse` column (it differs from its
own id for Acts 19:41, which the BSB splits off Acts 19:40). Verses with words on one side only
(versification differences: Rom 16:24-27, 2 Cor 13:14) and links between words of different verses
are dropped and counted. Books 58-66 (Hebrews to Revelation) are reserved for an outside check:
they are dropped at read time and never written or reported.

Splits: test = John (book 43); dev = the middle chapter, (chapters + 1) // 2, of every other book
40-57 that has more than one chapter (Matthew 14, Mark 8, Luke 12, Acts 14, Romans 8, ...);
train = the rest of books 40-57. Verses without gold links (no alignment record, or only links to
another verse) stay in train with an empty Pharaoh line; they are left out of dev and test.

    python -m export.data.bible --out data/grc-en
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "bible-alignments"
PIP_COMMAND = "pip install --no-deps bible-alignments==0.4.2"
SOURCE_FILE = "data/sources/SBLGNT.tsv"
TARGET_FILE = "data/eng/targets/BSB/nt_BSB.tsv"
ALIGNMENT_FILE = "data/eng/alignments/BSB/SBLGNT-BSB-manual.json"

FIRST_BOOK = 40  # Matthew
LAST_BOOK = 57  # Philemon; 58-66 (Hebrews-Revelation) are reserved
TEST_BOOK = 43  # John
SPLITS = ("train", "dev", "test")


class BibleDataError(RuntimeError):
    """The package's data files are missing or not in the expected format."""


@dataclass(frozen=True)
class VersePair:
    verse: str  # BBCCCVVV
    source: tuple[str, ...]  # SBLGNT words
    target: tuple[str, ...]  # BSB words, `exclude` rows left out
    links: tuple[tuple[int, int], ...] | None  # (source word, target word); None: no gold

    @property
    def book(self) -> int:
        return int(self.verse[:2])

    @property
    def chapter(self) -> int:
        return int(self.verse[2:5])


@dataclass
class ReadCounts:
    """What reading dropped, so that nothing is dropped silently."""

    one_sided_verses: list[str] = field(default_factory=list)  # words on one side only
    cross_verse_links: int = 0  # links between words of two different verses
    excluded_target_words: int = 0  # `exclude` rows (punctuation) of books 40-57


@dataclass(frozen=True)
class _TargetWord:
    id: str  # BBCCCVVVWWW
    verse: str  # the Greek verse it belongs to (`source_verse`)
    text: str


def data_file(relative: str) -> Path:
    """The path of one of the package's data files, or an error that says how to install it."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise BibleDataError(
            f"the {DISTRIBUTION} package is not installed; install its data with: {PIP_COMMAND}"
        ) from None
    path = Path(str(dist.locate_file(relative)))
    if not path.is_file():
        raise BibleDataError(
            f"{path} not found in the installed {DISTRIBUTION} {dist.version}; "
            f"reinstall it with: {PIP_COMMAND}"
        )
    return path


def _book_kept(verse: str) -> bool:
    return FIRST_BOOK <= int(verse[:2]) <= LAST_BOOK


def _tsv_rows(path: Path, columns: Sequence[str]) -> Iterator[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise BibleDataError(f"{path}: missing column(s) {', '.join(missing)}")
        yield from reader


def read_source(path: Path, counts: ReadCounts) -> dict[str, list[str]]:
    """Greek word ids (`nBBCCCVVVWWW`) per verse, in id order; books 40-57 only."""
    verses: dict[str, list[str]] = {}
    for row in _tsv_rows(path, ("id", "text")):
        verse = row["id"][1:9]
        if _book_kept(verse):
            verses.setdefault(verse, []).append(row["id"])
    return verses


def read_target(path: Path, counts: ReadCounts) -> dict[str, list[_TargetWord]]:
    """English words per Greek verse (`source_verse`), `exclude` rows dropped; books 40-57."""
    verses: dict[str, list[_TargetWord]] = {}
    for row in _tsv_rows(path, ("id", "source_verse", "text", "exclude")):
        verse = row["source_verse"] or row["id"][:8]
        if not (_book_kept(verse) and _book_kept(row["id"][:8])):
            continue
        if row["exclude"]:
            counts.excluded_target_words += 1
            continue
        verses.setdefault(verse, []).append(_TargetWord(row["id"], verse, row["text"]))
    return verses


def read_records(path: Path) -> list[tuple[list[str], list[str]]]:
    """(Greek ids, English ids) of every alignment record, all books (filtered by the caller)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    try:
        return [(list(r["source"]), list(r["target"])) for r in data["records"]]
    except (KeyError, TypeError) as e:
        raise BibleDataError(f"{path}: not a Scripture Burrito alignment file ({e})") from None


def _source_texts(path: Path) -> dict[str, str]:
    return {
        row["id"]: row["text"]
        for row in _tsv_rows(path, ("id", "text"))
        if _book_kept(row["id"][1:9])
    }


def build_pairs(
    source_path: Path, target_path: Path, alignment_path: Path
) -> tuple[list[VersePair], ReadCounts]:
    """Every verse of books 40-57 with words on both sides, in canonical order."""
    counts = ReadCounts()
    source_ids = read_source(source_path, counts)
    texts = _source_texts(source_path)
    target_words = read_target(target_path, counts)
    # word id → (verse, index within the verse's kept words)
    src_pos = {w: (v, i) for v, ws in source_ids.items() for i, w in enumerate(ws)}
    tgt_pos = {w.id: (v, i) for v, ws in target_words.items() for i, w in enumerate(ws)}
    links: dict[str, set[tuple[int, int]]] = {}
    for src, tgt in read_records(alignment_path):
        for s in src:
            if s not in src_pos:
                continue  # a reserved book
            s_verse, i = src_pos[s]
            links.setdefault(s_verse, set())
            for t in tgt:
                if t not in tgt_pos:
                    continue  # an `exclude` row or a reserved book
                t_verse, j = tgt_pos[t]
                if t_verse != s_verse:
                    counts.cross_verse_links += 1
                    continue
                links[s_verse].add((i, j))
    pairs: list[VersePair] = []
    for verse in sorted(set(source_ids) | set(target_words)):
        if verse not in source_ids or verse not in target_words:
            counts.one_sided_verses.append(verse)
            continue
        verse_links = links.get(verse)
        pairs.append(
            VersePair(
                verse=verse,
                source=tuple(texts[w] for w in source_ids[verse]),
                target=tuple(w.text for w in target_words[verse]),
                links=tuple(sorted(verse_links)) if verse_links else None,
            )
        )
    return pairs, counts


def load_pairs() -> tuple[list[VersePair], ReadCounts]:
    """The verse pairs of books 40-57 from the installed package."""
    return build_pairs(data_file(SOURCE_FILE), data_file(TARGET_FILE), data_file(ALIGNMENT_FILE))


def dev_chapters(pairs: Iterable[VersePair]) -> set[tuple[int, int]]:
    """(book, chapter) of the dev split: the middle chapter of each multi-chapter book but John."""
    chapters: dict[int, int] = {}
    for p in pairs:
        chapters[p.book] = max(chapters.get(p.book, 0), p.chapter)
    return {(book, (n + 1) // 2) for book, n in chapters.items() if book != TEST_BOOK and n > 1}


def split_pairs(pairs: Sequence[VersePair]) -> tuple[dict[str, list[VersePair]], int]:
    """The three splits, and how many dev/test verses were left out for having no gold links."""
    dev = dev_chapters(pairs)
    splits: dict[str, list[VersePair]] = {name: [] for name in SPLITS}
    no_gold_held_out = 0
    for p in pairs:
        if p.book == TEST_BOOK:
            name = "test"
        elif (p.book, p.chapter) in dev:
            name = "dev"
        else:
            name = "train"
        if name != "train" and p.links is None:
            no_gold_held_out += 1
            continue
        splits[name].append(p)
    return splits, no_gold_held_out


def strip_punctuation(text: str) -> str:
    """Punctuation off the ends of every word, words left empty dropped: what the BSB words without
    their `exclude` rows look like (`God’s` and `mother-in-law` keep theirs). The scores compare a
    model's output with them this way; export/data/sword.py makes other translations' words so."""
    words = (w.strip("".join(_punctuation_in(w))) for w in text.split())
    return " ".join(w for w in words if w)


def _punctuation_in(word: str) -> set[str]:
    return {c for c in word if unicodedata.category(c).startswith("P")}


def pharaoh(links: Iterable[tuple[int, int]] | None) -> str:
    """`i-j i-j ...`; an empty string for no links."""
    return " ".join(f"{i}-{j}" for i, j in links or ())


def write_split(out: Path, name: str, pairs: Sequence[VersePair], links: bool = True) -> None:
    """`<name>.grc`, `<name>.en`, `<name>.pharaoh` and `<name>.verses`, one verse a line; without
    `links`, no `<name>.pharaoh` (the text alone, for runs that must not see gold links)."""
    columns = {
        "grc": [" ".join(p.source) for p in pairs],
        "en": [" ".join(p.target) for p in pairs],
        "pharaoh": [pharaoh(p.links) for p in pairs],
        "verses": [p.verse for p in pairs],
    }
    if not links:
        del columns["pharaoh"]
    for ext, lines in columns.items():
        with open(out / f"{name}.{ext}", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)


def summary(name: str, pairs: Sequence[VersePair]) -> str:
    words_src = sum(len(p.source) for p in pairs)
    words_tgt = sum(len(p.target) for p in pairs)
    n_links = sum(len(p.links or ()) for p in pairs)
    no_gold = sum(1 for p in pairs if p.links is None)
    return (
        f"{name:5s} {len(pairs):5d} verses  {words_src:6d} grc words  {words_tgt:6d} en words  "
        f"{n_links:6d} links  ({no_gold} verses without gold links: empty Pharaoh line)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the SBLGNT→BSB verse pairs of books 40-57 with Biblica's manual "
        "alignments: {train,dev,test}.{grc,en,pharaoh,verses} (test = John)."
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--no-links",
        action="store_true",
        help="write the text only, no .pharaoh files (the same splits; for the silver run, "
        "configs/grc-en-nt-silver.toml, which must read no gold link)",
    )
    args = parser.parse_args(argv)
    try:
        pairs, counts = load_pairs()
    except BibleDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    splits, no_gold_held_out = split_pairs(pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        write_split(args.out, name, splits[name], links=not args.no_links)
        print(summary(name, splits[name]))
    print(
        f"dropped: {len(counts.one_sided_verses)} verses with words on one side only "
        f"({', '.join(counts.one_sided_verses)}), {counts.cross_verse_links} links across verses, "
        f"{no_gold_held_out} dev/test verses without gold links, "
        f"{counts.excluded_target_words} `exclude` English rows (punctuation); "
        f"books 58-66 reserved, not read"
    )
    kinds = "grc,en,verses" if args.no_links else "grc,en,pharaoh,verses"
    print(f"wrote {args.out}/{{{','.join(SPLITS)}}}.{{{kinds}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
