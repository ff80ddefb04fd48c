"""The gold alignment sidecar: `<split>.gold.jsonl` beside each generated `<split>.tsv`.

One JSON object per TSV line, same order. Indices are word indices over `text.split(" ")` of each
side; phrase spans are [src_start, src_end, tgt_start, tgt_end] (end exclusive), connectors belong to
no phrase; `words` are sure [src_word, tgt_word] links, only where the correspondence is unambiguous.

    {"family": "date-long", "parts": 2, "phrases": [[0, 3, 0, 3], [4, 5, 4, 7]],
     "words": [[0, 1], [1, 0], [2, 2], [3, 3]]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GoldLinks:
    family: str  # the value family of a one-phrase sentence, or "mixed"
    parts: int  # the number of phrases
    phrases: list[tuple[int, int, int, int]]  # [src_start, src_end, tgt_start, tgt_end] per phrase
    words: list[tuple[int, int]]  # sure [src_word, tgt_word] links
    families: list[str] | None = None  # each phrase's family, for several phrases

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": self.family,
            "parts": self.parts,
            "phrases": [list(p) for p in self.phrases],
            "words": [list(w) for w in self.words],
        }
        if self.families is not None:
            out["families"] = list(self.families)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GoldLinks:
        families = data.get("families")
        return cls(
            family=str(data["family"]),
            parts=int(data["parts"]),
            phrases=[(int(a), int(b), int(c), int(d)) for a, b, c, d in data["phrases"]],
            words=[(int(s), int(t)) for s, t in data["words"]],
            families=[str(f) for f in families] if families is not None else None,
        )


def read_gold(path: str | Path) -> list[GoldLinks]:
    """One GoldLinks per non-blank line of a `.gold.jsonl` file."""
    with open(path, encoding="utf-8") as f:
        return [GoldLinks.from_dict(json.loads(line)) for line in f if line.strip()]


def write_gold(path: str | Path, items: Iterable[GoldLinks]) -> None:
    """Write one JSON object per line (UTF-8)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for item in items:
            f.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")


def gold_path_for(tsv: Path) -> Path:
    """The gold sidecar beside a split: data/test.tsv → data/test.gold.jsonl."""
    return tsv.with_name(tsv.name.removesuffix(".tsv") + ".gold.jsonl")
