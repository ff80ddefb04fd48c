"""Train and run OpenNMT-py and Joey NMT through their own command lines, on a generated task.

    python -m export.toolkits.toolkits --toolkit opennmt-py --tokenizer sentencepiece --out runs/demo

trains one tiny subword model with the toolkit's own command line (a minute on 2 cores) and prints
what it wrote: a checkpoint to try s2s-import on (docs/import.md walks through it).

The import tests and benchmarks/importing/import_speed.py use these to make real checkpoints in
seconds and to get each toolkit's own translations of the same sentences. The task: random sentences
over 40 lower-case words, the target the source reversed and upper-cased (so source and target
vocabularies differ). Both toolkits must be installed (the `import` extra plus
scripts/install_toolkits.sh).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import sentencepiece as spm
import yaml
from subword_nmt.learn_bpe import learn_bpe as subword_learn_bpe

from service.decode.engine.engine import Engine
from service.decode.shared.options import SearchOptions

WORDS = [f"w{i}" for i in range(40)]
REPO = (
    Path(__file__).resolve().parents[2]
)  # on the toolkits' PYTHONPATH (JOEY_MAIN imports from it)
# OpenNMT-py 3.5.1 pickles its options; torch >= 2.6 refuses that by default.
TOOL_ENV = {
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONWARNINGS": "ignore",
}


def make_task(directory: Path, n_train: int = 4000, n_test: int = 500, seed: int = 0) -> Path:
    """Write train/valid/test .src/.tgt under directory; returns directory."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", 100), ("test", n_test)):
        pairs = []
        for _ in range(n):
            src = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
            pairs.append((" ".join(src), " ".join(w.upper() for w in reversed(src))))
        (directory / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (directory / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))
    return directory


SYLLABLES = ["ka", "lo", "mi", "re", "tu", "sa", "ne", "po", "ri", "da", "ve", "gu"]


def make_subword_task(
    directory: Path, n_train: int = 3000, n_test: int = 200, seed: int = 0
) -> Path:
    """The reversal task over 30 words of 2-3 syllables (so that subword models cut them), the
    target upper-cased, both ending with the same "." or "?" or nothing; writes train/valid/test
    .src/.tgt and a train.both (both sides, for
    shared subword models) under directory."""
    rng = random.Random(seed)
    words = sorted(
        {"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))) for _ in range(30)}
    )
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", 50), ("test", n_test)):
        pairs = []
        for _ in range(n):
            src = [rng.choice(words) for _ in range(rng.randint(1, 5))]
            end = rng.choice([".", "?", ""])  # attached to the last word, as people write
            tgt = [w.upper() for w in reversed(src)]
            pairs.append((" ".join(src) + end, " ".join(tgt) + end))
        (directory / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (directory / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))
    both = (directory / "train.src").read_text() + (directory / "train.tgt").read_text()
    (directory / "train.both").write_text(both)
    return directory


def train_sentencepiece(corpus: Path, prefix: Path, vocab_size: int) -> Path:
    """A SentencePiece model as the toolkits' tutorials make one (unigram, defaults); prefix.model."""
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        minloglevel=2,
        num_threads=1,
    )
    return prefix.with_suffix(".model")


def learn_bpe(corpus: Path, codes: Path, merges: int) -> Path:
    """subword-nmt learn-bpe with `merges` operations."""
    with corpus.open(encoding="utf-8") as infile, codes.open("w", encoding="utf-8") as outfile:
        subword_learn_bpe(infile, outfile, merges)
    return codes


def _bin(name: str) -> str:
    """A console script of the running interpreter's environment."""
    return str(Path(sys.executable).parent / name)


def _run(cmd: list[str], log: Path, stdin: Path | None = None, stdout: Path | None = None) -> None:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **TOOL_ENV, "PYTHONPATH": path}
    with log.open("w") as err:
        out_f = stdout.open("w") if stdout else err
        in_f = stdin.open() if stdin else None
        try:
            done = subprocess.run(cmd, stdin=in_f, stdout=out_f, stderr=err, env=env, check=False)
        finally:
            if stdout:
                out_f.close()
            if in_f:
                in_f.close()
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({done.returncode}):\n{tail}")


def translate_lines(
    engine: Engine,
    sources: list[str],
    beam: int,
    prefixes: list[str] | None = None,
    **controls: Any,
) -> list[str]:
    """Our best translation of each source, 32 a batch, under the settings the toolkits' own
    translate commands run with here (no length cut but 100 tokens; `translate_onmt`), with each
    source's target prefix and any decoding controls: what their outputs are compared with."""
    out: list[str] = []
    for i in range(0, len(sources), 32):
        options = SearchOptions(
            beam_size=beam,
            max_length_a=0.0,
            max_length_b=100,
            target_prefix=tuple(prefixes[i : i + 32]) if prefixes else (),
            **controls,
        )
        got = engine.translate(sources[i : i + 32], options, alignment="none")
        out += [t.hypotheses[0].text for t in got]
    return out


def train_onmt(task: Path, out: Path, options: dict[str, Any], steps: int = 300) -> Path:
    """onmt_build_vocab + onmt_train with `options` (OpenNMT-py's own names); returns the checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "save_data": str(out / "run"),
        "src_vocab": str(out / "vocab.src"),
        "tgt_vocab": str(out / "vocab.tgt"),
        "overwrite": True,
        "data": {
            "corpus_1": {"path_src": str(task / "train.src"), "path_tgt": str(task / "train.tgt")},
            "valid": {"path_src": str(task / "valid.src"), "path_tgt": str(task / "valid.tgt")},
        },
        "train_steps": steps,
        "valid_steps": 100000,
        "save_checkpoint_steps": steps,
        "save_model": str(out / "model"),
        "batch_size": 64,
        "batch_type": "sents",
        "bucket_size": 2048,
        "num_workers": 0,
        "optim": "adam",
        "learning_rate": 0.003,
        "report_every": 100,
        "seed": 1,
        **options,
    }
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    if options.get("share_vocab"):
        cfg["tgt_vocab"] = cfg["src_vocab"]
        config.write_text(yaml.safe_dump(cfg))
    _run([_bin("onmt_build_vocab"), "-config", str(config), "-n_sample", "-1"], out / "vocab.log")
    _run([_bin("onmt_train"), "-config", str(config)], out / "train.log")
    return out / f"model_step_{steps}.pt"


def onmt_transform_args(options: dict[str, Any]) -> list[str]:
    """The onmt_translate flags that apply the training options' subword transform, if any."""
    args: list[str] = []
    transforms = [t for t in options.get("transforms", []) if t in ("sentencepiece", "bpe")]
    if transforms:
        args += ["-transforms", *transforms]
        for key in ("src_subword_model", "tgt_subword_model"):
            if options.get(key):
                args += [f"-{key}", str(options[key])]
    return args


def translate_onmt(
    checkpoint: Path,
    src: Path,
    out: Path,
    beam: int,
    batch_size: int = 32,
    extra: list[str] | None = None,
) -> Path:
    """onmt_translate with the settings our search reproduces: no length penalty (its default is
    "avg") and no length-ratio cut (its default ties the maximum length to the batch's longest
    source). Beam 1 is its beam search with one hypothesis, the argmax (any -random_sampling_topk,
    even 1, switches every beam size to its sampling search)."""
    cmd = [_bin("onmt_translate"), "-model", str(checkpoint), "-src", str(src), "-output", str(out)]
    cmd += ["-beam_size", str(beam), "-batch_size", str(batch_size), "-length_penalty", "none"]
    cmd += ["-max_length_ratio", "0", "-max_length", "100", *(extra or [])]
    _run(cmd, out.with_suffix(".log"))
    return out


JOEY_SEED = 1


def joey_config(
    task: Path,
    out: Path,
    model: dict[str, Any],
    epochs: int = 5,
    sides: dict[str, dict[str, Any]] | None = None,
    training: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """sides: extra data.src / data.trg settings (e.g. level bpe, tokenizer_type, tokenizer_cfg);
    training: settings of the training section to change (e.g. learning_rate)."""
    side = {"level": "word", "lowercase": False, "max_length": 30, "voc_min_freq": 1}
    sides = sides or {}
    return {
        "name": "toy",
        "joeynmt_version": "2.3.0",
        "model_dir": str(out / "model"),
        "use_cuda": False,
        "data": {
            "train": str(task / "train"),
            "dev": str(task / "valid"),
            "test": str(task / "test"),
            "dataset_type": "plain",
            "src": {"lang": "src", **side, **sides.get("src", {})},
            "trg": {"lang": "tgt", **side, **sides.get("trg", {})},
        },
        "random_seed": JOEY_SEED,  # where Joey NMT 2.3.0 reads it (not under "training")
        "training": {
            "optimizer": "adam",
            "learning_rate": 0.003,
            "scheduling": "exponential",  # joeynmt 2.3's plateau scheduler breaks on torch 2.13
            "decrease_factor": 1.0,
            "batch_size": 64,
            "batch_type": "sentence",
            "epochs": epochs,
            "validation_freq": 100,  # best.ckpt, which its test and translate modes load, is a validation's
            "logging_freq": 100,
            "eval_metrics": ["bleu"],
            "early_stopping_metric": "loss",
            "overwrite": True,
            "keep_best_ckpts": 1,
            "num_workers": 0,
            **(training or {}),
        },
        "model": {"initializer": "xavier_uniform", **model},
        "testing": {
            "beam_size": 5,
            "beam_alpha": 0,
            "max_output_length": 100,  # its default ties the maximum to the batch's longest source
            "batch_size": 32,
            "batch_type": "sentence",
        },
    }


# `python -m joeynmt` with SentencePieceProcessor.SetVocabulary back (sentencepiece 0.2 dropped it;
# Joey NMT 2.3.0's sentencepiece tokenizer calls it): export/importers/spm_vocab.py. torch is seeded
# first: Joey NMT 2.3.0 seeds (its `random_seed`) only after it has built the model, so the initial
# weights, and every model trained from them, differed from run to run.
JOEY_MAIN = (
    "import runpy, torch; from export.importers.spm_vocab import install_set_vocabulary; "
    f"install_set_vocabulary(); torch.manual_seed({JOEY_SEED}); "
    "runpy.run_module('joeynmt', run_name='__main__')"
)


def _joey(*args: str) -> list[str]:
    return [sys.executable, "-c", JOEY_MAIN, *args]


def train_joey(
    task: Path,
    out: Path,
    model: dict[str, Any],
    epochs: int = 5,
    sides: dict[str, dict[str, Any]] | None = None,
    training: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """`python -m joeynmt train`; returns (config, checkpoint)."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(joey_config(task, out, model, epochs, sides, training)))
    _run(_joey("train", str(config), "--skip-test"), out / "train.log")
    model_dir = out / "model"
    ckpts = sorted(model_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    best = model_dir / "best.ckpt"
    return config, best if best.exists() else ckpts[-1]


def translate_joey(config: Path, src: Path, out: Path, beam: int, batch_size: int = 32) -> Path:
    """`python -m joeynmt translate` on src (it loads model_dir/best.ckpt) at the given beam."""
    cfg = yaml.safe_load(config.read_text())
    cfg["testing"] = {**cfg["testing"], "beam_size": beam, "batch_size": batch_size}
    run_cfg = out.with_suffix(".yaml")
    run_cfg.write_text(yaml.safe_dump(cfg))
    _run(
        _joey("translate", str(run_cfg)),
        out.with_suffix(".log"),
        src,
        out,
    )
    return out


def read_lines(path: Path) -> list[str]:
    return [line.rstrip("\n") for line in path.read_text().splitlines()]


DEMO_ONMT = {"hidden_size": 64, "word_vec_size": 32, "encoder_type": "brnn", "rnn_type": "GRU",
             "global_attention": "mlp", "input_feed": 0, "learning_rate": 0.01}  # fmt: skip
DEMO_JOEY = {
    "encoder": {"type": "recurrent", "rnn_type": "gru", "embeddings": {"embedding_dim": 32},
                "hidden_size": 32, "bidirectional": True},
    "decoder": {"type": "recurrent", "rnn_type": "gru", "embeddings": {"embedding_dim": 32},
                "hidden_size": 64, "attention": "bahdanau", "input_feeding": False,
                "init_hidden": "bridge"},
}  # fmt: skip


def train_demo(toolkit: str, tokenizer: str, out: Path) -> dict[str, str]:
    """One tiny model on the subword task, with the tokenizer shared by both sides; the paths."""
    task = make_subword_task(out / "task")
    if tokenizer == "sentencepiece":
        model = train_sentencepiece(task / "train.both", out / "spm", 60)
    else:
        model = learn_bpe(task / "train.both", out / "bpe.codes", 60)
    paths = {"task": str(task), "subword_model": str(model)}
    if toolkit == "opennmt-py":
        transform = "sentencepiece" if tokenizer == "sentencepiece" else "bpe"
        options = {**DEMO_ONMT, "transforms": [transform], "src_subword_model": str(model),
                   "tgt_subword_model": str(model), "share_vocab": True}  # fmt: skip
        paths["checkpoint"] = str(train_onmt(task, out / "onmt", options, steps=400))
    else:
        kind = "sentencepiece" if tokenizer == "sentencepiece" else "subword-nmt"
        key = "model_file" if tokenizer == "sentencepiece" else "codes"
        side = {"level": "bpe", "tokenizer_type": kind, "tokenizer_cfg": {key: str(model)}}
        config, ckpt = train_joey(
            task, out / "joey", DEMO_JOEY, epochs=4, sides={"src": side, "trg": side}
        )
        paths.update(config=str(config), checkpoint=str(ckpt))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--toolkit", choices=["opennmt-py", "joeynmt"], required=True)
    parser.add_argument("--tokenizer", choices=["sentencepiece", "bpe"], default="sentencepiece")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for name, path in train_demo(args.toolkit, args.tokenizer, args.out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
