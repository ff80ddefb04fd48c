"""The two sides of a (source, target) pair as Align and a memory's forced pass read them: each of
the client's whitespace words tokenized on its own, so each subword piece belongs to exactly one
word, and both sides checked against the engine's limits.

`pair_ids` is the one check of a pair's sizes: Align's requests (service/decode/align/aligner.py,
through `tokenize_pair`, which adds the pieces) and a memory's entries at load (Engine.read_memory)
run it, so a memory never holds an entry whose forced pass a request would be refused for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from service.decode.shared.config import EngineLimits
from service.decode.shared.errors import InvalidInput
from service.decode.text.preparation import Prepared
from service.model.markup import Marked
from service.model.vocab import TextTokenizer


@dataclass(frozen=True)
class Side:
    """One side of a pair, tokenized word by word."""

    words: list[str]  # the client's whitespace words
    ids: list[int]  # (P,) the ids the model reads
    pieces: list[str]  # (P,)
    word_of: np.ndarray  # (P,) int64: the word each piece belongs to
    unknown: list[int]  # indices of pieces that are the unknown token

    @property
    def unknown_words(self) -> list[int]:
        return sorted({int(self.word_of[i]) for i in self.unknown})

    def written_surfaces(self) -> tuple[str, ...]:
        """Each piece's text as the words were written: a word's whole text on its last piece
        (after a space, but for the first word), nothing on its others, which belong to the word
        after them (alignment.word_membership): the pieces write the words, those the vocabulary
        cannot spell included, and group as they do."""
        last = np.r_[self.word_of[1:] != self.word_of[:-1], True] if len(self.word_of) else []
        return tuple(
            ((" " if w else "") + self.words[w]) if end else ""
            for w, end in zip(self.word_of.tolist(), last, strict=True)
        )


def side_ids(
    tokenizer: TextTokenizer,
    model_words: Sequence[str],
    encode: Callable[[str], list[int]] | None = None,
) -> tuple[list[int], list[int]]:
    """(ids, the word of each id) of `model_words` (the words as the model reads them), each word
    tokenized alone. A word with no ids, or an end-of-sentence the tokenizer appends to every
    encoding (Joey NMT's sources), is handled so that each piece belongs to one word: a bare word
    becomes the unknown token, a sentence-final EOS is kept once, on the last word. `encode`: the
    tokenizer's encode, or a cached one (a memory's load sees the same words again)."""
    encode = encode or tokenizer.encode
    special = tokenizer.special_ids
    unk, eos = special["unk"], special["eos"]
    ids: list[int] = []
    word_of: list[int] = []
    for w, word in enumerate(model_words):
        word_ids = [i for i in encode(word) if i != eos] or [unk]
        ids += word_ids
        word_of += [w] * len(word_ids)
    whole = encode(" ".join(model_words))
    if whole[-1:] == [eos] and ids[-1:] != [eos]:  # the tokenizer ends a sentence with EOS
        ids.append(eos)
        word_of.append(len(model_words) - 1)
    return ids, word_of


@dataclass(frozen=True)
class PairReader:
    """What reading a pair needs of an engine: its input rule, tokenizers and limits."""

    normalize: Callable[[str], str]  # the input rule (InvalidInput when it refuses a text)
    src_tok: TextTokenizer
    tgt_tok: TextTokenizer
    limits: EngineLimits


@dataclass(frozen=True)
class PairIds:
    """A checked pair's words and ids, before their pieces are looked up."""

    words: list[str]  # the source's whitespace words, as sent
    model_words: list[str]  # the same after the input rule
    src: tuple[list[int], list[int]]  # side_ids of the source
    tgt_words: list[str]
    tgt: tuple[list[int], list[int]]  # side_ids of the target


def pair_ids(
    reader: PairReader,
    source: str,
    target: str,
    encode_source: Callable[[str], list[int]] | None = None,
    encode_target: Callable[[str], list[int]] | None = None,
) -> PairIds:
    """Validate one pair and give its ids (InvalidInput says which side and what to change). The
    source goes through the input rule as Translate's does. `encode_*`: the tokenizers' encode, or
    cached ones (a memory's load)."""
    for side, text in (("source", source), ("target", target)):
        if not isinstance(text, str):
            raise InvalidInput(f"{side} must be a string, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInput(f"{side} is empty or only whitespace: send at least one word")
    words = source.split()
    normalized = reader.normalize(source).split()
    if len(normalized) != len(words):  # a rule that changes the word count cannot be indexed
        normalized = [reader.normalize(w) for w in words]
    limits = reader.limits
    src = side_ids(reader.src_tok, normalized, encode_source)
    if len(src[0]) > limits.max_source_tokens:
        raise InvalidInput(
            f"source is {len(src[0])} subword tokens long, over the limit of "
            f"{limits.max_source_tokens}: split the pair into shorter sentences"
        )
    tgt_words = target.split()
    if len(tgt_words) + 1 > limits.max_length:  # every word is at least one token
        raise InvalidInput(
            f"target is at least {len(tgt_words)} subword tokens long (one a word); with its end "
            f"of sentence over the limit of {limits.max_length} (max_length): split the pair into "
            "shorter sentences"
        )
    tgt = side_ids(reader.tgt_tok, tgt_words, encode_target)
    if len(tgt[0]) + 1 > limits.max_length:  # the target's tokens and its end of sentence
        raise InvalidInput(
            f"target is {len(tgt[0])} subword tokens long; with its end of sentence over the "
            f"limit of {limits.max_length} (max_length): split the pair into shorter sentences"
        )
    return PairIds(words, normalized, src, tgt_words, tgt)


def tokenize_pair(reader: PairReader, source: str, target: str) -> tuple[Side, Side]:
    """Validate and tokenize one pair (pair_ids), each side with its pieces."""
    ids = pair_ids(reader, source, target)
    return side_of(reader.src_tok, ids.words, ids.src), side_of(
        reader.tgt_tok, ids.tgt_words, ids.tgt
    )


def side_of(tokenizer: TextTokenizer, words: list[str], ids: tuple[list[int], list[int]]) -> Side:
    unk = tokenizer.special_ids["unk"]
    return Side(
        words=words,
        ids=ids[0],
        pieces=tokenizer.pieces(ids[0]),
        word_of=np.array(ids[1], np.int64),
        unknown=[i for i, t in enumerate(ids[0]) if t == unk],
    )


@dataclass(frozen=True)
class PreparedPair:
    """A validated, tokenized pair; `source` is what the encoder (and encode-ahead) reads. Here,
    not beside the aligner, so that the channel's codec (service/serve/channel.py) reads it
    without the decoder's modules."""

    source: Prepared
    src: Side
    tgt: Side
    target: str = ""  # the target as sent
    marked: Marked | None = None  # the source's markup (AlignOptions.markup), taken out of it
