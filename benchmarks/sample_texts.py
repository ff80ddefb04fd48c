"""Source texts for the embedded bundles' benchmarks, chosen by the bundle's name: the numbers
model's test sources, common English words for G2P, and Greek verses of the Greek models' dev split
(loadtest/grc_sources.txt; John, the test book, is not among them)."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.workload import GREEK_SOURCES, model_texts

REPO = Path(__file__).resolve().parent.parent
NUMBERS = REPO / "docs" / "eval" / "test.tsv"
GREEK = GREEK_SOURCES


def bundle_texts(bundle: str | Path) -> list[str]:
    name = json.loads((Path(bundle) / "manifest.json").read_text())["name"]
    if name.startswith(("grc-en", "g2p")):
        return model_texts(name)
    return [line.split("\t")[0] for line in NUMBERS.read_text().splitlines() if line.strip()]
