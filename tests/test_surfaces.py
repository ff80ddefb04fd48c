"""service/model/tokenizer.py's surfaces: the table's fast path equals SentencePiece's decoder."""

from __future__ import annotations

import numpy as np
import pytest

from service.model.tokenizer import Tokenizer
from tests.conftest import REPO

# the bundles' own SentencePiece models (source.model, target.model); a toolkit's segmenter that an
# imported bundle carries (source.spm.model: its own special ids) is read by SubwordTokenizer
MODELS = sorted(
    str(p) for p in (REPO / "models").glob("*/*.model") if not p.name.endswith(".spm.model")
)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: "/".join(p.split("/")[-2:]))
def test_the_fast_surfaces_equal_sentencepieces(path: str) -> None:
    tok = Tokenizer.load(path)
    rng = np.random.default_rng(0)
    everything = np.arange(tok.vocab_size)
    for _ in range(3000):
        ids = rng.choice(everything, int(rng.integers(1, 24))).tolist()
        want = [str(p.surface) for p in tok.processor.DecodeIdsAsProto(ids).pieces]
        assert tok.surfaces(ids) == want, ids  # controls and unknowns too (SentencePiece's path)
