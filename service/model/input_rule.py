"""A bundle's rule for its input text, declared in the manifest's "input" and applied before tokenizing.

A model trained on one narrow alphabet (the G2P model knows a-z and the apostrophe) has no good answer
for anything else: SentencePiece would map a digit or "é" to <unk> and the model would still answer,
confidently wrong. The rule makes the contract explicit: normalize what has one obvious reading
(surrounding whitespace, upper case) and refuse the rest with a message that says what is allowed.
A bundle without "input" keeps the old behaviour (any text, tokenized as is).

    "input": {"lowercase": true, "alphabet": "abcdefghijklmnopqrstuvwxyz'", "max_chars": 40}
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass, fields
from typing import Any


class InputRejected(ValueError):
    """The text breaks the bundle's input rule; the message says what the model accepts."""


@dataclass(frozen=True)
class InputRule:
    lowercase: bool = False  # lower-case the text before checking it against the alphabet
    alphabet: str = ""  # every character of the (normalized) text must be one of these; "" = any
    max_chars: int = 0  # longest accepted text after normalization; 0 = no limit here

    def __post_init__(self) -> None:
        if self.max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {self.max_chars}")
        if self.lowercase and self.alphabet and self.alphabet != self.alphabet.lower():
            raise ValueError("alphabet has upper-case characters but the rule lower-cases the text")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputRule:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown input rule keys {unknown} (known: {sorted(known)})")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe_alphabet(self) -> str:
        return " ".join(sorted(self.alphabet)) if self.alphabet else "any character"

    def apply(self, text: str) -> str:
        """The normalized text (whitespace stripped, lower-cased if the rule says so), or InputRejected."""
        out = text.strip()
        if self.lowercase:
            out = out.lower()
        if not out:
            raise InputRejected("text is empty or only whitespace: send one word")
        if self.max_chars and len(out) > self.max_chars:
            raise InputRejected(
                f"text is {len(out)} characters long, over this model's limit of {self.max_chars}"
            )
        if self.alphabet:
            for i, ch in enumerate(out):
                if ch not in self.alphabet:
                    raise InputRejected(
                        f"character {ch!r} ({_char_name(ch)}) at position {i} is not accepted: this model "
                        f"reads one word of these characters only: {self.describe_alphabet()}"
                    )
        return out


def _char_name(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}"
