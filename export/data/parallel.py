"""A user's parallel corpus: plain-text source and target files (one sentence a line) and, optionally,
gold word alignments in Pharaoh format, read and checked line by line.

The config's `[corpus]` table names the files; each split (`[corpus.train]`, `[corpus.dev]`,
`[corpus.test]`) either names its own files or takes `[corpus]`'s, and may keep only some lines:

    [corpus]
    source = "data/all.de"
    target = "data/all.en"
    alignments = "data/all.pharaoh"     # optional: `i-j` links, 0-based over whitespace words

    [corpus.train]
    lines = "1-9000"                    # 1-based, inclusive; "1-100, 201-300" for several ranges
    [corpus.dev]
    lines = "9001-9500"
    [corpus.test]
    source = "data/test.de"             # a split's own files
    target = "data/test.en"

A bad corpus stops with a CorpusError naming the file and the 1-based line: files of different
lengths, a sentence on one side and an empty line on the other, text that is not UTF-8, a malformed
Pharaoh link or one outside its sentence. Nothing is dropped silently: lines empty on both sides are
skipped and counted, and an empty alignment line (or no alignment file) leaves its pair unguided,
counted too (`SplitReport`). Sentences are normalized to their whitespace words joined by single
spaces, the words Pharaoh indices count and word-level alignments are reported over.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from export.data.gold import GoldLinks

SPLITS = ("train", "dev", "test")
FILE_KEYS = ("source", "target", "alignments")
_LINK = re.compile(r"(\d+)[-p](\d+)")  # "3-4" (sure) or "3p4" (possible, as in Moses' files)
_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")

Link = tuple[int, int]  # (source word, target word), 0-based


class CorpusError(ValueError):
    """A corpus file that cannot be used as given; the message names the file and line."""


@dataclass(frozen=True)
class SplitSpec:
    """Where one split's pairs come from: the files, and which of their lines (None = all)."""

    name: str
    source: Path
    target: Path
    alignments: Path | None = None
    lines: tuple[tuple[int, int], ...] | None = None  # 1-based inclusive (first, last) ranges

    def keeps(self, lineno: int) -> bool:
        return self.lines is None or any(a <= lineno <= b for a, b in self.lines)


@dataclass(frozen=True)
class CorpusConfig:
    """The `[corpus]` table: one SplitSpec per split (train required, dev and test optional)."""

    splits: dict[str, SplitSpec] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "[corpus]") -> CorpusConfig:
        unknown = sorted(set(raw) - {*FILE_KEYS, *SPLITS})
        if unknown:
            raise CorpusError(
                f"{where}: unknown keys {unknown} (expected {FILE_KEYS} and tables {SPLITS})"
            )
        shared = {k: raw[k] for k in FILE_KEYS if k in raw}
        splits: dict[str, SplitSpec] = {}
        for name in SPLITS:
            if name in raw:
                splits[name] = _split_spec(name, {**shared, **raw[name]}, f"{where}.{name}")
        if "train" not in splits:
            raise CorpusError(f"{where}: no [corpus.train] table: name the training split")
        return cls(splits=splits)


def _split_spec(name: str, values: Mapping[str, Any], where: str) -> SplitSpec:
    unknown = sorted(set(values) - {*FILE_KEYS, "lines"})
    if unknown:
        raise CorpusError(f"{where}: unknown keys {unknown} (expected {(*FILE_KEYS, 'lines')})")
    for key in ("source", "target"):
        if not values.get(key):
            raise CorpusError(f"{where}: no {key} file (set it here or in [corpus])")
    lines = values.get("lines")
    return SplitSpec(
        name=name,
        source=Path(values["source"]),
        target=Path(values["target"]),
        alignments=Path(values["alignments"]) if values.get("alignments") else None,
        lines=parse_line_ranges(lines, where) if lines is not None else None,
    )


def parse_line_ranges(text: str, where: str = "lines") -> tuple[tuple[int, int], ...]:
    """ "1-100, 201-300" or "7" → ((1, 100), (201, 300)) / ((7, 7)); 1-based, inclusive."""
    ranges: list[tuple[int, int]] = []
    for part in str(text).split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise CorpusError(f"{where}: lines {text!r}: expected ranges like '1-100, 201-300'")
        first, last = int(match[1]), int(match[2] or match[1])
        if first < 1 or last < first:
            raise CorpusError(
                f"{where}: lines {text!r}: range {first}-{last} must be 1-based with first <= last"
            )
        ranges.append((first, last))
    return tuple(ranges)


@dataclass(frozen=True)
class SplitReport:
    """What reading one split kept and left out, for the training log."""

    name: str
    pairs: int  # pairs kept
    blank_skipped: int  # lines empty on both sides (and without links), skipped
    guided: int  # pairs with gold links
    unguided: int  # pairs without (an empty alignment line, or no alignment file)

    def line(self) -> str:
        return (
            f"{self.name}: {self.pairs} pairs ({self.guided} with links, {self.unguided} "
            f"without); {self.blank_skipped} lines blank on both sides skipped"
        )


@dataclass(frozen=True)
class ParallelSplit:
    """One split's pairs (sentences normalized to single spaces) and per pair its gold links, or
    None where the pair has none."""

    pairs: list[tuple[str, str]]
    gold: list[list[Link] | None]
    report: SplitReport

    def gold_links(self) -> list[GoldLinks]:
        """The trainer's gold sidecar entries (export/data/gold.py); no links = an empty list."""
        return [
            GoldLinks(family="corpus", parts=1, phrases=[], words=list(links or []))
            for links in self.gold
        ]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file without their line ends ("\\n" or "\\r\\n"; a leading BOM
    dropped). CorpusError naming the line when the file is missing or not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CorpusError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        lineno = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise CorpusError(
            f"{path}:{lineno}: not UTF-8 (byte 0x{data[err.start]:02x} at byte {column} of the "
            "line): convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from err
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def parse_pharaoh(line: str, n_src: int, n_tgt: int, where: str) -> list[Link]:
    """`0-0 1-2 ...` → sorted unique links; CorpusError for a malformed token or a link outside
    a sentence of n_src source and n_tgt target words."""
    links: set[Link] = set()
    for token in line.split():
        match = _LINK.fullmatch(token)
        if not match:
            raise CorpusError(f"{where}: {token!r} is not a Pharaoh link like 3-4")
        s, t = int(match[1]), int(match[2])
        if s >= n_src or t >= n_tgt:
            raise CorpusError(
                f"{where}: link {token} is out of range: the source has {n_src} words "
                f"(0-{n_src - 1}) and the target {n_tgt} (0-{n_tgt - 1})"
            )
        links.add((s, t))
    return sorted(links)


def _check_lengths(files: Sequence[tuple[Path, list[str]]]) -> None:
    (first, first_lines), *others = files
    for path, lines in others:
        if len(lines) != len(first_lines):
            short = min(len(lines), len(first_lines)) + 1
            raise CorpusError(
                f"{first} has {len(first_lines)} lines but {path} has {len(lines)}: they must "
                f"pair line by line (the shorter one ends before line {short})"
            )


def load_split(spec: SplitSpec) -> ParallelSplit:
    """Read and check one split's files (see the module's docstring for what is an error)."""
    src_lines, tgt_lines = read_lines(spec.source), read_lines(spec.target)
    files = [(spec.source, src_lines), (spec.target, tgt_lines)]
    align_lines = read_lines(spec.alignments) if spec.alignments is not None else None
    if spec.alignments is not None and align_lines is not None:
        files.append((spec.alignments, align_lines))
    _check_lengths(files)
    last = max((b for _, b in spec.lines), default=0) if spec.lines is not None else 0
    if last > len(src_lines):
        raise CorpusError(
            f"[corpus.{spec.name}] lines go up to {last} but {spec.source} has "
            f"{len(src_lines)} lines"
        )
    pairs: list[tuple[str, str]] = []
    gold: list[list[Link] | None] = []
    blank = 0
    for i, (src, tgt) in enumerate(zip(src_lines, tgt_lines, strict=True)):
        lineno = i + 1
        if not spec.keeps(lineno):
            continue
        src_words, tgt_words = src.split(), tgt.split()
        links_text = align_lines[i] if align_lines is not None else ""
        if not src_words and not tgt_words and not links_text.strip():
            blank += 1
            continue
        for words, path, other in (
            (src_words, spec.source, spec.target),
            (tgt_words, spec.target, spec.source),
        ):
            if not words:
                raise CorpusError(
                    f"{path}:{lineno}: empty line, but line {lineno} of {other} is not: "
                    "every sentence needs its translation (remove the pair from both files)"
                )
        pairs.append((" ".join(src_words), " ".join(tgt_words)))
        if links_text.strip():
            where = f"{spec.alignments}:{lineno}"
            gold.append(parse_pharaoh(links_text, len(src_words), len(tgt_words), where))
        else:
            gold.append(None)
    if not pairs:
        raise CorpusError(f"[corpus.{spec.name}] holds no sentence pairs ({spec.source})")
    guided = sum(g is not None for g in gold)
    report = SplitReport(spec.name, len(pairs), blank, guided, len(pairs) - guided)
    return ParallelSplit(pairs=pairs, gold=gold, report=report)


def load_corpus(cfg: CorpusConfig) -> dict[str, ParallelSplit]:
    """Every split of the config, read and checked."""
    return {name: load_split(spec) for name, spec in cfg.splits.items()}
