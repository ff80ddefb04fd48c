"""Joey NMT's `pretokenizer: moses`: sacremoses before the subword segmenter, and after joining.

Optional: sacremoses is needed only to serve a bundle whose manifest asks for it (the `moses`
extra); loading such a bundle without it is refused with the install command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.model.tokenizer import TokenizerError

try:
    from sacremoses import MosesDetokenizer, MosesTokenizer
except ImportError:  # the `moses` extra is not installed
    MosesTokenizer = MosesDetokenizer = None

PRETOKENIZERS = ("none", "moses")


@dataclass(frozen=True)
class Moses:
    """Joey NMT 2.3.0's calls: tokenize(text, return_str=True) (escaping & ' " < > [ ] |),
    detokenize(text.split()) (unescaping)."""

    tokenizer: Any
    detokenizer: Any

    @classmethod
    def load(cls, lang: str) -> Moses:
        if MosesTokenizer is None:
            raise TokenizerError(
                "this bundle pre-tokenizes with moses, which needs sacremoses: "
                "pip install 'seq2seq-serve[moses]'"
            )
        return cls(tokenizer=MosesTokenizer(lang=lang), detokenizer=MosesDetokenizer(lang=lang))

    def tokenize(self, text: str) -> str:
        return str(self.tokenizer.tokenize(text, return_str=True))

    def detokenize(self, text: str) -> str:
        return str(self.detokenizer.detokenize(text.split()))


def load_pretokenizer(section: object) -> Moses | None:
    """A side's "pretokenizer": absent or {"kind": "none"}, or {"kind": "moses", "lang": "en"}."""
    if section is None:
        return None
    kind = section.get("kind") if isinstance(section, dict) else None
    if kind not in PRETOKENIZERS:
        raise TokenizerError(f"unknown pretokenizer {section!r} (known: {list(PRETOKENIZERS)})")
    if kind == "none":
        return None
    assert isinstance(section, dict)
    return Moses.load(str(section.get("lang", "en")))
