"""Markup put back: a text's tags and codes (service/model/markup.py) placed into a translation, at
the target words its word links align with the source words they enclosed.

The links come as a (T, S) weight matrix over target words × source words (the whitespace words of
the translation and of the plain source text): `head_weights` reads the link head's scores, and
`link_weights` a set of hard links (an attention mode's, or any aligner's), both normalized the same
way, so one rule projects both. The rules (docs/markup.md):

- an element around source words W encloses the contiguous target words [lo, hi] with the largest
  Σ (mass(t) - THRESHOLD), mass(t) being the weight target word t puts on W: a word mostly aligned
  inside W is in, a word aligned elsewhere is out, and a gap between two words of W is bridged;
- a code (a standalone tag, a protected span) goes before the target words of the source word it
  is attached to (the one after it, or the one before it when it sticks to that one), after them
  when it follows its word; one before every source word opens the answer, one after every source
  word closes it;
- where the words have no link (hard links only: weights always link a little), the tag goes to the
  nearest source word that has one (before its words when that word is on the right, after them
  on the left); with no link at all, to the same relative position. Nothing is dropped;
- children stay inside their parent's words, siblings do not overlap (a later one in the source
  gives way), so the answer nests as the source does;
- tags go between words, never inside one (a word's subword pieces share its tags), and the
  translation's whitespace is kept: a tag sits on the side of a space where the source had it, and
  only a protected span, which is text, adds a space where the source had one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from service.decode.shared.alignment import word_spans
from service.model.markup import Code, Element, Marked, Node

Link = tuple[int, int]  # (source word, target word)

# A target word is inside an element when more than this share of its weight falls on the
# element's source words. Chosen on the Greek model's dev split (benchmarks/alignment/markup.py, 418
# verses, one tagged span each, three draws): exact span with grc-en-nt's / grc-en-nt-silver's link
# head 0.719 / 0.570 at 0.5, against 0.717 / 0.566 at 0.4 and 0.693 / 0.565 at 0.6 (the first to the
# last linked word: 0.656 / 0.506; each target word's source softmax alone, without agreement,
# 0.707 / 0.571). Other readings of the scores (sigmoids, span-level and learned interval scorers)
# did not reach the floors on dev either (docs/markup.md, Align with markup). The head retrained
# after (two passes, the span loss, two members) reads 0.737 at 0.5, 0.740 at 0.4, 0.726 at 0.6.
THRESHOLD = 0.5


# --- link weights ---------------------------------------------------------------------------------


def _agreement(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Each row of sqrt(rows * cols) renormalized: a target word's weight on a source word is high
    where both directions agree on the link."""
    both = np.sqrt(rows * cols)  # (T, S)
    return both / np.maximum(both.sum(axis=1, keepdims=True), 1e-12)


def link_weights(links: Iterable[Link], T: int, S: int) -> np.ndarray:
    """(T, S) weights of hard links: a link's share of its target word's links and of its source
    word's, combined; a target word with no link weighs nothing anywhere."""
    cells = np.zeros((T, S), np.float64)  # (T, S)
    for s, t in links:
        if 0 <= s < S and 0 <= t < T:
            cells[t, s] = 1.0
    rows = cells / np.maximum(cells.sum(axis=1, keepdims=True), 1.0)
    cols = cells / np.maximum(cells.sum(axis=0, keepdims=True), 1.0)
    return _agreement(rows, cols)


def head_weights(logits: np.ndarray) -> np.ndarray:
    """(T, S) weights from the link head's (T, S) scores: the softmax over source words (each
    target word's distribution) and over target words, combined."""
    if logits.size == 0:
        return np.zeros(logits.shape, np.float64)
    x = logits.astype(np.float64)
    rows = np.exp(x - x.max(axis=1, keepdims=True))
    cols = np.exp(x - x.max(axis=0, keepdims=True))
    return _agreement(
        rows / rows.sum(axis=1, keepdims=True), cols / cols.sum(axis=0, keepdims=True)
    )


def target_span(weights: np.ndarray, first: int, last: int) -> tuple[int, int] | None:
    """The target words [lo, hi] of source words first..last (inclusive): the contiguous run with
    the largest Σ (mass - THRESHOLD); None when no target word has any weight on them."""
    mass = weights[:, first : last + 1].sum(axis=1)  # (T,)
    if not len(mass) or not mass.any():
        return None
    gain = mass - THRESHOLD
    best, span = -np.inf, (0, 0)
    run, start = 0.0, 0
    for t, g in enumerate(gain.tolist()):  # Kadane: the best run ending at t
        if run <= 0:
            run, start = g, t
        else:
            run += g
        if run > best:
            best, span = run, (start, t)
    return span


# --- placing ---------------------------------------------------------------------------------------


@dataclass
class _Placed:
    """A node in the answer: an element over target words lo..hi, or at a gap (before word lo,
    hi = lo - 1: a code, or an element that encloses no target word)."""

    node: Node
    lo: int
    hi: int
    order: int  # source order among siblings
    children: list[_Placed] = field(default_factory=list)

    @property
    def at_gap(self) -> bool:
        return self.hi < self.lo


class _Placer:
    """Target positions of one text's nodes from the weights."""

    def __init__(self, marked: Marked, weights: np.ndarray, T: int) -> None:
        self.plain = marked.plain
        self.words = word_spans(marked.plain)  # (S,) source words
        self.weights = weights
        self.T = T

    def words_in(self, start: int, end: int) -> tuple[int, int] | None:
        """The source words overlapping plain[start:end], as (first, last); None for none."""
        inside = [i for i, (s, e) in enumerate(self.words) if s < end and e > start]
        return (inside[0], inside[-1]) if inside else None

    def anchor(self, at: int, before: bool, after: bool) -> tuple[int, bool] | None:
        """The source word a code at offset `at` belongs to, and True when it goes before it
        (before/after: whitespace on that side of the code in the source)."""
        if not self.words:
            return None
        for i, (s, e) in enumerate(self.words):
            if s < at < e:  # inside a word: before it
                return i, True
        following = next((i for i, (s, _) in enumerate(self.words) if s >= at), None)
        if following is None or (not before and after and following > 0):
            return (len(self.words) - 1 if following is None else following - 1), False
        return following, True

    def gap_of(self, word: int, go_before: bool) -> int:
        """The gap (0..T) before (or after) the target words of a source word; its nearest linked
        neighbour's where it has none; the same relative position where nothing is linked."""
        S = len(self.words)
        for distance in range(S):
            for w, side in ((word + distance, True), (word - distance, False)):
                if not 0 <= w < S:
                    continue
                span = target_span(self.weights, w, w)
                if span is None:
                    continue
                if distance == 0:
                    return span[0] if go_before else span[1] + 1
                return span[0] if side else span[1] + 1
        start = self.words[word][0]
        return round(self.T * start / max(len(self.plain), 1))

    def code_gap(self, code: Code) -> int:
        """Where a code goes: the start or the end of the translation for a code before or after
        every word of the source, else by the word it belongs to."""
        if not self.words or code.at <= self.words[0][0]:
            return 0
        if code.at >= self.words[-1][1]:
            return self.T
        anchor = self.anchor(code.at, code.space_before, code.space_after)
        return 0 if anchor is None else self.gap_of(*anchor)

    def place(self, nodes: Sequence[Node]) -> list[_Placed]:
        out = []
        for i, node in enumerate(nodes):
            out.append(self.place_node(node, i))
        return out

    def place_node(self, node: Node, order: int) -> _Placed:
        if isinstance(node, Code):
            gap = self.code_gap(node)
            return _Placed(node, gap, gap - 1, order)
        children = self.place(node.children)
        words = self.words_in(node.start, node.end)
        span = None if words is None else target_span(self.weights, *words)
        if span is None:
            before, after = _spaces(self.plain, node.start, node.end)
            anchor = self.anchor(node.start, before, after) if words is None else (words[0], True)
            gap = 0 if anchor is None else self.gap_of(*anchor)
            return _Placed(node, gap, gap - 1, order, children)
        return _Placed(node, span[0], span[1], order, children)


def _spaces(plain: str, start: int, end: int) -> tuple[bool, bool]:
    return (start == 0 or plain[start - 1].isspace(), end >= len(plain) or plain[end].isspace())


def _nest(items: list[_Placed], lo: int, hi: int) -> None:
    """Fit items inside the words lo..hi (gaps lo..hi+1), siblings without overlap (earlier in
    the source first), and their children inside them, recursively."""
    taken: list[tuple[int, int]] = []
    for item in sorted(items, key=lambda p: p.order):
        if item.at_gap:
            gap = min(max(item.lo, lo), hi + 1)
            item.lo, item.hi = gap, gap - 1
        else:
            a, b = max(item.lo, lo), min(item.hi, hi)
            a, b = _free_run(a, b, taken)
            if a > b:  # nothing left: where it would have started
                gap = min(max(item.lo, lo), hi + 1)
                item.lo, item.hi = gap, gap - 1
            else:
                item.lo, item.hi = a, b
                taken.append((a, b))
        _nest(item.children, item.lo, item.hi)


def _free_run(a: int, b: int, taken: list[tuple[int, int]]) -> tuple[int, int]:
    """The longest run of a..b that no taken span covers (the first of equals); empty: (a, a-1)."""
    free = [t for t in range(a, b + 1) if not any(x <= t <= y for x, y in taken)]
    best, run = (a, a - 1), (a, a - 1)
    for t in free:
        run = (run[0], t) if run[1] == t - 1 and run[1] >= run[0] else (t, t)
        if run[1] - run[0] > best[1] - best[0]:
            best = run
    return best


# --- writing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    text: str
    space_before: bool = False  # a protected span: wants a space before it
    space_after: bool = False
    tag: bool = False  # a tag or code: not text of the answer's plain text


class _Writer:
    """The answer: the translation's words and whitespace with the placed nodes between them."""

    def __init__(self, marked: Marked, target: str) -> None:
        self.plain = marked.plain
        self.escape = marked.escape
        spans = word_spans(target)
        self.words = [target[s:e] for s, e in spans]
        # seps[t]: the whitespace before word t (t >= 1)
        self.seps = [""] + [target[spans[t - 1][1] : spans[t][0]] for t in range(1, len(spans))]
        self.lead = target[: spans[0][0]] if spans else target
        self.trail = target[spans[-1][1] :] if spans else ""

    def write(self, items: list[_Placed]) -> str:
        pieces = self.range(items, 0, len(self.words) - 1)
        return self.lead + _join(pieces) + self.trail

    def range(self, items: list[_Placed], lo: int, hi: int) -> list[_Piece]:
        """Words lo..hi and the whitespace between them, with the items placed among them (the
        whitespace before lo and after hi is the caller's)."""
        out: list[_Piece] = []
        t, pending = lo, False  # the next word to write; whether seps[t] is due before it

        def word() -> None:
            nonlocal t, pending
            if pending:
                out.append(_Piece(self.seps[t]))
            out.append(_Piece(self.escape(self.words[t])))
            t += 1
            pending = t <= hi

        for item in sorted(items, key=lambda p: (p.lo, p.order)):
            while t < item.lo:
                word()
            if item.at_gap:
                out.extend(self.gap_item(item, pending, t))
                pending = False
                continue
            element = item.node
            assert isinstance(element, Element)
            inner = self.plain[element.start : element.end]
            lead_in, trail_in = inner[:1].isspace(), inner[-1:].isspace()
            if pending and not lead_in:
                out.append(_Piece(self.seps[t]))
            out.append(_Piece(element.open, tag=True))
            if pending and lead_in:
                out.append(_Piece(self.seps[t]))
            out.extend(self.range(item.children, item.lo, item.hi))
            t = item.hi + 1
            pending = t <= hi
            if trail_in and pending:
                out.append(_Piece(self.seps[t]))
                pending = False
            out.append(_Piece(element.close, tag=True))
        while t <= hi:
            word()
        return out

    def gap_item(self, item: _Placed, pending: bool, t: int) -> list[_Piece]:
        """A code or an empty element before word t; `pending`: the whitespace before word t is
        not written yet, and goes before the item unless the item sticks to the word before it."""
        node = item.node
        if isinstance(node, Code):
            before, after = node.space_before, node.space_after
            if node.protected:  # text: it keeps the spaces it had
                body = [_Piece(node.raw, before, after)]
            else:
                body = [_Piece(node.raw, tag=True)]
        else:
            inner = self.range(item.children, item.lo, item.hi)
            body = [_Piece(node.open, tag=True), *inner, _Piece(node.close, tag=True)]
            before, after = _spaces(self.plain, node.start, node.end)
        if not pending:
            return body
        sep = [_Piece(self.seps[t])]
        return body + sep if not before and after else sep + body


def _join(pieces: list[_Piece]) -> str:
    """The pieces' text, with a space beside a protected span where its source had one and the
    answer's text (tags aside) has none, never at its start or end. Closing tags keep to the text
    before them and opening tags to the text after them: the space goes after the one, before
    the other."""
    out: list[str] = []
    anchor = 0  # where a space before the next span goes: after the text and its closing tags
    last_char = ""  # the last character of text written
    owed = False  # a protected span before wants a space before the next text
    for piece in pieces:
        if piece.tag:
            closing = piece.text.startswith("</")
            if owed and not closing and not last_char.isspace():
                out.append(" ")  # before an opening tag, the space owed
                last_char, owed = " ", False
            out.append(piece.text)
            if closing and anchor == len(out) - 1:
                anchor = len(out)
            continue
        if not piece.text:
            continue
        if owed and not piece.text[0].isspace() and not last_char.isspace():
            out.append(" ")
            last_char = " "
        owed = False
        if piece.space_before and last_char and not last_char.isspace():
            out.insert(anchor, " ")
        out.append(piece.text)
        anchor, last_char = len(out), piece.text[-1]
        owed = piece.space_after
    return "".join(out)


def project(marked: Marked, target: str, weights: np.ndarray) -> str:
    """The translation `target` of marked.plain with the markup put back, by links `weights`
    (T target words × S source words of marked.plain). Without tags, `target` escaped as the
    text's markup needs."""
    if not marked.nodes:
        return marked.escape(target)
    T = len(word_spans(target))
    S = len(word_spans(marked.plain))
    if weights.shape != (T, S):
        raise ValueError(f"weights are {weights.shape}, expected ({T}, {S}) target × source words")
    placer = _Placer(marked, weights, T)
    items = placer.place(marked.nodes)
    _nest(items, 0, T - 1)
    return _Writer(marked, target).write(items)


WeightsFor = Callable[[str, str], np.ndarray]  # (plain source, target) → (T, S) weights
