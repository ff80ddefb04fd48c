"""A request's text (a document) cut into sentences, as (start, end) spans into the text.

The modes (DecodingOptions.split_sentences): "off" (the text is one sentence), "on" (a cut at every
line break and at sentence punctuation), "nonewlines" (at sentence punctuation only: a line break
inside a sentence stays inside its span).

Sentence punctuation is found by sentencex (Wikimedia's rule-based segmenter: a compiled wheel, no
dependencies, ~1 ms to import, imported on first use) for the languages it has rules for, and by
this module's plain rule for the others; `splitter_of` names which. The choice was measured:
docs/sentence_splitting.md (benchmarks/quality/sentence_splitters.py).

Whatever a splitter answers, the spans are made here, from the original text: the splitter only
says where sentences start (a library's sentences are located in the text, `locate`), the text is
cut there and each piece stripped of whitespace. So, for any string: the spans are ordered and do
not overlap, none is empty or starts or ends with whitespace (str.isspace), only whitespace lies
outside them; a library that drops or rewrites characters costs a cut, never a wrong offset.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence

SPLIT_MODES = ("off", "on", "nonewlines")
Span = tuple[int, int]

# str.splitlines' line boundaries: \r\n, \n, \r, \v, \f, the file/group/record separators, NEL,
# LINE SEPARATOR and PARAGRAPH SEPARATOR.
LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Turned into a plain space, one for one (offsets do not move), before a splitter sees the text:
# whitespace of any kind, control characters, lone surrogates (a library encodes to UTF-8).
_HIDDEN = re.compile(r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# Double quotes and guillemets, hidden from sentencex too: it makes no cut inside a quotation, so a
# speech of many sentences, or one quote left open, would otherwise be one sentence to the end.
QUOTES = '"“”„‟«»‹›「」『』'
_QUOTE = re.compile(f"[{QUOTES}]")
_OPENING = "“„«‹「『"  # a quote that opens, where whitespace is before it; '"' too, before a word

# The languages sentencex 1.0.32 has rules of its own for (by ISO 639-1 code), and two it reaches by
# its own fallbacks (cs → sk, gl → pt). Any other code would get its English rules: the plain rule
# is used instead.
SENTENCEX_LANGUAGES = frozenset({
    "am", "ar", "bg", "bn", "ca", "da", "de", "el", "en", "es", "fi", "fr", "gu", "hi", "hy", "it",
    "ja", "kk", "kn", "ml", "mr", "my", "nl", "pa", "pl", "pt", "ru", "sk", "ta", "te", "uk",
    "cs", "gl",
})  # fmt: skip
# ISO 639-2/3 codes to ISO 639-1; Ancient Greek to Greek (sentencex has no "grc"; its Greek rules
# take ';' as the question mark and '·' as no end, as the editions of Ancient Greek do).
ISO_639_1 = {
    "amh": "am", "ara": "ar", "bul": "bg", "ben": "bn", "cat": "ca", "dan": "da", "deu": "de",
    "ger": "de", "ell": "el", "gre": "el", "grc": "el", "eng": "en", "spa": "es", "fin": "fi",
    "fra": "fr", "fre": "fr", "guj": "gu", "hin": "hi", "hye": "hy", "arm": "hy", "ita": "it",
    "jpn": "ja", "kaz": "kk", "kan": "kn", "mal": "ml", "mar": "mr", "mya": "my", "bur": "my",
    "nld": "nl", "dut": "nl", "pan": "pa", "pol": "pl", "por": "pt", "rus": "ru", "slk": "sk",
    "slo": "sk", "tam": "ta", "tel": "te", "ukr": "uk", "ces": "cs", "cze": "cs", "glg": "gl",
}  # fmt: skip

# The plain rule's sentence-final marks; Greek writes ';' (or U+037E) for '?'; '·' (ano teleia) is a
# semicolon, no end. CJK full stops need no space after them.
_FINAL = ".!?…‼⁇⁈⁉"
_GREEK_FINAL = _FINAL + ";\u037e"
_CJK_FINAL = "。！？"
_CLOSERS = "\"'”’»›)]}」』"
_OPENERS = "\"'“‘«‹([{¿¡「『"
# Words a '.' ends that end no sentence (lower case, without their last dot); not "no" or "me"
# (French "Maître"), which end English sentences.
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "cf", "e.g", "i.e", "approx",
    "dept", "fig", "vol", "pp", "ca", "mme", "mlle", "mm", "mgr", "p.ex", "hr", "nr", "bzw", "z.b",
    "u.a", "vgl", "sra", "srta", "dra", "ud", "uds",
})  # fmt: skip


def split_sentences(text: str, mode: str, language: str = "") -> list[Span]:
    """The text's sentences as (start, end) code-point offsets, in order; [] for a blank text.

    `language` is an ISO 639 code as a model manifest names it ("en", "fra", "grc", "pt-BR"); one
    sentencex has no rules for, or none, gets the plain rule. A mode not in SPLIT_MODES is a
    ValueError; any text is split.
    """
    if mode not in SPLIT_MODES:
        raise ValueError(f"unknown split mode {mode!r} (known: {', '.join(SPLIT_MODES)})")
    if mode == "off":
        return _stripped(text, [])
    if mode == "nonewlines":
        return _stripped(text, sentence_starts(text, language))
    cuts: list[int] = []
    for start, end in _lines(text):
        cuts += [start + s for s in sentence_starts(text[start:end], language)]
        cuts.append(end)
    return _stripped(text, cuts)


def splitter_of(language: str) -> str:
    """What cuts `language`'s sentences at punctuation: "sentencex:<code>" or "rule"."""
    code = sentencex_code(language)
    return f"sentencex:{code}" if code else "rule"


def sentencex_code(language: str) -> str | None:
    """sentencex's code for an ISO 639 code (a region or script subtag is dropped), or None."""
    code = re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]
    code = ISO_639_1.get(code, code)
    return code if code in SENTENCEX_LANGUAGES else None


def sentence_starts(text: str, language: str) -> list[int]:
    """Where to cut the text between sentences (in the whitespace before a sentence or at its first
    character), by the splitter of `language`; line breaks are spaces here. Never raises: where the
    library fails, the rule answers."""
    shown = _HIDDEN.sub(" ", text)
    code = sentencex_code(language)
    if code is None:
        return rule_starts(shown, language)
    try:
        return _sentencex_starts(shown, code)
    except Exception:  # a library bug must not fail a request: the rule answers
        return rule_starts(shown, language)


def _sentencex_starts(text: str, code: str) -> list[int]:
    from sentencex import segment  # on first use: ~1 ms

    shown = _QUOTE.sub(" ", text).replace("\u037e", ";")  # its Greek rules know ';' only
    starts = []
    for start in locate(shown, segment(code, shown)):
        gap = _gap(text, start)
        if gap == 0:
            continue  # the text's first sentence
        if text[start].islower() and _QUOTE.search(text, gap, start):
            continue  # '“Who are you?” he asked': the quote was hidden, the cut is not a sentence's
        if text[gap - 1] == "." and _abbreviation(text, gap - 1):
            continue  # 'M. Dupont', 'Dr. Martin': sentencex cuts after them in some languages
        starts.append(_opening_cut(text, gap, start))
    return starts


def _gap(text: str, start: int) -> int:
    """Where the whitespace and quotes just before `start` begin."""
    while start > 0 and (text[start - 1].isspace() or text[start - 1] in QUOTES):
        start -= 1
    return start


def _opening_cut(text: str, gap: int, start: int) -> int:
    """The cut within text[gap:start] (closing quotes, whitespace, opening quotes): before the first
    opening quote that follows whitespace, else at the last whitespace."""
    last_space = start
    for i in range(gap, start):
        if text[i].isspace():
            last_space = i
        elif i > gap and text[i - 1].isspace() and (text[i] in _OPENING or text[i] == '"'):
            return i
    return last_space


def locate(text: str, pieces: Iterable[str]) -> list[int]:
    """Where each of a library's sentences starts in `text` (its first non-space character), in
    order, 0 included. A piece is looked for where the previous one ended (after whitespace),
    verbatim or with its whitespace changed, else further on, verbatim; a piece found nowhere (the
    library rewrote it) gives no start."""
    starts: list[int] = []
    at = 0
    for piece in pieces:
        core = piece.strip()
        if not core:
            continue
        begin = _skip_space(text, at)
        end = _match(text, core, begin)
        if end < 0:  # not where it was expected: the library skipped or rewrote something
            begin = text.find(core, begin)
            if begin < 0:
                continue
            end = begin + len(core)
        starts.append(begin)
        at = end
    return starts


def rule_starts(text: str, language: str = "") -> list[int]:
    """The plain rule: a sentence starts after a final mark (. ! ? … and, in Greek, ; ;), any
    closing quotes or brackets and whitespace, where an upper-case letter or a digit follows (any
    letter in Ancient Greek, whose editions do not capitalize sentences; opening quotes and brackets
    before it are the new sentence's), unless the word the '.' ends is an initial or a common
    abbreviation; and after 。！？ without whitespace."""
    code = re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]
    lower_starts = code == "grc"
    pattern = _GREEK_RULE if code in ("el", "ell", "gre", "grc") else _RULE
    starts = []
    for m in pattern.finditer(text):
        head = m.group(2)
        if not (head.isalnum() if lower_starts else head.isdigit() or head.isupper()):
            continue
        if m.group(1).endswith(".") and _abbreviation(text, m.start(1) + len(m.group(1)) - 1):
            continue
        starts.append(m.end())
    return sorted(starts + [m.end() for m in _CJK_RULE.finditer(text)])


def _rule(final: str) -> re.Pattern[str]:
    marks, closers, openers = (re.escape(s) for s in (final, _CLOSERS, _OPENERS))
    return re.compile(rf"([{marks}]+)[{closers}]*\s+(?=[{openers}]*(\S))")


_RULE = _rule(_FINAL)
_GREEK_RULE = _rule(_GREEK_FINAL)
_CJK_RULE = re.compile(rf"[{_CJK_FINAL}]+[{re.escape(_CLOSERS)}]*\s*(?=\S)")


def _abbreviation(text: str, dot: int) -> bool:
    """Whether the word ending at text[dot] == '.' is an initial or a listed abbreviation."""
    begin = dot
    while begin > 0 and not text[begin - 1].isspace():
        begin -= 1
    word = text[begin:dot].lstrip(_OPENERS).lower()
    return (len(word) == 1 and word.isalpha()) or word in _ABBREVIATIONS


def _lines(text: str) -> list[Span]:
    """Each line's (start, end), its line break left out."""
    lines, start = [], 0
    for m in LINE_BREAK.finditer(text):
        lines.append((start, m.start()))
        start = m.end()
    lines.append((start, len(text)))
    return lines


def _stripped(text: str, cuts: Sequence[int]) -> list[Span]:
    """The text cut at `cuts` (any order; duplicates, 0 and len(text) allowed), each piece stripped
    of whitespace, the blank ones left out."""
    bounds = sorted({0, len(text), *(c for c in cuts if 0 < c < len(text))})
    spans = []
    for start, end in itertools.pairwise(bounds):
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start < end:
            spans.append((start, end))
    return spans


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _match(text: str, core: str, begin: int) -> int:
    """Where `core` ends if it lies at text[begin:], verbatim or with its whitespace changed
    (runs added, removed or of another kind); -1 if not."""
    if text.startswith(core, begin):
        return begin + len(core)
    at = begin
    for char in core:
        if char.isspace():
            continue
        if at > begin:
            at = _skip_space(text, at)
        if at >= len(text) or text[at] != char:
            return -1
        at += 1
    return at
