"""Inline markup and protected spans: the plain text the model reads, and what it kept aside.

A text sent with `markup = "xml"` or `"html"` carries tags: paired ones (`<b>…</b>`, XLIFF's
`<g id="1">…</g>`), standalone codes (`<x/>`, `<br>`, comments), and elements whose content is code,
not text (XLIFF's `<ph>…</ph>`, HTML's `<script>`): those are kept whole as one code. Protected
spans (URLs, e-mail addresses, placeholders such as `{0}`, `%s`, `{{ name }}`) are codes too, found
in the text itself. `parse` takes all of them out: the model reads `Marked.plain` and never sees a
tag or a protected span. service/decode/align/projection.py puts them back into each hypothesis, at the
target words its links align with the words they enclosed in the source.

Parsing is Python's `html.parser` (a tokenizer that also reads XML's syntax), checked more strictly
on top: paired tags must nest, every `<` must open a tag, entities must be known (XML: the five
predefined and numeric ones; HTML: html5's names). What does not read is a `MarkupError` naming the
character position, or, with `invalid = "text"`, the whole text is read as plain text.

Offsets are character offsets into `plain`; the whitespace around a tag is read from `plain` (an
element whose content begins with a space had the space inside it).
"""

from __future__ import annotations

import html.entities
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Literal

MarkupMode = Literal["none", "xml", "html"]
MARKUP_MODES: tuple[str, ...] = ("none", "xml", "html")
INVALID_MARKUP: tuple[str, ...] = ("refuse", "text")  # what unreadable markup gets

# HTML elements with no end tag, and elements whose content is code to keep, not text to translate.
VOID_ELEMENTS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param"}
    | {"source", "track", "wbr"}
)
CODE_ELEMENTS = {
    "html": frozenset({"script", "style"}),
    "xml": frozenset({"ph", "bpt", "ept", "it"}),  # XLIFF 1.2's native-code inline elements
}
XML_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
ESCAPES = {"&": "&amp;", "<": "&lt;"}  # what markup output must escape in its text

# --- protected spans ---------------------------------------------------------------------------

_URL_END = r"[^\s<>\"'.,;:!?)\]}’”]"
BUILTIN_PROTECT: dict[str, str] = {
    "url": rf"\b(?:(?:https?|ftp)://|www\.)[^\s<>\"]*{_URL_END}",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b",
    "placeholder": "|".join(
        (
            r"\{\{[^{}\n]{0,100}\}\}",  # {{ name }} (Mustache, Jinja, Angular)
            r"\$?\{[\w.]{0,100}\}",  # {0} {name} {} ${name} (.NET, str.format, ICU, templates)
            r"%\(\w+\)[diouxXeEfFgGcrs]",  # %(name)s (Python)
            r"%(?:\d+\$)?[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGaAcs@]",
        )
    ),
}
DEFAULT_PROTECT: tuple[str, ...] = ("url", "email", "placeholder")
NO_PROTECT = "none"
DELIMITED = re.compile(r"^(.+?)(?:…|\.\.\.)(.+)$")  # "OPEN…CLOSE"
MAX_DELIMITED_CHARS = 100  # the most characters between a delimited span's delimiters


class MarkupError(ValueError):
    """Markup that does not read; `position` is the character offset where it stops reading."""

    def __init__(self, position: int, what: str) -> None:
        super().__init__(
            f"unreadable markup at character {position}: {what} (fix the markup, or send "
            'invalid_markup "text" to read the text as plain text)'
        )
        self.position = position


def protect_pattern(entry: str) -> str:
    """One `protect` entry as a regular expression: a built-in name (url, email, placeholder), a
    delimited span "OPEN…CLOSE" (the shortest text from OPEN to CLOSE, on one line), or a literal.
    Entries are not user regular expressions: a pattern with nested repetition could hold the
    server for minutes on one text, and these three kinds cannot."""
    if entry in BUILTIN_PROTECT:
        return BUILTIN_PROTECT[entry]
    delimited = DELIMITED.match(entry)
    if delimited:
        start, end = (re.escape(part) for part in delimited.groups())
        return f"{start}[^\\n]{{0,{MAX_DELIMITED_CHARS}}}?{end}"
    return re.escape(entry)


def protect_problem(index: int, entry: str) -> str | None:
    """Why a `protect` entry cannot be used (None when it can)."""
    if not entry.strip():
        return (
            f"protect[{index}] is empty: give url, email, placeholder, none, a delimited span "
            "such as ${…} or a literal text"
        )
    if entry != entry.strip():
        return f"protect[{index}] ({entry!r}) begins or ends with whitespace"
    return None


def protect_regex(entries: Sequence[str], mode: MarkupMode) -> re.Pattern[str] | None:
    """The request's protected spans as one pattern (earlier entries win where two match at the
    same place); () means the built-ins with markup on and nothing without it, ("none",) nothing."""
    chosen = tuple(entries) or (DEFAULT_PROTECT if mode != "none" else ())
    if NO_PROTECT in chosen or not chosen:
        return None
    return re.compile("|".join(f"(?:{protect_pattern(e)})" for e in chosen))


# --- the parsed text ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Code:
    """Something written back as is at one place: a standalone tag, an element kept whole, a
    comment, or a protected span (its text taken out of the model's input)."""

    raw: str
    at: int  # offset in plain
    space_before: bool  # whitespace (or the text's start) right before it in the source
    space_after: bool  # whitespace (or the text's end) right after it
    protected: bool = False


@dataclass(frozen=True)
class Element:
    """A pair of tags around plain[start:end], with what is nested inside, in source order."""

    name: str
    open: str  # the opening tag as written
    close: str  # the closing tag as written
    start: int
    end: int
    children: tuple[Node, ...] = ()


Node = Element | Code


@dataclass(frozen=True)
class Marked:
    """A text with its markup and protected spans taken out."""

    source: str  # as sent
    plain: str  # what the model reads
    nodes: tuple[Node, ...] = ()  # top level, in source order
    mode: MarkupMode = "none"  # "none" when the text has no markup (or was read as text)
    spellings: dict[str, str] = field(default_factory=dict)  # a character → its entity as written

    def escape(self, text: str) -> str:
        """Plain text as the answer writes it: in markup, `&` and `<` escaped, and every
        character the source wrote as an entity written as the source wrote it."""
        if self.mode == "none":
            return text
        table = {**ESCAPES, **self.spellings}
        return "".join(table.get(ch, ch) for ch in text)


def plain(text: str) -> Marked:
    return Marked(source=text, plain=text)


# --- reading ----------------------------------------------------------------------------------


@dataclass
class _Marker:
    """A tag or code at a plain offset, before the tree is built."""

    at: int
    kind: Literal["open", "close", "code"]
    raw: str
    name: str = ""
    protected: bool = False
    space_before: bool = False
    space_after: bool = False


class _Events(HTMLParser):
    """html.parser's events with their character offsets in the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=False)
        self.events: list[tuple[int, str, str]] = []  # (offset, kind, payload)
        self._line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def _at(self) -> int:
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.events.append((self._at(), "start", tag))

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        self.events.append((self._at(), "code", tag))

    def handle_endtag(self, tag: str) -> None:
        self.events.append((self._at(), "end", tag))

    def handle_data(self, data: str) -> None:
        self.events.append((self._at(), "data", data))

    def handle_entityref(self, name: str) -> None:
        self.events.append((self._at(), "entity", name))

    def handle_charref(self, name: str) -> None:
        self.events.append((self._at(), "charref", name))

    def handle_comment(self, data: str) -> None:
        self.events.append((self._at(), "code", ""))

    def handle_decl(self, decl: str) -> None:
        self.events.append((self._at(), "code", ""))

    def handle_pi(self, data: str) -> None:
        self.events.append((self._at(), "code", ""))

    def unknown_decl(self, data: str) -> None:
        self.events.append((self._at(), "code", ""))


def _tag_name(raw: str) -> str:
    """The name as written in a tag: `<G id="1">` → "G", `</b >` → "b"."""
    found = re.match(r"</?\s*([^\s/>]+)", raw)
    return found.group(1) if found else ""


def _char(name: str) -> str | None:
    """A numeric character reference's character (`169`, `x2014`), None when it names none."""
    try:
        code = int(name[1:], 16) if name[:1] in "xX" else int(name)
        char = chr(code)
    except (ValueError, OverflowError):
        return None
    return None if 0xD800 <= code <= 0xDFFF or code == 0 else char


class _Reader:
    """Builds the plain text and the markers from html.parser's events, strictly."""

    def __init__(self, text: str, mode: MarkupMode) -> None:
        self.text, self.mode = text, mode
        self.plain: list[str] = []
        self.length = 0
        self.markers: list[_Marker] = []
        self.spellings: dict[str, str] = {}
        self.open: list[tuple[str, int]] = []  # (name, offset in the text) of the open elements

    def same(self, a: str, b: str) -> bool:
        return a == b if self.mode == "xml" else a.lower() == b.lower()

    def add_text(self, text: str) -> None:
        self.plain.append(text)
        self.length += len(text)

    def read(self) -> None:
        parser = _Events(self.text)
        parser.feed(self.text)
        parser.close()
        events = parser.events
        ends = [at for at, _, _ in events[1:]] + [len(self.text)] if events else []
        skip_until: tuple[str, int] | None = None  # an element kept whole: (its name, its start)
        depth = 0
        for (at, kind, payload), end in zip(events, ends, strict=True):
            raw = self.text[at:end]
            if skip_until is not None:  # inside a code element: everything is kept as written
                name = _tag_name(raw)
                if kind == "start" and self.same(name, skip_until[0]):
                    depth += 1
                elif kind == "end" and self.same(name, skip_until[0]):
                    depth -= 1
                    if depth == 0:
                        self.code(self.text[skip_until[1] : end])
                        skip_until = None
                continue
            if kind == "data":
                self.data(at, payload)
            elif kind == "entity":
                self.entity(at, payload, raw)
            elif kind == "charref":
                self.charref(at, payload, raw)
            elif kind == "code":
                self.code(raw)
            elif kind == "start":
                name = _tag_name(raw)
                lowered = name.lower()
                if self.mode == "html" and lowered in VOID_ELEMENTS:
                    self.code(raw)
                elif (lowered if self.mode == "html" else name) in CODE_ELEMENTS[self.mode]:
                    skip_until, depth = (name, at), 1
                else:
                    self.open.append((name, at))
                    self.markers.append(_Marker(self.length, "open", raw, name))
            elif kind == "end":
                self.close(at, raw)
        if skip_until is not None:
            raise MarkupError(skip_until[1], f"<{skip_until[0]}> is never closed")
        if self.open:
            name, at = self.open[-1]
            raise MarkupError(at, f"<{name}> is never closed")

    def data(self, at: int, data: str) -> None:
        stray = data.find("<")
        if stray >= 0:
            raise MarkupError(at + stray, "a '<' that opens no tag (write &lt; for the character)")
        if self.mode == "xml" and "&" in data:
            raise MarkupError(
                at + data.index("&"), "a '&' that starts no entity (write &amp; for the character)"
            )
        self.add_text(data)

    def entity(self, at: int, name: str, raw: str) -> None:
        if self.mode == "xml":
            if name not in XML_ENTITIES:
                raise MarkupError(
                    at,
                    f"unknown entity &{name}; (XML knows &amp; &lt; &gt; &quot; &apos; and &#…;)",
                )
            char = XML_ENTITIES[name]
        else:
            found = html.entities.html5.get(f"{name};")
            if found is None:  # an HTML reader shows an unknown entity as written
                self.add_text(raw)
                return
            char = found
        self.spell(char, raw)

    def charref(self, at: int, name: str, raw: str) -> None:
        char = _char(name)
        if char is None:
            if self.mode == "xml":
                raise MarkupError(at, f"{raw.strip()} names no character")
            self.add_text(raw)
            return
        self.spell(char, raw)

    def spell(self, char: str, raw: str) -> None:
        if raw.endswith(";") and len(char) == 1:
            self.spellings.setdefault(char, raw)
        self.add_text(char)

    def code(self, raw: str) -> None:
        self.markers.append(_Marker(self.length, "code", raw))

    def close(self, at: int, raw: str) -> None:
        name = _tag_name(raw)
        if not self.open:
            raise MarkupError(at, f"</{name}> closes no open tag")
        open_name, open_at = self.open[-1]
        if not self.same(name, open_name):
            raise MarkupError(
                at, f"</{name}> does not close <{open_name}> (opened at character {open_at})"
            )
        self.open.pop()
        self.markers.append(_Marker(self.length, "close", raw, open_name))


def _space(plain: str, before: int, after: int) -> tuple[bool, bool]:
    """Whether plain has whitespace (or its start/end) right before `before` and at `after`."""
    return (
        before == 0 or plain[before - 1].isspace(),
        after >= len(plain) or plain[after].isspace(),
    )


def _protect(
    plain: str, markers: list[_Marker], pattern: re.Pattern[str] | None
) -> tuple[str, list[_Marker]]:
    """Take the protected spans out of plain: each becomes a code where it was; a span with a tag
    or code inside it is left as text. One of two spaces around a span removed goes with it."""
    for m in markers:
        m.space_before, m.space_after = _space(plain, m.at, m.at)
    if pattern is None:
        return plain, markers
    at_markers = {m.at for m in markers}
    cuts: list[tuple[int, int, _Marker]] = []  # (start, end of the text removed, its code)
    for found in pattern.finditer(plain):
        start, end = found.span()
        if end == start or any(start < at < end for at in at_markers):
            continue
        if cuts and start < cuts[-1][1]:  # the space before it went with the span before
            start = cuts[-1][1]
            if start >= end:
                continue
        before, after = _space(plain, start, end)
        code = _Marker(start, "code", found.group(), protected=True)
        code.space_before, code.space_after = before, after
        cut_start, cut_end = start, end
        free = cuts[-1][1] if cuts else 0  # the text before it not yet removed starts here
        if before and after:  # one of the two spaces goes (the one before first), not beside a tag
            if start - 1 >= free and start not in at_markers:
                cut_start = start - 1
            elif end < len(plain) and end not in at_markers:
                cut_end = end + 1
        cuts.append((cut_start, cut_end, code))
    if not cuts:
        return plain, markers

    def shift(at: int) -> int:
        gone = 0
        for start, end, _ in cuts:
            if at >= end:
                gone += end - start
            elif at > start:
                gone += at - start
        return at - gone

    # sorted by (new offset, old offset, source order): the markers at a span's start stay before
    # its code, those at its end after it
    keyed = [(shift(m.at), float(m.at), i, m) for i, m in enumerate(markers)]
    keyed += [(shift(code.at), code.at + 0.5, -1, code) for _, _, code in cuts]
    keyed.sort(key=lambda item: item[:3])
    pieces, last = [], 0
    for start, end, _ in cuts:
        pieces.append(plain[last:start])
        last = end
    pieces.append(plain[last:])
    for new, _, _, marker in keyed:
        marker.at = new
    return "".join(pieces), [marker for *_, marker in keyed]


def _tree(markers: list[_Marker]) -> tuple[Node, ...]:
    """The markers (opens and closes well nested) as a tree of elements and codes."""
    stack: list[tuple[_Marker, list[Node]]] = []
    top: list[Node] = []
    for m in markers:
        children = stack[-1][1] if stack else top
        if m.kind == "code":
            children.append(Code(m.raw, m.at, m.space_before, m.space_after, m.protected))
        elif m.kind == "open":
            stack.append((m, []))
        else:
            opened, inner = stack.pop()
            element = Element(opened.name, opened.raw, m.raw, opened.at, m.at, tuple(inner))
            (stack[-1][1] if stack else top).append(element)
    return tuple(top)


def parse(
    text: str,
    mode: MarkupMode = "none",
    protect: Sequence[str] = (),
    invalid: str = "refuse",
) -> Marked:
    """The text's plain text, markup and protected spans. mode "none" reads no markup (only the
    protected spans `protect` asks for); unreadable markup is a MarkupError, or with invalid
    "text" the whole text is read as plain text (its protected spans still taken out)."""
    pattern = protect_regex(protect, mode)
    if mode == "none":
        plain_text, markers = _protect(text, [], pattern)
        return Marked(text, plain_text, _tree(markers))
    reader = _Reader(text, mode)
    try:
        reader.read()
    except MarkupError:
        if invalid != "text":
            raise
        plain_text, markers = _protect(text, [], pattern)
        return Marked(text, plain_text, _tree(markers))
    plain_text, markers = _protect("".join(reader.plain), reader.markers, pattern)
    return Marked(text, plain_text, _tree(markers), mode, reader.spellings)


def strip(text: str, mode: MarkupMode) -> str:
    """A marked-up answer's plain text: its tags and codes taken out, its entities read."""
    return parse(text, mode, (NO_PROTECT,)).plain if mode != "none" else text
