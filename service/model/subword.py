"""Subword segmenters of imported models: text ↔ pieces as the toolkit spells them, and which
piece begins which of the client's words.

OpenNMT-py (`sentencepiece` and `bpe` transforms) and Joey NMT (`tokenizer_type: sentencepiece`
and `subword-nmt`) cut text into pieces with a SentencePiece model or subword-nmt BPE codes and
look the pieces up in their own vocabulary. A segmenter here does the cutting and the joining
back exactly as the toolkit's code does (the same libraries, the same calls); the vocabulary
lookup is service/model/vocab.py's.

Alignments are over the client's words: `word_starts` maps each piece onto the whitespace word of
the text it came from (the client's input, or the detokenized output) by walking the pieces'
characters along the text's, so the tokens a response lists carry SentencePiece's "▁" on the
first piece of each word, whatever the toolkit's own marker ("@@" continuation for BPE).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import sentencepiece as spm
from subword_nmt.apply_bpe import BPE

from service.model.tokenizer import TokenizerError

WORD_START = "\u2581"  # SentencePiece's "▁", the project's mark of a word's first piece
SEGMENTERS = ("sentencepiece", "bpe")
TOOLKITS = ("opennmt-py", "joeynmt", "marian", "huggingface")
# subword-nmt caches every word it has segmented; a server sees words without end.
MAX_BPE_CACHE = 100_000
LOOKAHEAD = 16  # characters a piece may skip in the text (an unknown or escaped piece's text)


class Segmenter(Protocol):
    def split(self, text: str) -> list[str]: ...

    def join(self, pieces: list[str]) -> str: ...

    def surface(self, piece: str) -> str: ...


@dataclass(frozen=True)
class SentencePieceSegmenter:
    """A SentencePiece model's pieces ("▁" begins a word)."""

    processor: spm.SentencePieceProcessor
    toolkit: str

    @classmethod
    def load(cls, path: Path, toolkit: str) -> SentencePieceSegmenter:
        """Joey NMT restricts its model to its vocabulary (SetVocabulary): the importer wrote the
        restricted model (export/importers/spm_vocab.py)."""
        if not path.is_file():
            raise TokenizerError(f"sentencepiece model not found: {path}")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as err:
            raise TokenizerError(f"cannot load sentencepiece model {path}: {err}") from err
        return cls(processor=processor, toolkit=toolkit)

    def split(self, text: str) -> list[str]:
        return list(self.processor.encode(text, out_type=str))

    def join(self, pieces: list[str]) -> str:
        """OpenNMT-py and Marian: DecodePieces; Joey NMT and transformers' MarianTokenizer:
        decode, "▁" to spaces, stripped."""
        text = str(self.processor.DecodePieces(pieces))
        if self.toolkit in ("joeynmt", "huggingface"):
            text = text.replace(WORD_START, " ").strip()
        return text

    def surface(self, piece: str) -> str:
        return piece.replace(WORD_START, "")


@dataclass(frozen=True)
class BpeSegmenter:
    """subword-nmt BPE: every piece but a word's last ends with the separator ("@@")."""

    bpe: BPE
    separator: str

    @classmethod
    def load(cls, path: Path, separator: str, vocabulary: Sequence[str] | None) -> BpeSegmenter:
        """vocabulary: Joey NMT restricts the merges to its vocabulary's pieces (bpe.vocab)."""
        if not path.is_file():
            raise TokenizerError(f"BPE codes not found: {path}")
        if not separator:
            raise TokenizerError("the BPE separator is empty")
        try:
            with path.open(encoding="utf-8") as codes:
                bpe = BPE(codes, separator=separator, vocab=set(vocabulary) if vocabulary else None)
        except (OSError, UnicodeDecodeError, ValueError, SystemExit) as err:
            # (subword-nmt calls sys.exit on a malformed line of codes)
            raise TokenizerError(f"cannot read BPE codes {path}: {err!r}") from err
        return cls(bpe=bpe, separator=separator)

    def split(self, text: str) -> list[str]:
        if len(self.bpe.cache) > MAX_BPE_CACHE:
            self.bpe.cache.clear()
        return list(self.bpe.segment_tokens(text.split()))

    def join(self, pieces: list[str]) -> str:
        """Both toolkits: pieces joined by spaces, "@@ " removed, a final "@@" too."""
        sep = re.escape(self.separator)
        return re.sub(rf"({sep} )|({sep} ?$)", "", " ".join(pieces))

    def surface(self, piece: str) -> str:
        return piece[: -len(self.separator)] if piece.endswith(self.separator) else piece


def word_indices(text: str, surfaces: Sequence[str | None]) -> list[int | None]:
    """The whitespace word of `text` each piece belongs to (None for a special token).

    surfaces: each piece's text, marker removed ("" for one whose text is unknown, e.g. an
    unknown token; None for a special token). A piece belongs to the word where its text is next
    spelled out (case-insensitive, up to LOOKAHEAD characters on); one whose text is not found
    (unknown, escaped or normalized) to the word at the current position.
    """
    lowered = [(c.lower(), w) for w, word in enumerate(text.split()) for c in word]  # (char, word)
    # one character per position of text; one whose lower case is longer (İ) matches nothing: a
    # lone surrogate, which no decoded UTF-8 text holds
    spelled_text = "".join(c if len(c) == 1 else "\ud800" for c, _ in lowered)
    owners = [w for _, w in lowered]
    words: list[int | None] = []
    pos, current = 0, 0  # next unmatched character; the word of the last piece
    for surface in surfaces:
        if surface is None:
            words.append(None)
            continue
        spelled = "".join(surface.lower().split())
        j = spelled_text.find(spelled, pos, pos + LOOKAHEAD + len(spelled)) if spelled else -1
        if j >= 0:
            word, pos = owners[j], j + len(spelled)
        else:
            word = owners[pos] if pos < len(owners) else current
        current = max(current, word)
        words.append(current)
    return words


def word_starts(words: Sequence[int | None]) -> list[bool]:
    """Whether each piece begins a new word, from word_indices (a special is a word of its own)."""
    starts: list[bool] = []
    current = -1
    for word in words:
        starts.append(word is None or word > current)
        if word is not None:
            current = max(current, word)
    return starts


def mark_words(pieces: Sequence[str], starts: Sequence[bool]) -> list[str]:
    """Pieces with "▁" on each word's first piece (the project's convention for alignments)."""
    return [(WORD_START + p) if start else p for p, start in zip(pieces, starts, strict=True)]
