"""What a model's target side can write: text a client or a file gives for the output (a
target_prefix, a suppress entry, a glossary's target) is checked before it is used.

A target vocabulary maps what it cannot spell to its unknown token: a prefix of snowmen would be
forced as ⁇ and the answer would not start with what the client sent; a suppress entry would block
the unknown token instead of the word. So such text is refused, naming what the vocabulary lacks:
the characters for a subword vocabulary (any word of them can be cut into pieces), the words for a
word vocabulary (imported word-level models). Control characters (C0 and C1, tab, newline and
carriage return aside) are refused first, by name. A memory's target is the exception: it is
served as written, not decoded, so only its control characters are refused
(service/decode/engine/engine.py's read_memory); what the vocabulary cannot spell is marked instead.
"""

from __future__ import annotations

import unicodedata

from service.model.vocab import TextTokenizer, is_word_level

ALLOWED_CONTROLS = "\t\n\r"  # whitespace a tokenizer reads as a space


def describe(ch: str) -> str:
    """'☃' → "'☃' (U+2603 SNOWMAN)"."""
    return f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')})"


def control_characters(text: str) -> list[str]:
    """The control characters of text (Unicode category Cc, tab/newline/CR aside), each once."""
    return [
        ch
        for ch in dict.fromkeys(text)
        if unicodedata.category(ch) == "Cc" and ch not in ALLOWED_CONTROLS
    ]


def control_problem(text: str) -> str | None:
    """A message naming text's control characters; None when it has none."""
    found = control_characters(text)
    if not found:
        return None
    named = ", ".join(f"U+{ord(ch):04X}" for ch in found)  # (unicodedata names none of them)
    return f"has control characters ({named}): send printable text"


def unspellable(tokenizer: TextTokenizer, text: str) -> list[str]:
    """What the vocabulary cannot spell in text (characters, or words for a word vocabulary), in
    order of appearance, each once; [] when every token of text is known."""
    unk = tokenizer.special_ids["unk"]
    if unk not in tokenizer.encode(text):
        return []
    found: list[str] = []
    for word in dict.fromkeys(text.split()):
        if unk not in tokenizer.encode(word):
            continue
        chars = [] if is_word_level(tokenizer) else _unknown_characters(tokenizer, word, unk)
        found += chars or [word]
    return list(dict.fromkeys(found)) or [text]  # (unknown only in context: name the whole)


def _unknown_characters(tokenizer: TextTokenizer, word: str, unk: int) -> list[str]:
    return [ch for ch in dict.fromkeys(word) if unk in tokenizer.encode(ch)]


def spelling_problem(tokenizer: TextTokenizer, text: str) -> str | None:
    """A message naming what the target vocabulary cannot spell in text (and its control
    characters); None when the model can write it."""
    control = control_problem(text)
    if control is not None:
        return control
    missing = unspellable(tokenizer, text)
    if not missing:
        return None
    word_level = is_word_level(tokenizer)
    shown = ", ".join(repr(m) if word_level or len(m) > 1 else describe(m) for m in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    what = "words" if word_level else "characters"
    return (
        f"the model's target vocabulary cannot spell {shown}{more}: it would write its unknown "
        f"token there; send text of {what} the model knows"
    )
