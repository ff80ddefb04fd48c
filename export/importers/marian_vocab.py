"""Marian's vocabularies as the importer reads them: a SentencePiece model (`.spm`) or a `.yml`
word → id mapping, padded to the weights' rows, plus our PAD and BOS (Marian has neither)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, cast

import sentencepiece as spm
import yaml

from export.importers.common import ImportRefused, refuse_unless, special_order

# Marian writes no PAD or BOS token; the bundle's vocabularies name ids 0 and 1 with these.
PAD_TOKEN, BOS_TOKEN = "<marian:pad>", "<marian:bos>"


@dataclass(frozen=True)
class Vocabulary:
    """Marian's tokens in id order, its `</s>` and `<unk>`, and the file they came from."""

    tokens: list[str]
    eos: str
    unk: str
    path: Path

    @property
    def is_spm(self) -> bool:
        return self.path.suffix == ".spm"


def read_vocab(path: Path, side: str) -> Vocabulary:
    """A SentencePiece model (`.spm`, Marian's rule: by suffix) or a Marian `.yml` word vocabulary."""
    refuse_unless(path.is_file(), f"the {side} vocabulary is not found: {path}")
    if path.suffix == ".spm":
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as err:
            raise ImportRefused(f"{path} is not a sentencepiece model: {err}") from err
        tokens = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
        eos, unk = processor.eos_id(), processor.unk_id()
        refuse_unless(eos >= 0, f"the {side} sentencepiece model {path} has no end-of-sentence id")
        return Vocabulary(tokens=tokens, eos=tokens[eos], unk=tokens[unk], path=path)
    refuse_unless(
        path.suffix in (".yml", ".yaml", ".json"),
        f"unsupported {side} vocabulary {path}: the importer reads Marian's .spm and .yml vocabularies",
    )
    mapping = read_yaml_vocab(path)
    by_id: dict[int, str] = {}
    for word, raw in mapping.items():
        refuse_unless(
            isinstance(word, str) and isinstance(raw, str) and raw.isdigit(),
            f"{path}: {word!r}: {raw!r} is not a word and its id",
        )
        refuse_unless(int(raw) not in by_id, f"{path}: id {raw} is given to two words")
        by_id[int(raw)] = word
    refuse_unless(
        sorted(by_id) == list(range(len(by_id))),
        f"{path}: the ids of a .yml vocabulary must be 0..{len(by_id) - 1}",
    )
    tokens = [by_id[i] for i in range(len(by_id))]
    for special in ("</s>", "<unk>"):
        refuse_unless(special in tokens, f"the {side} vocabulary {path} has no {special}")
    return Vocabulary(tokens=tokens, eos="</s>", unk="<unk>", path=path)


class TextSafeLoader(yaml.SafeLoader):
    """safe_load with no implicit resolver: every plain scalar is the text written, as Marian
    (yaml-cpp's as<std::string>) reads a vocabulary's keys, where the YAML 1.1 resolvers would
    read on/no/yes/true as booleans, 1984 as an integer, null as None, 2001-01-01 as a date and
    `<<:` as a merge."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {}


def read_yaml_vocab(path: Path) -> dict[Any, Any]:
    """A .yml (or .json) vocabulary's word → id mapping, keys and ids as the text written."""
    try:
        mapping = yaml.load(path.read_text(encoding="utf-8"), Loader=TextSafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ImportRefused(f"{path} is not a Marian .yml vocabulary: {err}") from err
    refuse_unless(isinstance(mapping, dict), f"{path} is not a Marian .yml vocabulary")
    return cast(dict[Any, Any], mapping)


def with_rows(vocab: Vocabulary, rows: int, what: str, side: str) -> Vocabulary:
    """The vocabulary padded to a weight of `rows` rows. Marian keeps embeddings and output layer
    of --dim-vocabs rows when its corpus has fewer types; the rows past its vocabulary hold no
    word. They get its unknown token again: a repeated token keeps its first id
    (service/model/vocab.py), so no text reaches them, and the target's are never emitted
    (MarianS2S.step_log_probs). A weight narrower than the vocabulary is refused."""
    refuse_unless(
        rows >= len(vocab.tokens),
        f"vocabulary size mismatch: {what} has {rows} rows but the {side} vocabulary "
        f"{vocab.path} has {len(vocab.tokens)} tokens",
    )
    return replace(vocab, tokens=[*vocab.tokens, *[vocab.unk] * (rows - len(vocab.tokens))])


def vocab_order(vocab: Vocabulary, side: str) -> tuple[list[str], list[int]]:
    """Marian's tokens plus our PAD and BOS (rows V and V+1), and the row of each of our ids."""
    for extra in (PAD_TOKEN, BOS_TOKEN):
        refuse_unless(extra not in vocab.tokens, f"the {side} vocabulary has a token {extra!r}")
    tokens = [*vocab.tokens, PAD_TOKEN, BOS_TOKEN]
    return tokens, special_order(tokens, PAD_TOKEN, BOS_TOKEN, vocab.eos, vocab.unk, side)
