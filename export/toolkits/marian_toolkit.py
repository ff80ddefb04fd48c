"""Train, decode and score with Marian itself (pymarian 1.12.42, the `marian` extra), for the tests
and benchmarks of the Marian importer.

    python -m export.toolkits.marian_toolkit --out runs/marian-demo    # a tiny s2s model, seconds

Every Marian command runs in a child process (`_pymarian.main([...])`, the `marian` binary's
subcommands) with OMP_NUM_THREADS=1, so that one test's Marian state never leaks into another and
`--cpu-threads` alone sets its threads.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.toolkits.toolkits import make_subword_task

# The s2s shapes the tests train: Marian's defaults apart from size and time.
TINY = ["--dim-emb", "32", "--dim-rnn", "32", "--mini-batch", "32", "--learn-rate", "0.003"]
# A Transformer as small: 2 + 2 post-norm layers 32 wide, 4 heads (OPUS-MT's equations, its
# swish feed-forward and tied embeddings, at a test's size)
TINY_TRANSFORMER = [
    "--dim-emb", "32", "--enc-depth", "2", "--dec-depth", "2", "--transformer-heads", "4",
    "--transformer-dim-ffn", "64", "--transformer-ffn-activation", "swish",
    "--tied-embeddings-all", "--mini-batch", "32", "--learn-rate", "0.003",
    "--lr-warmup", "100", "--transformer-dropout", "0",
]  # fmt: skip
MAIN = "import sys, _pymarian; _pymarian.main(sys.argv[1:])"


def run_marian(args: list[str], log: Path, threads: int = 1) -> None:
    """`marian ARGS` in a child process; its log to `log`; a failure raises with the log's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", MAIN, *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"marian {args[0]} failed ({done.returncode}):\n{tail}")


def train(
    sources: tuple[Path, Path],
    out: Path,
    vocabs: tuple[str, str],
    options: list[str],
    after: str,
    threads: int = 1,
    kind: str = "s2s",
) -> Path:
    """`marian train --type KIND` on sources into out/model.npz (Marian makes the vocabularies
    named by vocabs under out when they do not exist: .spm trains SentencePiece, .yml counts
    words)."""
    out.mkdir(parents=True, exist_ok=True)
    args = ["train", "--type", kind, "--model", str(out / "model.npz"),
            "--train-sets", str(sources[0]), str(sources[1]),
            "--vocabs", str(out / vocabs[0]), str(out / vocabs[1]),
            "--after", after, "--cpu-threads", str(threads), "--seed", "1111",
            "--disp-freq", "100u", "--quiet-translation", *options]  # fmt: skip
    run_marian(args, out / "train.log", threads)
    return out / "model.npz"


def score_tolerance(printed: float, tolerance: float = 1e-4) -> float:
    """How far our score may be from one marian-decoder printed: `tolerance`, or half a unit of its
    last printed digit where that is coarser (it prints 6 significant digits: -119.934 for a score
    of -119.93426, so scores below -100 are known to 5e-4 only)."""
    if printed == 0:
        return tolerance
    last_digit = 10.0 ** (math.floor(math.log10(abs(printed))) - 5)
    return max(tolerance, last_digit / 2 * 1.0001)


def soft_alignment(field: str) -> np.ndarray:
    """`--alignment soft`: one row per target token (`</s>` included) of source weights, (T, S)."""
    return np.array([[float(x) for x in row.split(",")] for row in field.split()], np.float64)


def hard_links(matrix: np.ndarray) -> set[str]:
    """marian-decoder's hard alignment of a soft one (data/alignment.cpp, threshold 1): each
    target row's first largest source weight, as `s-t`."""
    return {f"{int(np.argmax(row))}-{t}" for t, row in enumerate(matrix)}


@dataclass(frozen=True)
class NBest:
    """One line of Marian's n-best output: sentence index, text, score (normalized as asked)."""

    index: int
    text: str
    score: float
    alignment: str = ""


def decode(
    model: Path,
    vocabs: tuple[Path, Path],
    source: Path,
    out: Path,
    beam: int,
    threads: int = 1,
    mini_batch: int = 1,
    n_best: bool = False,
    alignment: str = "",
    extra: tuple[str, ...] = (),
) -> Path:
    """marian-decoder's output for source (one line per sentence, or its n-best list) in out.
    mini_batch 1 by default: Marian's --max-length-factor counts the widest source of a batch, so
    one sentence a batch gives every sentence its own limit (3 x its tokens with `</s>`)."""
    args = ["decode", "-m", str(model), "-v", str(vocabs[0]), str(vocabs[1]),
            "-i", str(source), "-o", str(out), "-b", str(beam), "--cpu-threads", str(threads),
            "--mini-batch", str(mini_batch), "--maxi-batch", "100", "--quiet", *extra]  # fmt: skip
    if n_best:
        args.append("--n-best")
    if alignment:
        args += ["--alignment", alignment]
    run_marian(args, out.with_suffix(out.suffix + ".log"), threads)
    return out


def read_nbest(path: Path) -> list[list[NBest]]:
    """Marian's `i ||| text ||| [alignment |||] F0= s ||| score` lines, grouped by sentence."""
    groups: dict[int, list[NBest]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split(" ||| ")  # the text as Marian wrote it (a trailing space is kept)
        index = int(fields[0])
        align = fields[2].strip() if len(fields) > 4 else ""  # i ||| text ||| align ||| F0= ||| s
        groups.setdefault(index, []).append(
            NBest(index=index, text=fields[1], score=float(fields[-1]), alignment=align)
        )
    return [groups[i] for i in sorted(groups)]


def score(
    model: Path, vocabs: tuple[Path, Path], pair: tuple[Path, Path], out: Path
) -> list[float]:
    """marian-scorer's log P(target | source) (summed, `</s>` included) of each pair."""
    args = ["score", "-m", str(model), "-v", str(vocabs[0]), str(vocabs[1]),
            "-t", str(pair[0]), str(pair[1]), "--cpu-threads", "1", "--quiet"]  # fmt: skip
    log = out.with_suffix(".log")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with out.open("w") as stdout, log.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", MAIN, *args], stdout=stdout, stderr=stderr,
                              env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"marian score failed: {log.read_text()[-2000:]}")
    return [float(x) for x in out.read_text().split()]


def rewrite_options(model: Path, out: Path, changes: dict[str, object]) -> Path:
    """A copy of model.npz at `out` whose special:model.yml has `changes` (option names with - as
    _), ended by a NUL byte as Marian writes it."""
    import yaml

    with np.load(model) as npz:
        arrays = {name: npz[name] for name in npz.files}
    text = bytes(arrays["special:model.yml"].astype(np.int8).tobytes()).decode()
    options = yaml.safe_load(text.rstrip("\x00"))
    for name, value in changes.items():
        options[name.replace("_", "-")] = value
    arrays["special:model.yml"] = np.frombuffer(yaml.safe_dump(options).encode() + b"\x00", np.int8)
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out


def train_demo(
    out: Path,
    vocab_kind: str = "spm",
    options: tuple[str, ...] = (),
    kind: str = "s2s",
    n_test: int = 60,
    after: str = "2e",
    tied: bool = True,
) -> Path:
    """A tiny s2s (or Transformer) model on the generated subword task (syllable words reversed,
    upper-cased): Marian's own vocabularies (.spm: SentencePiece of 40 pieces a side, or one of 80
    for a Transformer; .yml: words). A Transformer's embeddings are tied to everything unless
    `tied` is false (each side its own, and an output layer of its own)."""
    task = make_subword_task(out / "task", n_train=2000, n_test=n_test)
    vocabs = (f"src.{vocab_kind}", f"tgt.{vocab_kind}")
    sizes = ["--dim-vocabs", "40", "40"] if vocab_kind == "spm" else []
    shape = TINY
    if kind == "transformer":  # one vocabulary for both sides, as OPUS-MT's, tied to everything
        vocabs = (f"vocab.{vocab_kind}", f"vocab.{vocab_kind}")
        sizes = ["--dim-vocabs", "80", "80"] if vocab_kind == "spm" else []
        shape = TINY_TRANSFORMER if tied else [o for o in TINY_TRANSFORMER if "tied" not in o]
    return train(
        (task / "train.src", task / "train.tgt"),
        out / "marian",
        vocabs,
        [*shape, *sizes, *options],
        after=after,
        kind=kind,
    )


# Words YAML 1.1 reads as something else than text when a vocabulary writes them unquoted, as
# Marian does: booleans (on, no, yes, ...), integers, floats, a date, a sexagesimal number, a merge
# key; beside ordinary ones. Every English vocabulary has "on" and "no".
YAML_WORDS = (
    "on", "no", "off", "yes", "true", "false", "On", "NO", "Yes", "y", "n",
    "1984", "007", "1_000", "3.14", "0x1F", "1:20", "2001-01-01", "<<", "=",
)  # fmt: skip
PLAIN_WORDS = ("the", "cat", "sat", "dog", "ran", "and", "he", "said", "to", "them", ".", ",")


def make_words_task(directory: Path, n_train: int = 2000, n_test: int = 60, seed: int = 0) -> Path:
    """The reversal task over YAML_WORDS and PLAIN_WORDS (both sides the same words): writes
    train/valid/test .src/.tgt under directory."""
    rng = random.Random(seed)
    words = [*YAML_WORDS, *PLAIN_WORDS]
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", 50), ("test", n_test)):
        pairs = []
        for _ in range(n):
            src = [rng.choice(words) for _ in range(rng.randint(2, 6))]
            pairs.append((" ".join(src), " ".join(reversed(src))))
        (directory / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (directory / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))
    return directory


def train_words_demo(out: Path, options: tuple[str, ...] = ()) -> Path:
    """A tiny s2s model with Marian's .yml word vocabularies on make_words_task, `--dim-vocabs`
    above the corpus's types: Marian then keeps embeddings and output layer of --dim-vocabs rows
    and writes vocabularies of the types it saw, the YAML words unquoted."""
    task = make_words_task(out / "task")
    return train(
        (task / "train.src", task / "train.tgt"),
        out / "marian",
        ("src.yml", "tgt.yml"),
        [*TINY, "--dim-vocabs", "80", "64", *options],
        after="2e",
    )


def segment(processor: Any, source: Path, out: Path) -> Path:
    """Each line of source as SentencePiece pieces joined by spaces (what spm_encode writes)."""
    lines = source.read_text(encoding="utf-8").splitlines()
    pieces = [" ".join(processor.encode(line, out_type=str)) for line in lines]
    out.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    return out


def train_opus_demo(out: Path, decoding: dict[str, Any], n_test: int = 60) -> Path:
    """A tiny Transformer in OPUS-MT's release layout, on the generated subword task: the text
    segmented by source.spm and target.spm before Marian reads it, one .yml vocabulary of those
    pieces tied to everything, and a decoder.yml (relative paths) with `decoding`'s
    marian-decoder options. Returns the decoder.yml."""
    import sentencepiece as spm

    task = make_subword_task(out / "task", n_train=2000, n_test=n_test)
    model_dir = out / "marian"
    model_dir.mkdir(parents=True, exist_ok=True)
    for side, suffix in (("source", "src"), ("target", "tgt")):
        spm.SentencePieceTrainer.train(
            input=str(task / f"train.{suffix}"), model_prefix=str(model_dir / side),
            vocab_size=40, model_type="unigram", minloglevel=2, num_threads=1,
        )  # fmt: skip
        (model_dir / f"{side}.model").rename(model_dir / f"{side}.spm")
        processor = spm.SentencePieceProcessor(model_file=str(model_dir / f"{side}.spm"))
        for split in ("train", "test"):
            segment(processor, task / f"{split}.{suffix}", task / f"{split}.{suffix}.sp")
    model = train(
        (task / "train.src.sp", task / "train.tgt.sp"), model_dir, ("vocab.yml", "vocab.yml"),
        TINY_TRANSFORMER, after="20e", kind="transformer",
    )  # fmt: skip
    config = {"relative-paths": True, "models": [model.name], "vocabs": ["vocab.yml"] * 2,
              "mini-batch": 1, "maxi-batch": 1, **decoding}  # fmt: skip
    path = model_dir / "decoder.yml"
    import yaml

    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", choices=("spm", "yml"), default="spm")
    args = parser.parse_args(argv)
    model = train_demo(args.out, args.vocab)
    print(f"task: {args.out / 'task'}   model: {model}   vocabs: {model.parent}/src.{args.vocab} "
          f"{model.parent}/tgt.{args.vocab}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
