"""SentencePiece's vocabulary restriction (SetVocabulary), on a model file.

Joey NMT 2.3.0 restricts its SentencePiece model to the pieces of its vocabulary
(`SentencePieceProcessor.SetVocabulary`), so a piece the vocabulary lacks is cut further instead of
becoming UNK. sentencepiece 0.2.x's Python API no longer has that method, so the importer applies
the same rule to the model file it puts into the bundle (the server then loads an ordinary model),
and the tests give Joey NMT the method back with `install_set_vocabulary`.

The rule, as sentencepiece's C++ SetVocabulary (sentencepiece_processor.cc): every piece that is
not CONTROL, UNKNOWN or USER_DEFINED becomes NORMAL when the vocabulary has it or it is one
character long, else UNUSED (never produced by encoding).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

_PIECE = model_pb2.ModelProto.SentencePiece  # type: ignore[attr-defined]  # generated protobuf
_KEPT_TYPES = (_PIECE.CONTROL, _PIECE.UNKNOWN, _PIECE.USER_DEFINED)


def restrict_to_vocabulary(model: bytes, vocabulary: Iterable[str]) -> bytes:
    """A serialized SentencePiece model with the pieces outside `vocabulary` unused."""
    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(model)
    valid = set(vocabulary)
    for piece in proto.pieces:
        if piece.type in _KEPT_TYPES:
            continue
        keep = piece.piece in valid or len(piece.piece) == 1
        piece.type = _PIECE.NORMAL if keep else _PIECE.UNUSED
    return proto.SerializeToString()


def _set_vocabulary(self: Any, valid_vocab: list[str]) -> None:
    """SentencePieceProcessor.SetVocabulary of sentencepiece < 0.2, on the loaded model."""
    self.LoadFromSerializedProto(restrict_to_vocabulary(self.serialized_model_proto(), valid_vocab))


def install_set_vocabulary() -> None:
    """Give SentencePieceProcessor a SetVocabulary where this sentencepiece has none (0.2.x), so
    Joey NMT 2.3.0's sentencepiece tokenizer runs."""
    if not hasattr(spm.SentencePieceProcessor, "SetVocabulary"):
        spm.SentencePieceProcessor.SetVocabulary = _set_vocabulary  # type: ignore[attr-defined]
