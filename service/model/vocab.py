"""Vocabulary tokenizers of imported models (words, or subwords), and picking a bundle's tokenizers.

Models imported from OpenNMT-py and Joey NMT (export/importers/) were trained on whitespace-tokenized
text with a word vocabulary, so their bundles declare in the manifest

    "tokenizer": {"kind": "word", "toolkit": ...,
                  "source": {"file": "source.vocab", "lowercase": false, "append_eos": false},
                  "target": {"file": "target.vocab"}}

A vocabulary file holds one token per line, line i being id i; the importer writes it with the
toolkit's special tokens moved onto the project's fixed ids (PAD 0, BOS 1, EOS 2, UNK 3), so the
serving contract is the same as for SentencePiece bundles. Unknown words map to UNK, as the toolkits
do, and come back as the toolkit's own unknown token (e.g. "<unk>").

Subword models declare "kind": "subword" and, per side, the segmenter (a SentencePiece model or
subword-nmt BPE codes, service/model/subword.py) that cuts text into the vocabulary's pieces.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from service.model import languages
from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from service.model.bundle import Bundle
from service.model.pretokenizer import Moses, load_pretokenizer
from service.model.subword import (
    SEGMENTERS,
    TOOLKITS,
    WORD_START,
    BpeSegmenter,
    Segmenter,
    SentencePieceSegmenter,
    mark_words,
    word_indices,
    word_starts,
)
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

    def pieces(self, ids: list[int], text: str | None = None) -> list[str]:
        """The tokens of ids, for responses and alignments; text: what ids were encoded from
        (a subword tokenizer marks that text's words with "▁"; default: the decoded ids)."""
        ...

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

    def pieces(self, ids: list[int], text: str | None = None) -> list[str]:
        return [self.tokens[i] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.tokens[i] for i in ids)

    def surfaces(self, ids: list[int]) -> list[str]:
        return [("" if k == 0 else " ") + self.tokens[i] for k, i in enumerate(ids)]


@dataclass(frozen=True)
class SubwordTokenizer:
    """An imported model's subword tokenization: the toolkit's pre-processing (lowercase), its
    segmenter (SentencePiece or BPE, service/model/subword.py), its vocabulary (line i is id i),
    and Joey NMT's source EOS. Pieces not in the vocabulary map to UNK, as the toolkits do."""

    vocab: WordTokenizer
    segmenter: Segmenter
    lowercase: bool = False
    append_eos: bool = False
    # Joey NMT's post-processing: its specials but UNK dropped, and an empty text (e.g. a lone
    # "▁" piece) replaced by its UNK token, as its prediction does on the AssertionError.
    joey_output: bool = False
    pretokenizer: Moses | None = None  # Joey NMT's `pretokenizer: moses`
    # a multilingual source's target-language tokens (>>fra<<), read whole at a text's start
    # (service/model/languages.py); set by load_tokenizers
    codes: frozenset[str] = frozenset()

    word_level = False  # alignments merge pieces into the client's words

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def special_ids(self) -> dict[str, int]:
        return self.vocab.special_ids

    @property
    def max_piece_bytes(self) -> int:
        """The longest token with a "▁" mark, in UTF-8 bytes."""
        return self.vocab.max_piece_bytes + len(WORD_START.encode())

    def split(self, text: str) -> list[str]:
        """The toolkit's pieces of text (before the vocabulary lookup): Joey NMT's pre_process
        (moses, then lowercase), then the segmenter; a target-language token the text begins with
        as one piece, then the rest's (transformers' MarianTokenizer._tokenize)."""
        found = languages.leading(text) if self.codes else None
        if found is not None and languages.token(found[0]) in self.codes:
            return [languages.token(found[0]), *self.segmented(found[1])]
        return self.segmented(text)

    def segmented(self, text: str) -> list[str]:
        if self.pretokenizer is not None:
            text = self.pretokenizer.tokenize(text)
        return self.segmenter.split(text.lower() if self.lowercase else text)

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab.index.get(piece, UNK_ID) for piece in self.split(text)]
        if ids and self.append_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: list[int]) -> str:
        """The toolkit's detokenized text."""
        if self.joey_output:
            ids = [i for i in ids if i >= UNK_ID]
        text = self.segmenter.join([self.vocab.tokens[i] for i in ids])
        if self.pretokenizer is not None:
            text = self.pretokenizer.detokenize(text)
        if self.joey_output and not text:
            return self.vocab.tokens[UNK_ID]
        return text

    def pieces(self, ids: list[int], text: str | None = None) -> list[str]:
        """The vocabulary's tokens of ids, "▁" on the first piece of each of text's words (the
        client's input; default: the decoded output); other specials than UNK (Joey NMT's
        source EOS) are words of their own. An unknown piece of the client's text shows that
        text (so the words spell the input), one of the output the vocabulary's UNK token."""
        tokens = [self.vocab.tokens[i] for i in ids]
        shown = [
            self.segmenter.surface(t) if i > UNK_ID else t for i, t in zip(ids, tokens, strict=True)
        ]
        if text is None:
            text, inner, surfaces = self._output_surfaces(ids, tokens)
        else:
            inner, surfaces = self._input_surfaces(ids, text)
            shown = [
                (surface or piece) if i == UNK_ID else piece
                for i, piece, surface in zip(ids, shown, surfaces, strict=True)
            ]
        return mark_words(shown, word_starts(self._words(text, inner, surfaces)))

    def surfaces(self, ids: list[int]) -> list[str]:
        """Each id's part of decode(ids), joining to its words: a word's text on its first piece
        (a space before it after the first word), "" on its other pieces and on specials. A word
        no piece writes (Joey NMT's UNK for an empty output) goes with the piece before it."""
        if not ids:
            return []
        tokens = [self.vocab.tokens[i] for i in ids]
        text, inner, piece_texts = self._output_surfaces(ids, tokens)
        words = text.split()
        owner = self._words(text, inner, piece_texts)  # each piece's word, or None
        out = [""] * len(ids)
        written: set[int] = set()
        for p, w in enumerate(owner):
            if w is not None and w < len(words) and w not in written:
                out[p] = (" " if w else "") + words[w]
                written.add(w)
        last = 0
        for w, word in enumerate(words):
            firsts = [p for p, o in enumerate(owner) if o == w]
            if firsts:
                last = firsts[0]
            elif w not in written:
                out[last] += (" " if w else "") + word
        return out

    def _input_surfaces(self, ids: list[int], text: str) -> tuple[str, list[str | None]]:
        """The pre-tokenized client text, and each piece's own text (None: the appended EOS)."""
        inner = self.pretokenizer.tokenize(text) if self.pretokenizer else text
        split = self.split(text)  # one piece per id, the appended EOS aside
        surfaces: list[str | None] = [self.segmenter.surface(p) for p in split[: len(ids)]]
        surfaces += [None] * (len(ids) - len(surfaces))
        return inner, surfaces

    def _output_surfaces(
        self, ids: list[int], tokens: list[str]
    ) -> tuple[str, str, list[str | None]]:
        """The detokenized output, its text before the pre-tokenizer's detokenizer, and each
        token's text ("" for UNK, whose text is unknown; None for the other specials)."""
        kept = [i for i in ids if i >= UNK_ID] if self.joey_output else ids
        inner = self.segmenter.join([self.vocab.tokens[i] for i in kept])
        text = self.decode(ids)
        surfaces = [
            "" if i == UNK_ID else None if i < UNK_ID else self.segmenter.surface(t)
            for i, t in zip(ids, tokens, strict=True)
        ]
        return text, inner, surfaces

    def _words(self, text: str, inner: str, surfaces: list[str | None]) -> list[int | None]:
        """Each piece's word of text: through the pre-tokenizer's tokens (unescaped) if any."""
        words = word_indices(inner, surfaces)
        if self.pretokenizer is None:
            return words
        outer = word_indices(text, [html.unescape(t) for t in inner.split()])
        return [None if w is None else outer[w] if w < len(outer) else w for w in words]


def _side(options: dict[str, Any], side: str) -> dict[str, Any]:
    section = options.get(side)
    if not isinstance(section, dict) or not isinstance(section.get("file"), str):
        raise TokenizerError(f"the manifest's tokenizer section has no {side}.file")
    return section


def load_subword(bundle: Bundle, section: dict[str, Any], toolkit: str) -> SubwordTokenizer:
    """One side of a "subword" tokenizer section:
    {"file": vocabulary, "segmenter": "sentencepiece" | "bpe", "model": its file, "lowercase": bool,
    "append_eos": bool, "pretokenizer": {"kind": "moses", "lang": "en"} (optional); bpe: "separator":
    "@@", "restrict_to_vocabulary": bool}."""
    if toolkit not in TOOLKITS:
        raise TokenizerError(
            f"unknown toolkit {toolkit!r} in the tokenizer section (known: {list(TOOLKITS)})"
        )
    kind = section.get("segmenter")
    if kind not in SEGMENTERS or not isinstance(section.get("model"), str):
        raise TokenizerError(
            f"the tokenizer section's segmenter must be one of {list(SEGMENTERS)} with a model file, "
            f"got {kind!r}"
        )
    vocab = WordTokenizer.load(bundle.file(section["file"]))
    model = bundle.file(section["model"])
    segmenter: Segmenter
    if kind == "sentencepiece":
        segmenter = SentencePieceSegmenter.load(model, toolkit)
    else:
        # Joey NMT restricts BPE to its vocabulary less its specials (ours: ids 0-3).
        restrict = section.get("restrict_to_vocabulary", False)
        words = vocab.tokens[UNK_ID + 1 :] if restrict else None
        segmenter = BpeSegmenter.load(model, str(section.get("separator", "@@")), words)
    return SubwordTokenizer(
        vocab=vocab,
        segmenter=segmenter,
        lowercase=bool(section.get("lowercase", False)),
        append_eos=bool(section.get("append_eos", False)),
        joey_output=toolkit == "joeynmt",
        pretokenizer=load_pretokenizer(section.get("pretokenizer")),
    )


def load_tokenizers(bundle: Bundle) -> tuple[TextTokenizer, TextTokenizer]:
    """The source and target tokenizers the bundle's manifest declares."""
    options = bundle.tokenizer
    kind = options.get("kind", "sentencepiece")
    # the source reads a multilingual model's >>xxx<< tokens whole (a word vocabulary does: they
    # are words)
    codes = frozenset(languages.token(name) for name in bundle.target_languages)
    if kind == "sentencepiece":
        return replace(Tokenizer.load(bundle.file("source.model")), codes=codes), Tokenizer.load(
            bundle.file("target.model")
        )
    src, tgt = _side(options, "source"), _side(options, "target")
    if kind == "subword":
        toolkit = str(options.get("toolkit"))
        source = replace(load_subword(bundle, src, toolkit), codes=codes)
        return source, load_subword(bundle, tgt, toolkit)
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
