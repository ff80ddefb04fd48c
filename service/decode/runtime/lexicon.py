"""A word-link lexicon: how often gold alignments link a source word form to a target word form.

The link head (service/decode/runtime/link_head.py) reads, for every (target word, source word) cell, how
the training corpus's gold links treat that pair of words: P(target | source) and P(source |
target) estimated from link counts, on the normalized word and on its stem (the first `stem`
characters), plus how often each word was seen. Words are compared lower-cased, without accents
(Unicode combining marks) and without punctuation, so `Θεοῦ,` and `θεου` are one form.

The same class builds the counts at training time (`from_links`) and reads them at serving time
(`load`), so training and serving compute the features with one piece of code.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "s2s-link-lexicon/1"
DEFAULT_STEM = 5
FREQUENCY_CAP = 50  # a word seen this often or more counts as fully known
# Per cell: 2 position features, then forms and stems (P(t|s), P(s|t) each), then word frequencies.
NUM_FEATURES = 8
_NOT_WORD = re.compile(r"[^\w]")

Link = tuple[int, int]  # (source word, target word)


@functools.lru_cache(maxsize=1 << 16)  # a pair's words are mostly words seen before
def normalize(word: str) -> str:
    """Lower-cased, accents and punctuation removed; a word of punctuation only stays as it is."""
    decomposed = unicodedata.normalize("NFD", word.lower())
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _NOT_WORD.sub("", bare) or word.lower()


@dataclass
class Counts:
    """Link counts on one level (forms or stems)."""

    pairs: Counter[tuple[str, str]]
    source: Counter[str]
    target: Counter[str]
    # the counts as arrays for lookups (_Table), built at the first lookup after a change
    _table: _Table | None = field(default=None, init=False, repr=False, compare=False)
    frozen: bool = field(default=False, init=False, compare=False)  # `freeze`: lookups only

    def update(self, src: Sequence[str], tgt: Sequence[str], links: Iterable[Link]) -> None:
        if self.frozen:
            raise ValueError("these counts were frozen for lookups (Lexicon.load): load them again")
        self.source.update(src)
        self.target.update(tgt)
        self.pairs.update((src[s], tgt[t]) for s, t in links)
        self._table = None

    def conditionals(self, src: Sequence[str], tgt: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(T, S) P(target | source) and P(source | target) from the counts; 0 where unseen.
        Every cell is looked up at once in the sorted pair keys (a dictionary lookup per cell
        was most of the head's features: a quarter of a millisecond per pair)."""
        table = self.table()
        if not len(table.keys) or not src or not tgt:
            empty = np.zeros((len(tgt), len(src)), np.float32)
            return empty, empty.copy()
        g = np.array([table.src_ids.get(w, -1) for w in src], np.int64)  # (S,)
        e = np.array([table.tgt_ids.get(w, -1) for w in tgt], np.int64)  # (T,)
        keys = g[None, :] * len(table.tgt_ids) + e[:, None]  # (T, S)
        at = np.searchsorted(table.keys, keys).clip(max=len(table.keys) - 1)  # (T, S)
        found = (g >= 0)[None, :] & (e >= 0)[:, None] & (table.keys[at] == keys)
        counts = np.where(found, table.counts[at], 0.0)  # (T, S) float64
        seen_src = table.src_seen[np.maximum(g, 0)][None, :]  # (1, S)
        seen_tgt = table.tgt_seen[np.maximum(e, 0)][:, None]  # (T, 1)
        given_src = np.divide(counts, seen_src, where=found, out=np.zeros_like(counts))
        given_tgt = np.divide(counts, seen_tgt, where=found, out=np.zeros_like(counts))
        return given_src.astype(np.float32), given_tgt.astype(np.float32)

    def freeze(self) -> None:
        """Build the lookup table and drop the pair counts' dictionary, which lookups never read:
        on grc-en-nt's lexicon 45 MiB as loaded, of which most is that dictionary (every process
        that reads the head holds one per model)."""
        self.table()
        self.pairs = Counter()
        self.frozen = True

    def table(self) -> _Table:
        """The counts as arrays for lookups, built at the first call after a change (40 ms for
        the Greek lexicon's two levels: Lexicon.load builds them, so no request pays it)."""
        if self._table is None:
            self._table = _Table.of(self)
        return self._table

    def to_dict(self) -> dict[str, object]:
        if self.frozen:
            raise ValueError("these counts were frozen for lookups (Lexicon.load): load them again")
        return {
            "pairs": [[g, e, c] for (g, e), c in sorted(self.pairs.items())],
            "source": dict(sorted(self.source.items())),
            "target": dict(sorted(self.target.items())),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Counts:
        pairs = raw["pairs"]
        source, target = raw["source"], raw["target"]
        if not isinstance(pairs, list) or not isinstance(source, dict):
            raise ValueError("lexicon counts must hold a 'pairs' list and 'source'/'target' maps")
        if not isinstance(target, dict):
            raise ValueError("lexicon counts must hold a 'target' map")
        return cls(
            pairs=Counter({(str(g), str(e)): int(c) for g, e, c in pairs}),
            source=Counter({str(k): int(v) for k, v in source.items()}),
            target=Counter({str(k): int(v) for k, v in target.items()}),
        )


@dataclass(frozen=True)
class _Table:
    """A Counts' linked pairs as sorted int64 keys (source id x target words + target id) with
    their counts, and each word's times seen, by id."""

    src_ids: dict[str, int]
    tgt_ids: dict[str, int]
    keys: np.ndarray  # (N,) int64, sorted
    counts: np.ndarray  # (N,) float64
    src_seen: np.ndarray  # (V_s,) float64
    tgt_seen: np.ndarray  # (V_t,) float64

    @classmethod
    def of(cls, counts: Counts) -> _Table:
        linked = [(g, e, c) for (g, e), c in counts.pairs.items() if c]
        src_ids = {
            w: i for i, w in enumerate(dict.fromkeys([*counts.source, *(g for g, _, _ in linked)]))
        }
        tgt_ids = {
            w: i for i, w in enumerate(dict.fromkeys([*counts.target, *(e for _, e, _ in linked)]))
        }
        keys = np.array([src_ids[g] * len(tgt_ids) + tgt_ids[e] for g, e, _ in linked], np.int64)
        order = np.argsort(keys)
        return cls(
            src_ids,
            tgt_ids,
            keys[order],
            np.array([c for _, _, c in linked], np.float64)[order],
            np.array([counts.source[w] for w in src_ids], np.float64),
            np.array([counts.target[w] for w in tgt_ids], np.float64),
        )


def _empty() -> Counts:
    return Counts(Counter(), Counter(), Counter())


class Lexicon:
    """Gold link counts over normalized word forms and their stems."""

    def __init__(self, forms: Counts, stems: Counts, stem: int = DEFAULT_STEM) -> None:
        if stem < 1:
            raise ValueError(f"stem length must be >= 1, got {stem}")
        self.forms = forms
        self.stems = stems
        self.stem = stem

    @classmethod
    def from_links(
        cls,
        pairs: Iterable[tuple[Sequence[str], Sequence[str], Iterable[Link]]],
        stem: int = DEFAULT_STEM,
    ) -> Lexicon:
        """Counts from (source words, target words, gold links) triples."""
        lexicon = cls(_empty(), _empty(), stem)
        for src_words, tgt_words, links in pairs:
            links = list(links)
            src, tgt = [normalize(w) for w in src_words], [normalize(w) for w in tgt_words]
            lexicon.forms.update(src, tgt, links)
            lexicon.stems.update(lexicon._stems(src), lexicon._stems(tgt), links)
        return lexicon

    def _stems(self, words: Sequence[str]) -> list[str]:
        return [w[: self.stem] for w in words]

    def features(self, src_words: Sequence[str], tgt_words: Sequence[str]) -> np.ndarray:
        """(T, S, NUM_FEATURES) float32 for target words × source words: relative position
        difference and its magnitude, P(t|s) and P(s|t) on forms and on stems, and each side's
        word frequency (capped)."""
        src = [normalize(w) for w in src_words]
        tgt = [normalize(w) for w in tgt_words]
        S, T = len(src), len(tgt)
        out = np.zeros((T, S, NUM_FEATURES), np.float32)
        diff = (np.arange(T) / T)[:, None] - (np.arange(S) / S)[None, :]  # (T, S)
        out[..., 0], out[..., 1] = diff, np.abs(diff)
        out[..., 2], out[..., 3] = self.forms.conditionals(src, tgt)
        out[..., 4], out[..., 5] = self.stems.conditionals(self._stems(src), self._stems(tgt))
        out[..., 6] = np.array([min(self.forms.source[g], FREQUENCY_CAP) for g in src])[None, :]
        out[..., 7] = np.array([min(self.forms.target[e], FREQUENCY_CAP) for e in tgt])[:, None]
        out[..., 6:] /= FREQUENCY_CAP
        return out

    def save(self, path: Path) -> None:
        data = {
            "format": FORMAT,
            "stem": self.stem,
            "forms": self.forms.to_dict(),
            "stems": self.stems.to_dict(),
        }
        path.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")), "utf-8")

    @classmethod
    def load(cls, path: Path) -> Lexicon:
        """ValueError naming the file when it is not a lexicon this code wrote."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
            forms, stems = Counts.from_dict(data["forms"]), Counts.from_dict(data["stems"])
            forms.freeze()  # the tables at load, not in the first request
            stems.freeze()
            return cls(forms, stems, int(data["stem"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not a link lexicon: {err}") from err
