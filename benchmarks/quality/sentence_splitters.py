"""Sentence splitters side by side on real sentence boundaries: boundary precision, recall, F1, speed.

    pip install pysbd==0.3.4 syntok==1.4.4 blingfire==0.1.8 sentencex==1.0.32 \\
        sentence-splitter==1.4 py-sblgnt==0.10
    python -m benchmarks.quality.sentence_splitters --ud data/ud \\
        --json docs/benchmarks/sentence-splitters.json

Sources (training and dev data only: no test split and no reserved book is read):
- en-bible: the Berean Standard Bible's verses (export/data/bible.py's package, bible-alignments),
  books 40-57 without John (the test book) and without 58-66 (reserved);
- grc-bible: the same books of the SBL Greek New Testament with its punctuation (MorphGNT's `text`
  column, pip package py-sblgnt 0.10), its apparatus signs (⸀ ⸂ ⸃ ...) removed;
- {en,fr,de,grc}-ud: the `# text` lines of Universal Dependencies dev files in --ud (their
  annotators' sentences): en_ewt, fr_gsd, de_gsd, grc_perseus *-ud-dev.conllu (never *-test).

A verse is not always a sentence, so a verse is kept as one only where it is one by its punctuation:
it ends with a sentence-final mark (then closing quotes/brackets), has no other one inside, and
the verse before it ended one too (so it starts a sentence); English verses must also start with a
capital. The marks are . ! ? … and, in Greek, ; (its question mark); Greek '·' (ano teleia) is a
semicolon, no end. A UD sentence is kept where it ends with such a mark (a sentence without one
cannot be found by punctuation; Perseus ends 29% of its Greek sentences at '·', left out).

Documents: 20 consecutive kept sentences, joined by a single space; every fourth document is then
hard-wrapped at 72 columns (line breaks inside and between sentences). The gold boundaries are
where the 2nd..20th sentences start. Every splitter is given the document as it is; its sentences
are located in it by service.model.sentences.locate, so that every splitter is scored the same
way; a predicted boundary is right where a gold sentence starts. Speed: the splitter's own call and
the location, per document of the space-joined kind, after one warm-up document.

Splitters: "served" is service.model.sentences as serving calls it (sentencex for the languages it
has rules for, double quotes hidden from it, line breaks as spaces); "rule" is that module's plain
rule alone; then each library as it comes, on the document as it is.

Also counted, as a check of precision that the documents cannot give: the cuts each splitter makes
inside a verse where a quotation ends in ? ! , or . and a lower-case word follows ('“Get up!” he
said'), over every verse of the kept BSB books.

Prints a JSON report (per source and splitter: precision, recall and F1 on the space-joined and the
wrapped documents, microseconds per document and sentences per second).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.data.bible import FIRST_BOOK, LAST_BOOK, TARGET_FILE, TEST_BOOK, data_file
from service.model.sentences import locate, rule_starts, sentence_starts

Splitter = Callable[[str], list[int]]  # document -> where its 2nd, 3rd, ... sentences start

FINAL = ".!?…"
GREEK_FINAL = ".;\u037e"
CLOSERS = "\"'”’»›)]}"
APPARATUS = re.compile("[\u2e00-\u2e0f]")  # SBLGNT's text-critical signs
UD_FILES = {"en": "en_ewt", "fr": "fr_gsd", "de": "de_gsd", "grc": "grc_perseus"}
PIP_NAMES = {
    "pysbd": "pysbd==0.3.4",
    "syntok": "syntok==1.4.4",
    "blingfire": "blingfire==0.1.8",
    "sentencex": "sentencex==1.0.32",
    "sentence_splitter": "sentence-splitter==1.4",
}


@dataclass(frozen=True)
class Source:
    name: str  # "en-bible"
    language: str  # ISO 639 code as a manifest names it
    units: list[str]  # whole sentences, in the source's order
    read: int  # units read before keeping
    origin: str  # the package, or the file and its sha256


def ends_sentence(text: str, final: str) -> bool:
    core = text.rstrip().rstrip(CLOSERS)
    return bool(core) and core[-1] in final


def inner_final(text: str, final: str) -> bool:
    """Whether a final mark is followed by whitespace inside the text (a second sentence may be)."""
    marks = re.escape(final)
    return re.search(rf"[{marks}][{re.escape(CLOSERS)}]*\s+\S", text.strip()) is not None


def whole_verses(verses: Sequence[str], final: str, capital: bool) -> list[str]:
    """The verses that are one whole sentence by their punctuation (see the module's docstring)."""
    kept, previous_ended = [], True
    for verse in verses:
        head = verse.lstrip().lstrip("“‘\"'(")
        if (
            previous_ended
            and ends_sentence(verse, final)
            and not inner_final(verse, final)
            and (not capital or head[:1].isupper())
        ):
            kept.append(verse.strip())
        previous_ended = ends_sentence(verse, final)
    return kept


def kept_books(book: int) -> bool:
    return FIRST_BOOK <= book <= LAST_BOOK and book != TEST_BOOK


def bsb_verses() -> list[str]:
    """The BSB's verses of the kept books, their words joined as the package spaces them."""
    verses: dict[str, list[str]] = {}
    with open(data_file(TARGET_FILE), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if kept_books(int(row["id"][:2])):
                space = "" if row["skip_space_after"] == "y" else " "
                verses.setdefault(row["id"][:8], []).append(row["text"] + space)
    return ["".join(verses[v]) for v in sorted(verses)]


def sblgnt_verses() -> list[str]:
    """The SBLGNT's verses of the kept books, MorphGNT's words with their punctuation."""
    spec = importlib.util.find_spec("pysblgnt")
    if spec is None or spec.origin is None:
        raise SystemExit("grc-bible needs the py-sblgnt package: pip install py-sblgnt==0.10")
    folder = Path(spec.origin).parent / "sblgnt"
    verses: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*-morphgnt.txt")):
        book = int(path.name[:2]) - 60 + FIRST_BOOK - 1  # 61-Mt is Matthew, book 40
        if not kept_books(book):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            verses.setdefault(f"{book}{fields[0][2:]}", []).append(APPARATUS.sub("", fields[4]))
    return [" ".join(verses[v]) for v in sorted(verses)]


def ud_sentences(path: Path) -> list[str]:
    prefix = "# text = "
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line[len(prefix) :].strip() for line in lines if line.startswith(prefix)]


def sources(ud: Path | None, names: Sequence[str]) -> Iterator[Source]:
    for name in names:
        language, kind = name.split("-")
        final = GREEK_FINAL if language == "grc" else FINAL
        if kind == "bible":
            verses = sblgnt_verses() if language == "grc" else bsb_verses()
            units = whole_verses(verses, final, capital=language != "grc")
            origin = (
                "py-sblgnt (MorphGNT SBLGNT)" if language == "grc" else "bible-alignments (BSB)"
            )
            yield Source(name, language, units, len(verses), origin)
            continue
        path = ud / f"{UD_FILES[language]}-ud-dev.conllu" if ud else None
        if path is None or not path.is_file():
            print(f"# {name}: no {UD_FILES[language]}-ud-dev.conllu in --ud, left out", flush=True)
            continue
        sentences = ud_sentences(path)
        kept = [s for s in sentences if ends_sentence(s, final)]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        yield Source(name, language, kept, len(sentences), f"{path.name} {digest}")


@dataclass(frozen=True)
class Document:
    text: str
    starts: frozenset[int]  # where the 2nd, 3rd, ... sentences start
    wrapped: bool


def wrap(text: str, width: int) -> str:
    """Spaces turned into line breaks so that no line is longer than `width` where it can be."""
    chars, line_start, last_space = list(text), 0, -1
    for i, char in enumerate(chars):
        if char == " ":
            last_space = i
        if i - line_start >= width and last_space > line_start:
            chars[last_space] = "\n"
            line_start = last_space + 1
    return "".join(chars)


def documents(units: Sequence[str], size: int, limit: int) -> list[Document]:
    docs = []
    for n, first in enumerate(range(0, len(units) - size + 1, size)):
        if n == limit:
            break
        group = units[first : first + size]
        starts, at = [], 0
        for unit in group:
            starts.append(at)
            at += len(unit) + 1
        text = " ".join(group)
        wrapped = n % 4 == 3
        docs.append(Document(wrap(text, 72) if wrapped else text, frozenset(starts[1:]), wrapped))
    return docs


def library_splitters(language: str) -> dict[str, Splitter]:
    """What serving does (service.model.sentences.sentence_starts: sentencex as it is called
    there, line breaks as spaces), the plain rule alone, and each installed library as it comes
    (Greek as Modern Greek, "el", where a library asks for a language)."""
    code = "el" if language == "grc" else language
    found: dict[str, Splitter] = {
        "served": lambda text: sentence_starts(text, language),
        "rule": lambda text: rule_starts(text, language),
    }
    for name, make in MAKERS.items():
        if importlib.util.find_spec(name) is None:
            print(f"# {name} is not installed (pip install {PIP_NAMES[name]}): left out")
            continue
        splitter = make(code)
        if splitter is not None:
            found[name] = splitter
    return found


def _pysbd(code: str) -> Splitter | None:
    import pysbd

    if code not in pysbd.languages.LANGUAGE_CODES:
        return None
    segmenter = pysbd.Segmenter(language=code, clean=False)
    return lambda text: locate(text, segmenter.segment(text))


def _syntok(code: str) -> Splitter:
    from syntok import segmenter

    def split(text: str) -> list[int]:
        pieces = [
            "".join(t.spacing + t.value for t in sentence)
            for paragraph in segmenter.analyze(text)
            for sentence in paragraph
        ]
        return locate(text, pieces)

    return split


def _blingfire(code: str) -> Splitter:
    import blingfire

    return lambda text: locate(text, blingfire.text_to_sentences(text).split("\n"))


def _sentencex(code: str) -> Splitter:
    import sentencex

    return lambda text: locate(text, sentencex.segment(code, text))


def _sentence_splitter(code: str) -> Splitter | None:
    import sentence_splitter

    try:
        splitter = sentence_splitter.SentenceSplitter(language=code)
    except sentence_splitter.SentenceSplitterException:
        return None
    return lambda text: locate(text, splitter.split(text))


MAKERS: dict[str, Callable[[str], Splitter | None]] = {
    "pysbd": _pysbd,
    "syntok": _syntok,
    "blingfire": _blingfire,
    "sentencex": _sentencex,
    "sentence_splitter": _sentence_splitter,
}


def next_word(text: str, cut: int) -> int:
    """Where the sentence cut at `cut` starts: its first non-space character."""
    while cut < len(text) and text[cut].isspace():
        cut += 1
    return cut


def scores(splitter: Splitter, docs: Sequence[Document]) -> dict[str, float]:
    right = predicted = gold = 0
    for doc in docs:
        found = {next_word(doc.text, cut) for cut in splitter(doc.text)} - {0}
        right += len(found & doc.starts)
        predicted += len(found)
        gold += len(doc.starts)
    precision = right / predicted if predicted else 0.0
    recall = right / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if right else 0.0
    return {
        "precision": round(100 * precision, 1),
        "recall": round(100 * recall, 1),
        "f1": round(100 * f1, 1),
        "boundaries": gold,
    }


def speed(splitter: Splitter, docs: Sequence[Document]) -> dict[str, float]:
    splitter(docs[0].text)  # warm-up: imports, lazily built tables
    started = time.perf_counter()
    for doc in docs:
        splitter(doc.text)
    seconds = time.perf_counter() - started
    sentences = sum(len(d.starts) + 1 for d in docs)
    return {
        "us_per_document": round(1e6 * seconds / len(docs)),
        "sentences_per_s": round(sentences / seconds),
    }


def run(source: Source, size: int, limit: int) -> dict[str, Any]:
    docs = documents(source.units, size, limit)
    plain = [d for d in docs if not d.wrapped]
    wrapped = [d for d in docs if d.wrapped]
    rows: dict[str, Any] = {}
    for name, splitter in library_splitters(source.language).items():
        rows[name] = {
            "space": scores(splitter, plain),
            "wrapped": scores(splitter, wrapped),
            **speed(splitter, plain),
        }
        print(f"# {source.name:10} {name:18} {rows[name]}", flush=True)
    return {
        "language": source.language,
        "origin": source.origin,
        "units_read": source.read,
        "sentences_kept": len(source.units),
        "documents": {"space": len(plain), "wrapped": len(wrapped)},
        "splitters": rows,
    }


def dialogue_tags() -> dict[str, Any]:
    """Cuts where there is no sentence end: the BSB's (kept books') quotations that end in ? ! , or .
    inside the quote and go on with a lower-case word ('“Get up!” he said'), each verse alone."""
    tag = re.compile(r"[?!,.][”’]+ (?=[a-z])")
    places = [(v, m.end()) for v in bsb_verses() for m in tag.finditer(v)]
    cuts = {
        name: sum(1 for verse, at in places if at in splitter(verse))
        for name, splitter in library_splitters("en").items()
    }
    print(f"# dialogue tags: {len(places)}, cut by {cuts}", flush=True)
    return {"places": len(places), "cuts": cuts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ud", type=Path, help="folder of UD *-ud-dev.conllu files (optional)")
    p.add_argument(
        "--sources",
        default="en-bible,en-ud,fr-ud,de-ud,grc-bible,grc-ud",
        help="comma-separated: en-bible, grc-bible, {en,fr,de,grc}-ud",
    )
    p.add_argument("--size", type=int, default=20, help="sentences per document")
    p.add_argument("--documents", type=int, default=100, help="at most this many per source")
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    report: dict[str, Any] = {
        "sentences_per_document": args.size,
        "versions": versions(),
        "sources": {
            s.name: run(s, args.size, args.documents)
            for s in sources(args.ud, args.sources.split(","))
        },
        "dialogue_tags": dialogue_tags(),
    }
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


def versions() -> dict[str, str]:
    from importlib import metadata

    names = [n.split("==")[0] for n in PIP_NAMES.values()] + ["py-sblgnt", "bible-alignments"]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


if __name__ == "__main__":
    raise SystemExit(main())
