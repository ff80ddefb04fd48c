"""The two baselines of the Greek→English benchmark (benchmarks/alignment/grc_en.py).

- eflomal 2.0.0 (Östling and Tiedemann 2016), unsupervised, as it is normally run: on all the text
  at once (books 40-57 here: train, dev and test), lowercased, Greek accents stripped, both
  directions, symmetrized with grow-diag-final-and (export/metrics/symmetrize.py: eflomal 2.0.0
  writes the two directions but has no symmetrizer of its own); the same functions as the silver
  runs' teacher (export/train/teacher.py), imported from there.
- A translation memory: the English of the most similar Greek verse of the training books, by
  tf-idf cosine over lowercased, accent-stripped words (smoothed idf ln((1+N)/(1+df)) + 1 and
  l2-normalized raw counts, as scikit-learn's TfidfVectorizer computes them).
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence

from export.train.teacher import eflomal_directions, eflomal_gdfa, fold

__all__ = ["TranslationMemory", "eflomal_directions", "eflomal_gdfa", "fold", "strip_accents"]


def strip_accents(text: str) -> str:
    """Unicode NFD with the combining marks dropped: `Ἐν ἀρχῇ` → `Εν αρχη`."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))


# --- translation memory ------------------------------------------------------------------------

Vector = dict[str, float]


class TranslationMemory:
    """Nearest source sentence by tf-idf cosine; returns its target."""

    def __init__(self, sources: Sequence[str], targets: Sequence[str]) -> None:
        if len(sources) != len(targets) or not sources:
            raise ValueError(f"need as many targets as sources, got {len(sources)}/{len(targets)}")
        self.targets = list(targets)
        docs = [fold(s).split() for s in sources]
        df = Counter(w for doc in docs for w in set(doc))
        n = len(docs)
        self.idf = {w: math.log((1 + n) / (1 + c)) + 1.0 for w, c in df.items()}
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(
            list
        )  # word → (doc, weight)
        for k, doc in enumerate(docs):
            for w, x in self.vector(doc).items():
                self.postings[w].append((k, x))

    def vector(self, words: Sequence[str]) -> Vector:
        """l2-normalized tf-idf of a word list; words never seen in the memory weigh 0."""
        weights = {w: c * self.idf.get(w, 0.0) for w, c in Counter(words).items()}
        norm = math.sqrt(sum(x * x for x in weights.values())) or 1.0
        return {w: x / norm for w, x in weights.items() if x}

    def nearest(self, source: str) -> int:
        """The index of the most similar memory sentence (the first on ties; 0 when none shares a
        word)."""
        scores: dict[int, float] = defaultdict(float)
        for w, x in self.vector(fold(source).split()).items():
            for k, y in self.postings.get(w, ()):
                scores[k] += x * y
        if not scores:
            return 0
        return max(scores.items(), key=lambda item: (item[1], -item[0]))[0]

    def translate(self, sources: Sequence[str]) -> list[str]:
        return [self.targets[self.nearest(s)] for s in sources]
