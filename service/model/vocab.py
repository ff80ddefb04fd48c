"""Word-level tokenizers (whitespace split + a vocabulary file), and picking a bundle's tokenizers.

Models imported from OpenNMT-py and Joey NMT (export/importers/) were trained on whitespace-tokenized
text with a word vocabulary, so their bundles declare in the manifest

    "tokenizer": {"kind": "word", "toolkit": ...,
                  "source": {"file": "source.vocab", "lowercase": false, "append_eos": false},
                  "target": {"file": "target.vocab"}}

A vocabulary file holds one token per line, line i being id i; the importer writes it with the
toolkit's special tokens moved onto the project's fixed ids (PAD 0, BOS 1, EOS 2, UNK 3), so the
serving contract is the same as for SentencePiece bundles. Unknown words map to UNK, as the toolkits
do, and come back as the toolkit's own unknown token (e.g. "<unk>").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from service.model.bundle import Bundle
from service.model.tokenizer import Tokenizer, TokenizerError


class TextTokenizer(Protocol):
    """What the engine needs of a tokenizer, whatever its kind."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def special_ids(self) -> dict[str, int]: ...
    @property
    def max_piece_bytes(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def pieces(self, ids: list[int]) -> list[str]: ...

    def decode(self, ids: list[int]) -> str: ...

    def surfaces(self, ids: list[int]) -> list[str]:
        """Each id's part of decode(ids): they join to the decoded text."""
        ...


@dataclass(frozen=True)
class WordTokenizer:
    """Whitespace-separated words ↔ ids through one vocabulary (line i of the file is id i)."""

    tokens: tuple[str, ...]
    index: dict[str, int]
    path: Path
    lowercase: bool = False
    append_eos: bool = False  # Joey NMT's source side ends every sentence with EOS

    word_level = True  # alignment: every token is a word, so the word merge is the identity

    @classmethod
    def load(
        cls, path: str | Path, lowercase: bool = False, append_eos: bool = False
    ) -> WordTokenizer:
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"vocabulary file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenizerError(f"cannot read vocabulary file {path}: {err}") from err
        tokens = tuple(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"))
        if len(tokens) <= UNK_ID:
            raise TokenizerError(f"{path}: {len(tokens)} tokens, fewer than the 4 special tokens")
        index: dict[str, int] = {}
        for i, token in enumerate(tokens):
            index.setdefault(token, i)  # a repeated token keeps its first id, as the toolkits do
        return cls(
            tokens=tokens, index=index, path=path, lowercase=lowercase, append_eos=append_eos
        )

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def special_ids(self) -> dict[str, int]:
        """The importer wrote the toolkit's specials on the fixed ids; the file's order is the truth."""
        return {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}

    @property
    def max_piece_bytes(self) -> int:
        """The longest token, in UTF-8 bytes."""
        return max(len(t.encode()) for t in self.tokens)

    def encode(self, text: str) -> list[int]:
        if self.lowercase:
            text = text.lower()
        ids = [self.index.get(word, UNK_ID) for word in text.split()]
        if ids and self.append_eos:
            ids.append(EOS_ID)
        return ids

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.tokens[i] for i in ids)

    def surfaces(self, ids: list[int]) -> list[str]:
        return [("" if k == 0 else " ") + self.tokens[i] for k, i in enumerate(ids)]


def _side(options: dict[str, Any], side: str) -> dict[str, Any]:
    section = options.get(side)
    if not isinstance(section, dict) or not isinstance(section.get("file"), str):
        raise TokenizerError(f"the manifest's tokenizer section has no {side}.file")
    return section


def load_tokenizers(bundle: Bundle) -> tuple[TextTokenizer, TextTokenizer]:
    """The source and target tokenizers the bundle's manifest declares."""
    options = bundle.tokenizer
    if options.get("kind", "sentencepiece") == "sentencepiece":
        return Tokenizer.load(bundle.file("source.model")), Tokenizer.load(
            bundle.file("target.model")
        )
    src, tgt = _side(options, "source"), _side(options, "target")
    return (
        WordTokenizer.load(
            bundle.file(src["file"]),
            lowercase=bool(src.get("lowercase", False)),
            append_eos=bool(src.get("append_eos", False)),
        ),
        WordTokenizer.load(bundle.file(tgt["file"]), lowercase=bool(tgt.get("lowercase", False))),
    )


def is_word_level(tokenizer: TextTokenizer) -> bool:
    """True when every token is a whole word (no subword merge for word alignments)."""
    return bool(getattr(tokenizer, "word_level", False))
