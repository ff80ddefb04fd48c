"""A Marian Transformer of OPUS-MT's shape on identical weights: this engine beside CTranslate2
(converted by its own Marian converter) and marian-decoder.

    python -m benchmarks.importing.transformer_speed_marian --sentences 128 --threads 1 2 \
        [--int8] [--json docs/benchmarks/transformer-speed-marian.json]

The model is made here by Marian itself (pymarian, the `marian` extra): OPUS-MT's options (6 + 6
post-norm layers, 512 wide, 8 heads, 2,048 swish feed-forward, embeddings tied to everything) over
a 32,000-word .yml vocabulary, one training update from Marian's random initialization, saved as
Marian 1.12 saves it (its special:model.yml ends in NUL bytes), then its output bias for `</s>`
set to -100 so that no side ends a sentence early: every side decodes every sentence to its
maximum length, the same work. Ours: s2s-import marian.
CTranslate2 4.x: `ctranslate2.converters.MarianConverter`, which fails on those NUL bytes, so it
converts a copy with them stripped (float32 and int8). marian-decoder: the model as saved. Every
side translates the same sentences (20 words each, so that every sentence's maximum length is
Marian's ceil(3 x 21) = 63 target tokens), beam 5, batches of 32 (marian-decoder: --mini-batch
32), at 1 and 2 threads, ours and CTranslate2 batch by batch in turn; ours returns every
hypothesis's alignment matrix. The figure is target
tokens per second, each side counting the tokens it produced (the end of sentence counted).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.importing.transformer_speed import (
    BATCH,
    BEAM,
    Row,
    report,
    side_by_side,
)

VOCAB, WORDS_A_SENTENCE = 32000, 20
MAX_TOKENS = 63  # Marian's ceil(3 x (20 words + `</s>`))
OPUS_MT = [
    "--dim-emb", "512", "--enc-depth", "6", "--dec-depth", "6", "--transformer-heads", "8",
    "--transformer-dim-ffn", "2048", "--transformer-ffn-activation", "swish",
    "--tied-embeddings-all", "--mini-batch", "8", "--max-length", "64",
]  # fmt: skip


def words() -> list[str]:
    return [f"w{i}" for i in range(VOCAB - 2)]


def make_model(work: Path) -> tuple[Path, Path]:
    """The OPUS-MT-shaped model.npz and its vocabulary, one update from Marian's initialization."""
    from export.toolkits import marian_toolkit as mt

    work.mkdir(parents=True, exist_ok=True)
    vocab = work / "vocab.yml"
    entries = ["</s>: 0", "<unk>: 1", *(f"{w}: {i + 2}" for i, w in enumerate(words()))]
    vocab.write_text("".join(e + "\n" for e in entries), encoding="utf-8")
    corpus = work / "corpus.txt"
    corpus.write_text("".join(line + "\n" for line in texts(64, seed=1)), encoding="utf-8")
    options = [*OPUS_MT, "--dim-vocabs", str(VOCAB), str(VOCAB)]
    model = mt.train((corpus, corpus), work, ("vocab.yml", "vocab.yml"), options, after="1u",
                     kind="transformer")  # fmt: skip
    with np.load(model) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["decoder_ff_logit_out_b"][0, 0] = -100.0  # `</s>` (id 0): no side ends early
    np.savez(model, **arrays)  # type: ignore[arg-type]  # special:model.yml kept, NULs and all
    return model, vocab


def texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = words()
    return [" ".join(rng.choice(pool) for _ in range(WORDS_A_SENTENCE)) for _ in range(count)]


def without_nul(model: Path, out: Path) -> Path:
    """A copy of model.npz whose special:model.yml lacks the NUL bytes Marian 1.12 ends it with
    (CTranslate2's Marian converter reads the YAML with them and fails)."""
    with np.load(model) as npz:
        arrays = {name: npz[name] for name in npz.files}
    text = bytes(arrays["special:model.yml"].astype(np.int8).tobytes()).rstrip(b"\x00")
    arrays["special:model.yml"] = np.frombuffer(text, np.int8)
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out


def convert(model: Path, vocab: Path, work: Path) -> dict[bool, Path]:
    from ctranslate2.converters import MarianConverter

    stripped = without_nul(model, work / "model.ct2-input.npz")
    out = {}
    for int8 in (False, True):
        target = work / ("ct2-int8" if int8 else "ct2")
        MarianConverter(str(stripped), [str(vocab), str(vocab)]).convert(
            str(target), quantization="int8" if int8 else None
        )
        out[int8] = target
    return out


def marian_row(model: Path, vocab: Path, source: Path, threads: int, work: Path) -> Row:
    from export.toolkits import marian_toolkit as mt

    out = work / f"marian.{threads}.out"
    start = time.perf_counter()
    mt.decode(model, (vocab, vocab), source, out, BEAM, threads=threads, mini_batch=BATCH)
    seconds = time.perf_counter() - start
    lines = out.read_text(encoding="utf-8").splitlines()
    # its words and the end of sentence (none where cut at the maximum length)
    tokens = sum(min(len(line.split()) + 1, MAX_TOKENS) for line in lines)
    return Row("marian-decoder", threads, len(lines), tokens, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--int8", action="store_true", help="int8 rows too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from export.importers.marian import import_model

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, vocab = make_model(work / "marian")
        bundle = import_model(model, (vocab, vocab), work / "bundle", "opus-shape", "1", int8=True)
        converted = convert(model, vocab, work)
        sources = texts(args.sentences, seed=5)
        source = work / "source.txt"
        source.write_text("".join(t + "\n" for t in sources), encoding="utf-8")
        pieces = [[*t.split(), "</s>"] for t in sources]
        for threads in args.threads:
            for int8 in (False, True) if args.int8 else (False,):
                rows.extend(side_by_side(
                    bundle, converted[int8], sources, pieces, threads, int8, MAX_TOKENS
                ))  # fmt: skip
                print(rows[-2], rows[-1], flush=True)
            rows.append(marian_row(model, vocab, source, threads, work))
            print(rows[-1], flush=True)
    report(rows, "Marian, OPUS-MT shape", args.json, {"model": "marian opus-mt shape"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
