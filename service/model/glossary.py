"""A glossary: source terms and the target terms their translation must use (docs/markup.md).

A request may carry terms (DecodingOptions.glossary) and a model may have a standing glossary (a
file in its bundle, and the server's --glossary-dir file over it). A term applies to a text whose
words, after the model's input rule, contain the term's words in a row; a term with no source is a
target-only constraint and applies to every text of its request. The search then guarantees the
target term (service/decode/shared/constraints.py).

Words for matching are the runs of letters and digits, and each other non-space character on its
own: "λόγος," holds the term "λόγος", "e-mail" is three words and matches only "e-mail".

A glossary file is read like a memory file (service/model/memory.py): UTF-8 lines of source, a tab,
target; blank lines and lines starting with "#" skipped; `.gz` through gzip; any line that does not
parse refuses the whole file, naming it and the line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.model.memory import MemoryFileError, lines

WORD = re.compile(r"\w+|[^\w\s]")


class GlossaryFileError(MemoryFileError):
    """A glossary file that cannot be used, with the file and line that say why."""


@dataclass(frozen=True)
class Term:
    """A source term (as the model reads it: after its input rule; "" for a target-only one) and
    the target term its translation must contain."""

    source: str
    target: str

    @property
    def words(self) -> tuple[str, ...]:
        return words(self.source)


def words(text: str) -> tuple[str, ...]:
    return tuple(WORD.findall(text))


@dataclass(frozen=True)
class Match:
    """A term found in a text: its words first..last (over `words(text)`), and its characters
    text[start:end]."""

    term: Term
    first: int
    last: int
    start: int
    end: int


@dataclass
class Scan:
    """A text's terms: the matches kept, and each match that overlapped one kept (with it)."""

    kept: list[Match] = field(default_factory=list)
    overlapped: list[tuple[Match, Match]] = field(default_factory=list)


KEPT, OVERLAPPED, CUT = "kept", "overlapped", "cut"  # what became of a term (TermUse.status)


@dataclass(frozen=True)
class TermUse:
    """What became of a term that applies to a text (its source found there, or none), judged on
    the best hypothesis: kept (it holds the target); overlapped (its source overlaps a term kept
    instead: the leftmost, then the longest); cut (the hypothesis reached its maximum length
    before writing it). A request's term is as the request sent it, with its index there; a term
    of the model's standing glossary has no index."""

    term: Term
    status: str
    request_index: int | None = None
    kept_instead: Term | None = None  # overlapped: the term kept where their sources overlap


@dataclass(frozen=True)
class Glossary:
    """Terms indexed by their first source word; a later term replaces an earlier one with the
    same source."""

    terms: tuple[Term, ...] = ()
    sources: tuple[str, ...] = ()  # the files it was read from
    _index: dict[str, list[Term]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        latest = {t.words: t for t in self.terms if t.words}
        for term in latest.values():
            self._index.setdefault(term.words[0], []).append(term)

    def __len__(self) -> int:
        return len(self.terms)

    def over(self, base: Glossary) -> Glossary:
        """This glossary's terms over base's: a source here replaces its target there."""
        if not base.terms:
            return self
        return Glossary(base.terms + self.terms, base.sources + self.sources)

    def find(self, text: str) -> list[Match]:
        """The terms whose words occur in text's, leftmost first; where two overlap, the one
        starting first (the longer at the same start) wins."""
        return self.scan(text).kept

    def scan(self, text: str) -> Scan:
        """The terms found in text: those kept (`find`'s) and those that lost an overlap, each
        with the match kept over it."""
        out = Scan()
        spans = [m.span() for m in WORD.finditer(text)]
        tokens = tuple(text[s:e] for s, e in spans)
        for i, token in enumerate(tokens):
            here = [
                Match(t, i, i + len(t.words) - 1, spans[i][0], spans[i + len(t.words) - 1][1])
                for t in self._index.get(token, ())
                if tokens[i : i + len(t.words)] == t.words
            ]
            if not here:
                continue
            holder = out.kept[-1] if out.kept and out.kept[-1].last >= i else None
            if holder is None:  # the longest term starting here is kept
                holder = max(here, key=lambda m: m.last)
                out.kept.append(holder)
            out.overlapped += [(m, holder) for m in here if m is not holder]
        return out


EMPTY = Glossary()


def read_glossary(
    path: Path, normalize: Callable[[str], str], check: Callable[[str], object]
) -> Glossary:
    """A glossary file's terms, sources normalized by the model's input rule; `check(target)`
    raises ValueError for a target the model cannot spell. Any refusal names the file and line."""
    terms: list[Term] = []
    for number, line in lines(path, GlossaryFileError, "glossary file"):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        source, tab, target = line.partition("\t")
        if not tab:
            raise GlossaryFileError(
                f"{path}:{number}: no tab between source and target: {line[:60]!r}"
            )
        if not source.strip() or not target.strip():
            side = "source" if not source.strip() else "target"
            raise GlossaryFileError(f"{path}:{number}: the {side} is empty")
        try:
            key = normalize(source).strip()
            check(target.strip())
        except ValueError as err:
            raise GlossaryFileError(f"{path}:{number}: {err}") from err
        terms.append(Term(key, target.strip()))
    return Glossary(tuple(terms), (str(path),))
