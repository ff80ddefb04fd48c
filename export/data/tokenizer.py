"""Train the source and target SentencePiece models on a TSV corpus, with fixed special ids."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MODEL_TYPES: tuple[str, ...] = ("unigram", "bpe", "char", "word")


@dataclass(frozen=True)
class SpmOptions:
    """How one side is cut into pieces (the config's [tokenizer.source] / [tokenizer.target]).

    The defaults are SentencePiece's own and reproduce the tokenizers trained before these options
    existed. `split_by_number = false` lets letters-plus-digits symbols such as `w28` or `AH0` stay
    one piece; `model_type = "word"` makes every space-separated symbol one piece (a G2P target);
    `model_type = "char"` with `add_dummy_prefix = false` makes every letter one piece (a G2P source);
    `split_digits = true` makes every digit one piece, so "1000000" is copied digit by digit.
    """

    model_type: str = "unigram"
    split_by_number: bool = True
    add_dummy_prefix: bool = True
    split_digits: bool = False  # every digit its own piece: long digit strings are copied exactly
    user_defined_symbols: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")


def train_sentencepiece(
    lines: Sequence[str],
    model_path: Path,
    vocab_size: int,
    model_type: str = "unigram",
    options: SpmOptions | None = None,
) -> Path:
    """Train one SentencePiece model from in-memory lines; writes `<model_path>` (.model) and returns it.

    `options` (when given) overrides `model_type`.
    """
    opts = options or SpmOptions(model_type=model_type)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = str(model_path.with_suffix(""))
    extra: dict[str, Any] = (
        {"user_defined_symbols": opts.user_defined_symbols} if opts.user_defined_symbols else {}
    )
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(lines),
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type=opts.model_type,
        split_by_number=opts.split_by_number,
        add_dummy_prefix=opts.add_dummy_prefix,
        split_digits=opts.split_digits,
        character_coverage=1.0,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
        **extra,
    )
    Path(prefix + ".vocab").unlink(missing_ok=True)
    return Path(prefix + ".model")


def train_tokenizers(
    pairs: Sequence[tuple[str, str]],
    out_dir: Path,
    src_vocab: int,
    tgt_vocab: int,
    source: SpmOptions | None = None,
    target: SpmOptions | None = None,
) -> tuple[Path, Path]:
    """Train source and target models on a corpus's two sides: out_dir/{source,target}.model."""
    src = train_sentencepiece(
        [s for s, _ in pairs], out_dir / "source.model", src_vocab, options=source
    )
    tgt = train_sentencepiece(
        [t for _, t in pairs], out_dir / "target.model", tgt_vocab, options=target
    )
    return src, tgt


def train_joint_tokenizer(
    pairs: Sequence[tuple[str, str]], out_dir: Path, vocab: int, options: SpmOptions | None = None
) -> tuple[Path, Path]:
    """One model trained on both sides' lines, written as out_dir/source.model and a copy as
    out_dir/target.model (the bundle carries one model per side)."""
    src = train_sentencepiece(
        [s for s, _ in pairs] + [t for _, t in pairs],
        out_dir / "source.model",
        vocab,
        options=options,
    )
    tgt = out_dir / "target.model"
    shutil.copyfile(src, tgt)
    return src, tgt
