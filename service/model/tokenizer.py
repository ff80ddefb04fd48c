"""SentencePiece tokenizers for source and target, with the project's fixed special ids."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from service.model import languages
from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class TokenizerError(ValueError):
    """A tokenizer model is missing, unreadable or does not use the fixed special ids."""


@dataclass(frozen=True)
class Tokenizer:
    """One SentencePiece model: text ↔ ids and pieces."""

    processor: spm.SentencePieceProcessor
    path: Path
    # a multilingual source's target-language tokens (>>fra<<), read whole at a text's start
    # (service/model/languages.py); set by load_tokenizers
    codes: frozenset[str] = frozenset()

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model not found: {path}")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as err:
            raise TokenizerError(f"cannot load tokenizer model {path}: {err}") from err
        tok = cls(processor=processor, path=path)
        tok.check_special_ids()
        return tok

    def check_special_ids(self) -> None:
        got = (
            self.processor.pad_id(),
            self.processor.bos_id(),
            self.processor.eos_id(),
            self.processor.unk_id(),
        )
        want = (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
        if got != want:
            raise TokenizerError(
                f"{self.path}: special ids (pad, bos, eos, unk) are {got}, expected {want}"
            )

    @functools.cached_property
    def special_ids(self) -> dict[str, int]:
        p = self.processor
        return {"pad": p.pad_id(), "bos": p.bos_id(), "eos": p.eos_id(), "unk": p.unk_id()}

    @property
    def vocab_size(self) -> int:
        return int(self.processor.GetPieceSize())

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The longest piece of the vocabulary, in UTF-8 bytes."""
        p = self.processor
        return max(len(p.IdToPiece(i).encode()) for i in range(self.vocab_size))

    def encode(self, text: str) -> list[int]:
        found = languages.leading(text) if self.codes else None
        if found is not None and languages.token(found[0]) in self.codes:
            code = self.processor.PieceToId(languages.token(found[0]))
            return [code, *self.processor.EncodeAsIds(found[1])]
        return list(self.processor.EncodeAsIds(text))

    def pieces(self, ids: list[int], text: str | None = None) -> list[str]:
        """The pieces of `ids` (their "▁" already marks the words of `text`); a control id (<s>,
        <pad>, which a model can emit) is "", as decoding drops it, so the tokens a response
        lists spell out its text."""
        table = self.piece_table
        return [table[i] for i in ids]

    @functools.cached_property
    def piece_table(self) -> list[str]:
        """Every id's piece ("" for a control id), read once: a front looks up every answer's
        tokens (a list index is a tenth of the two calls into SentencePiece per id)."""
        p = self.processor
        return ["" if p.IsControl(i) else p.IdToPiece(i) for i in range(self.vocab_size)]

    def decode(self, ids: list[int]) -> str:
        return str(self.processor.DecodeIds(ids))

    def surfaces(self, ids: list[int]) -> list[str]:
        """Each id's part of decode(ids), as SentencePiece writes it: they join to the text
        ("▁5" → " 5" but "" at the start, <unk> → " ⁇ ", a control id → ""). Ids of plain pieces
        are read off a table (each piece's "▁" as a space, the text's leading spaces dropped: what
        SentencePiece's decoder does for them, checked against it on random sequences of every
        embedded vocabulary by tests/test_surfaces.py), a fifth of the time; others, SentencePiece."""
        table, plain = self.surface_table
        if not all(plain[i] for i in ids):
            return [str(piece.surface) for piece in self.processor.DecodeIdsAsProto(ids).pieces]
        out, started = [], False
        for i in ids:
            surface = table[i]
            if not started:
                surface = surface.lstrip(" ")
                started = bool(surface)
            out.append(surface)
        return out

    @functools.cached_property
    def surface_table(self) -> tuple[list[str], list[bool]]:
        """Every id's piece with "▁" as a space, and whether the id is a plain piece (not a
        control, unknown, byte or unused one)."""
        p = self.processor
        table = [p.IdToPiece(i).replace("\u2581", " ") for i in range(self.vocab_size)]
        plain = [
            not (p.IsControl(i) or p.IsUnknown(i) or p.IsByte(i) or p.IsUnused(i))
            for i in range(self.vocab_size)
        ]
        return table, plain
