"""A multilingual model's target languages: OPUS-MT's en-ROMANCE and Tatoeba group models (any
Marian or Hugging Face model trained so) write the language whose token the source begins with,
`>>fra<<`, a piece of their source vocabulary. The names (`fra`) are what ModelInfo lists and the
`target_language` option takes (docs/multilingual.md).

A source read with its token is read as transformers' MarianTokenizer reads it (`_tokenize`, on
`>>` ... the first `<<` at the start): the token as one piece, then the rest of the text, its
whitespace as typed, segmented as usual; the token is never cut by SentencePiece. Two differences,
both on text MarianTokenizer turns into garbage: whitespace before the token is allowed (it reads
the token only at the text's very start), and a token holds no whitespace (`>> a b <<` is text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

TOKEN = re.compile(r">>(\S+)<<")  # a vocabulary piece that names a target language
LEADING = re.compile(r"\s*>>(\S+?)<<")  # a token at a text's start: `>>`, then the first `<<`


def token(name: str) -> str:
    """The vocabulary piece of a target language: fra → >>fra<<."""
    return f">>{name}<<"


def target_languages(pieces: Iterable[str]) -> tuple[str, ...]:
    """The names of the target-language tokens among a source vocabulary's pieces, sorted."""
    found = (TOKEN.fullmatch(p) for p in pieces if p.startswith(">>"))
    return tuple(sorted({m.group(1) for m in found if m is not None}))


def leading(text: str) -> tuple[str, str] | None:
    """(name, the rest of the text) where the text begins with a `>>name<<` token (whitespace
    before it allowed; the rest keeps the whitespace after it), else None. Whether the model
    knows the name is the caller's to check."""
    match = LEADING.match(text)
    if match is None:
        return None
    return match.group(1), text[match.end() :]


def language_problem(name: str, known: Sequence[str], model: str) -> str | None:
    """What is wrong with a requested target language for a model whose target languages are
    `known` (None: nothing; "" asks for none)."""
    if not name or name in known:
        return None
    if not known:
        return (
            f"target_language {name!r}: model {model} has one target language (its vocabulary "
            "holds no >>xxx<< token): leave target_language empty"
        )
    return f"target_language {name!r} is not one of this model's: {', '.join(known)}"
