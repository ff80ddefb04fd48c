"""Train a Marian Transformer guided by word alignments, on a parallel corpus with gold links.

    python -m export.toolkits.marian_guided --data data/grc-en --src grc --tgt en \
        --out runs/grc-en-transformer

What Marian is given (pymarian 1.12, the `marian` extra; export/toolkits/marian_toolkit.py runs
it): SentencePiece models trained here on each training side (unigram; Marian reads a `.spm` file
as its vocabulary and segments the raw text itself), the raw training and dev texts, and the
training links remapped from words to those pieces (Marian's `--guided-alignment` reads links
between the tokens it sees: every piece of a source word is linked to every piece of each target
word the gold links it to, as firefox-translations-training remaps them). The guided layer's
cross-attention, head 0, is what `marian-decoder --alignment` returns and what the import serves.
The dev split chooses the checkpoint (`--keep-best` on BLEU); the test split is not read. Run
again on the same --out, it resumes Marian's run (its model.npz, optimizer and progress) with the
pieces and links it made.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from export.toolkits.marian_toolkit import train

# The shape and schedule (docs/model-grc-en-transformer.md): a small post-norm Transformer, as
# OPUS-MT's equations (swish, tied target embeddings), at this corpus's size (~5,500 verses)
SHAPE = [
    "--dim-emb", "256", "--enc-depth", "3", "--dec-depth", "3", "--transformer-heads", "4",
    "--transformer-dim-ffn", "1024", "--transformer-ffn-activation", "swish",
    "--tied-embeddings", "--transformer-dropout", "0.3", "--transformer-dropout-attention", "0.1",
    "--label-smoothing", "0.1", "--learn-rate", "0.001", "--lr-warmup", "800",
    "--lr-decay-inv-sqrt", "800", "--mini-batch", "48", "--maxi-batch", "100",
    "--max-length", "200", "--guided-alignment-weight", "0.5",
    "--transformer-guided-alignment-layer", "last",
]  # fmt: skip


def train_spm(texts: Path, prefix: Path, size: int) -> Path:
    """A unigram SentencePiece model of `size` pieces on one side's training text → prefix.spm."""
    spm.SentencePieceTrainer.train(
        input=str(texts), model_prefix=str(prefix), vocab_size=size, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=0, unk_id=1, pad_id=-1, num_threads=1,
        minloglevel=2,
    )  # fmt: skip
    model = prefix.with_suffix(".spm")
    prefix.with_suffix(".model").rename(model)
    return model


def word_of_pieces(pieces: list[str]) -> list[int]:
    """The word each piece belongs to: a piece that starts with ▁ starts a word (a lone ▁ and the
    pieces after it make one word)."""
    words: list[int] = []
    current = -1
    for i, piece in enumerate(pieces):
        if piece.startswith("▁") and not (i > 0 and pieces[i - 1] == "▁"):
            current += 1
        words.append(max(current, 0))
    return words


def piece_links(
    links: Iterable[tuple[int, int]], src_pieces: list[str], tgt_pieces: list[str]
) -> list[tuple[int, int]]:
    """Word links → links between every piece of each linked source and target word."""
    src_words, tgt_words = word_of_pieces(src_pieces), word_of_pieces(tgt_pieces)
    by_word: dict[int, list[int]] = {}
    for j, word in enumerate(tgt_words):
        by_word.setdefault(word, []).append(j)
    linked = set(links)
    out = {
        (i, j)
        for i, s in enumerate(src_words)
        for t in {t for (s2, t) in linked if s2 == s}
        for j in by_word.get(t, [])
    }
    return sorted(out)


def remap(split: Path, src: str, tgt: str, models: tuple[Path, Path], out: Path) -> Path:
    """The split's Pharaoh word links → piece links (one line a sentence pair) at `out`."""
    processors = [spm.SentencePieceProcessor(model_file=str(m)) for m in models]
    sources = split.with_suffix(f".{src}").read_text(encoding="utf-8").splitlines()
    targets = split.with_suffix(f".{tgt}").read_text(encoding="utf-8").splitlines()
    gold = split.with_suffix(".pharaoh").read_text(encoding="utf-8").splitlines()
    lines = []
    for source, target, line in zip(sources, targets, gold, strict=True):
        pairs = [tuple(map(int, link.split("-"))) for link in line.split()]
        mapped = piece_links(
            [(a, b) for a, b in pairs],
            processors[0].encode(source, out_type=str),
            processors[1].encode(target, out_type=str),
        )
        lines.append(" ".join(f"{i}-{j}" for i, j in mapped))
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="train/dev .SRC .TGT .pharaoh")
    parser.add_argument("--src", default="grc")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--src-pieces", type=int, default=3000)
    parser.add_argument("--tgt-pieces", type=int, default=2000)
    parser.add_argument("--updates", type=int, default=4500, help="Marian's --after, in updates")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    train_split = args.data / "train"
    models = (out / "source.spm", out / "target.spm")
    links = out / "train.align"
    if not (links.is_file() and (out / "model.npz").is_file()):  # else Marian resumes its run
        models = (
            train_spm(train_split.with_suffix(f".{args.src}"), out / "source", args.src_pieces),
            train_spm(train_split.with_suffix(f".{args.tgt}"), out / "target", args.tgt_pieces),
        )
        links = remap(train_split, args.src, args.tgt, models, links)
    dev = args.data / "dev"
    options = [
        *SHAPE, "--guided-alignment", str(links),
        "--dim-vocabs", str(args.src_pieces), str(args.tgt_pieces),
        "--valid-sets", str(dev.with_suffix(f".{args.src}")), str(dev.with_suffix(f".{args.tgt}")),
        "--valid-metrics", "bleu", "ce-mean-words", "--valid-freq", "500u", "--save-freq", "500u",
        "--keep-best", "--early-stopping", "8", "--beam-size", "4", "--normalize", "1",
        "--valid-mini-batch", "32", "--valid-log", str(out / "valid.log"),
    ]  # fmt: skip
    start = time.monotonic()
    train(
        (train_split.with_suffix(f".{args.src}"), train_split.with_suffix(f".{args.tgt}")),
        out,
        (models[0].name, models[1].name),
        options,
        after=f"{args.updates}u",
        threads=args.threads,
        kind="transformer",
    )
    print(f"trained in {time.monotonic() - start:.0f} s: {out / 'model.npz.best-bleu.npz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
