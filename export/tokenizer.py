"""Train the source and target SentencePiece models on a TSV corpus, with fixed special ids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from service.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def train_sentencepiece(
    lines: Sequence[str], model_path: Path, vocab_size: int, model_type: str = "unigram"
) -> Path:
    """Train one SentencePiece model from in-memory lines; writes `<model_path>` (.model) and returns it."""
    model_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = str(model_path.with_suffix(""))
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(lines),
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
    )
    Path(prefix + ".vocab").unlink(missing_ok=True)
    return Path(prefix + ".model")


def train_tokenizers(
    pairs: Sequence[tuple[str, str]], out_dir: Path, src_vocab: int, tgt_vocab: int
) -> tuple[Path, Path]:
    """Train source and target models on a corpus's two sides: out_dir/{source,target}.model."""
    src = train_sentencepiece([s for s, _ in pairs], out_dir / "source.model", src_vocab)
    tgt = train_sentencepiece([t for _, t in pairs], out_dir / "target.model", tgt_vocab)
    return src, tgt
