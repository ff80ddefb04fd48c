"""Decode-only throughput of imported models against OpenNMT-py and Joey NMT, on the same weights.

    python -m benchmarks.importing.import_speed [--work DIR] [--repeats 3] [--json docs/benchmarks/import_speed.json]
    python -m benchmarks.importing.import_speed --bible /work/data/grc-en --work runs/import_bible [...]

Per toolkit, two models trained with the toolkit's own command line on the generated reversal task
(export/toolkits/toolkits.py), then imported with s2s-import:
  gru:  embeddings 128, bidirectional GRU encoder (hidden 256 = 2 x 128), GRU decoder 256,
        mlp (OpenNMT-py) / Bahdanau (Joey NMT) attention, no input feeding;
  lstm: OpenNMT-py's default RNN (rnn encoder, 2-layer LSTM, general attention, input feeding) and
        the same shape in Joey NMT (2-layer LSTM, Luong attention, input feeding), hidden 256.
Each decodes the same 500 test sentences at beam 5 in batches of 32 with 1 and 2 threads; the
systems run interleaved (ours fp32, ours int8 decoder, the toolkit's own in-process translate API),
`--repeats` times, and the medians are reported. Decode-only: models are loaded before the clock
starts; tokenization and detokenization are inside it for every system. No length penalty and a
maximum of 100 target tokens on every side. The toolkits are driven through their Python APIs
(OpenNMT-py's InferenceEnginePY.infer_list, Joey NMT's TranslatorHubInterface.translate).

With --bible DIR (the Greek→English New Testament split written by `python -m export.data.bible`:
{train,dev,test}.{grc,en}, books 40-57, John held out as test), the models are instead one per
toolkit and subword tokenizer, trained on train with dev for validation: SentencePiece (one
unigram model per language; OpenNMT-py's `sentencepiece` transform, Joey NMT's
`tokenizer_type: sentencepiece`) and BPE (subword-nmt, merges per language; `bpe` /
`subword-nmt`), sized and trained by `--setup` (BIBLE_SETUPS): `brief` (default) a small bi-GRU
trained for minutes, `full` a 256-unit model trained about 12 minutes each on one thread (4,000
pieces / merges per language; benchmarks/importing/import_bible_table.py's models); they decode
John:

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.importing.import_speed --bible /work/data/grc-en \
        --work /work/runs/import_bible_full --setup full --only   # train and import, no timing
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

import torch
import yaml

from export.importers import cli
from export.importers.spm_vocab import install_set_vocabulary
from export.toolkits import toolkits
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig

BEAM, BATCH, MAX_LEN = 5, 32, 100
ONMT_MODELS: dict[str, dict[str, Any]] = {
    "gru": {"encoder_type": "brnn", "rnn_type": "GRU", "global_attention": "mlp", "input_feed": 0,
            "hidden_size": 256, "word_vec_size": 128, "enc_layers": 1, "dec_layers": 1},
    "lstm": {"hidden_size": 256, "word_vec_size": 128},  # OpenNMT-py's defaults otherwise
}  # fmt: skip
JOEY_MODELS: dict[str, dict[str, Any]] = {
    "gru": {
        "encoder": {"type": "recurrent", "rnn_type": "gru", "embeddings": {"embedding_dim": 128},
                    "hidden_size": 128, "bidirectional": True},
        "decoder": {"type": "recurrent", "rnn_type": "gru", "embeddings": {"embedding_dim": 128},
                    "hidden_size": 256, "attention": "bahdanau", "input_feeding": False,
                    "init_hidden": "bridge"},
    },
    "lstm": {
        "encoder": {"type": "recurrent", "rnn_type": "lstm", "embeddings": {"embedding_dim": 128},
                    "hidden_size": 128, "bidirectional": True, "num_layers": 2},
        "decoder": {"type": "recurrent", "rnn_type": "lstm", "embeddings": {"embedding_dim": 128},
                    "hidden_size": 256, "num_layers": 2, "attention": "luong",
                    "input_feeding": True, "init_hidden": "bridge"},
    },
}  # fmt: skip


def ours(bundle: Path, threads: int, int8: bool) -> Callable[[list[str]], list[str]]:
    runtime = RuntimeConfig(
        providers=("CPUExecutionProvider",),
        intra_op_threads=threads,
        encoder_threads=threads,
        int8_decoder=int8,
    )
    engine = Engine.load(bundle, runtime)
    options = SearchOptions(beam_size=BEAM, max_length_a=0.0, max_length_b=MAX_LEN)

    def run(lines: list[str]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(lines), BATCH):
            batch = engine.translate(lines[i : i + BATCH], options, alignment="none")
            out += [t.hypotheses[0].text for t in batch]
        return out

    return run


def onmt_system(
    checkpoint: Path, extra: list[str] | None = None
) -> Callable[[list[str]], list[str]]:
    from onmt.inference_engine import InferenceEnginePY
    from onmt.opts import translate_opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser()
    translate_opts(parser)
    opt = parser.parse_args(
        ["-model", str(checkpoint), "-src", "-", "-output", os.devnull, "-beam_size", str(BEAM), "-batch_size", str(BATCH),
         "-length_penalty", "none", "-max_length_ratio", "0", "-max_length", str(MAX_LEN),
         *(extra or [])]
    )  # fmt: skip
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    engine = InferenceEnginePY(opt)

    def run(lines: list[str]) -> list[str]:
        with redirect_stdout(io.StringIO()):
            _, preds = engine.infer_list(lines)
        return [p[0] for p in preds]

    return run


def joey_system(config: Path) -> Callable[[list[str]], list[str]]:
    from joeynmt.hub_interface import TranslatorHubInterface, _from_pretrained

    install_set_vocabulary()  # Joey NMT 2.3.0's sentencepiece tokenizer on sentencepiece 0.2
    cfg = yaml.safe_load(config.read_text())
    model_dir = Path(cfg["model_dir"])
    for side in ("src", "trg"):
        cfg["data"][side]["voc_file"] = str(model_dir / f"{side}_vocab.txt")
    cfg["testing"].update(beam_size=BEAM, max_output_length=MAX_LEN)
    run_cfg = model_dir / "bench.yaml"
    run_cfg.write_text(yaml.safe_dump(cfg))
    model, data, args = _from_pretrained(model_dir, cfg_file=run_cfg)
    hub = TranslatorHubInterface(model, data, args)

    def run(lines: list[str]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(lines), BATCH):
            out += hub.translate(lines[i : i + BATCH], beam_size=BEAM, max_output_length=MAX_LEN)
        return out

    return run


def prepare(work: Path) -> list[dict[str, Any]]:
    """Train (once; reused from --work) and import the four models."""
    task = work / "task"
    if not (task / "test.src").exists():
        toolkits.make_task(task)
    models = []
    for name, options in ONMT_MODELS.items():
        out = work / f"onmt_{name}"
        ckpt = out / "model_step_300.pt"
        if not ckpt.exists():
            toolkits.train_onmt(task, out, options, steps=300)
        bundle = out / "bundle"
        if not bundle.exists():
            cli.main(["opennmt-py", "--checkpoint", str(ckpt), "--out", str(bundle), "--int8"])
        models.append({"toolkit": "opennmt-py", "model": name, "bundle": bundle, "ckpt": ckpt})
    for name, model in JOEY_MODELS.items():
        out = work / f"joey_{name}"
        config = out / "config.yaml"
        if not (out / "model" / "best.ckpt").exists():
            config, _ = toolkits.train_joey(task, out, model, epochs=5)
        bundle = out / "bundle"
        if not bundle.exists():
            cli.main(["joeynmt", "--config", str(config), "--checkpoint",
                      str(out / "model" / "best.ckpt"), "--out", str(bundle), "--int8"])  # fmt: skip
        models.append({"toolkit": "joeynmt", "model": name, "bundle": bundle, "config": config})
    return models


@dataclass(frozen=True)
class BibleSetup:
    """How the Bible models are sized and trained (the toolkits' own option names)."""

    onmt: dict[str, Any]  # model and training options of onmt_train
    joey: dict[str, Any]  # Joey NMT's model section
    joey_training: dict[str, Any]  # settings of Joey NMT's training section
    steps: int  # OpenNMT-py training steps
    epochs: int  # Joey NMT epochs
    pieces: int  # SentencePiece vocabulary / subword-nmt merges, per language


# brief: small, as the 2 shared cores allow (OpenNMT-py: about 0.3-1.4 s a step here): embeddings
# 64, bi-GRU 2 x 64, GRU decoder 128, mlp / Bahdanau attention, no input feeding; a few minutes.
BRIEF_ONMT = {**ONMT_MODELS["gru"], "hidden_size": 128, "word_vec_size": 64}
BRIEF_JOEY = {
    "encoder": {
        **JOEY_MODELS["gru"]["encoder"],
        "embeddings": {"embedding_dim": 64},
        "hidden_size": 64,
    },
    "decoder": {
        **JOEY_MODELS["gru"]["decoder"],
        "embeddings": {"embedding_dim": 64},
        "hidden_size": 128,
    },
}
# full: the scale (OpenNMT-py, 256-unit bi-LSTM, general attention, 4k pieces per side,
# 2,500 steps: about 12 minutes on 2 cores), about 12 minutes each on one thread (OpenNMT-py: 0.55 s
# a step, so 1,300 steps, about 12 epochs; Joey NMT: about 100 s an epoch, so 7 epochs, validated
# every 250 steps), each toolkit's own RNN defaults apart from size, one layer:
# OpenNMT-py brnn LSTM 256 (2 x 128), general attention, input feeding, dropout 0.3 (its defaults);
# Joey NMT bi-GRU 2 x 128, GRU decoder 256, Bahdanau attention, input feeding, bridge, no dropout
# (its defaults); embeddings 256; Adam at 0.002, gradient norm clipped at 5 (OpenNMT-py's default)
# for both; batches of 2,048 tokens (OpenNMT-py, about 53 verses) and 4,096 padded tokens (Joey NMT
# counts the padding: about 50 verses). Joey NMT without clipping, 2,048 tokens, stayed at the
# unigram solution (7% accuracy, every dev verse a few "▁" pieces) for 3 epochs.
FULL_ONMT = {"encoder_type": "brnn", "hidden_size": 256, "word_vec_size": 256,
             "enc_layers": 1, "dec_layers": 1}  # fmt: skip
FULL_JOEY = {
    "encoder": {"type": "recurrent", "embeddings": {"embedding_dim": 256}, "hidden_size": 128,
                "bidirectional": True},
    "decoder": {"type": "recurrent", "embeddings": {"embedding_dim": 256}, "hidden_size": 256},
}  # fmt: skip
FULL_JOEY_TRAINING = {"learning_rate": 0.002, "clip_grad_norm": 5.0, "batch_size": 4096,
                      "batch_type": "token", "validation_freq": 150, "logging_freq": 50}  # fmt: skip
BIBLE_SETUPS = {
    "brief": BibleSetup(
        onmt={**BRIEF_ONMT, "batch_size": 1024},
        joey=BRIEF_JOEY,
        joey_training={"learning_rate": 0.01},
        steps=400,
        epochs=4,
        pieces=2000,
    ),
    "full": BibleSetup(
        onmt={**FULL_ONMT, "batch_size": 2048, "report_every": 250},
        joey=FULL_JOEY,
        joey_training=FULL_JOEY_TRAINING,
        steps=1300,
        epochs=7,
        pieces=4000,
    ),
}


def bible_task(data: Path, work: Path) -> Path:
    """The split under the toolkits' file names (src = Greek, tgt = English; dev as valid)."""
    task = work / "task"
    task.mkdir(parents=True, exist_ok=True)
    for ours, theirs in (("train", "train"), ("valid", "dev"), ("test", "test")):
        for side, lang in (("src", "grc"), ("tgt", "en")):
            link = task / f"{ours}.{side}"
            if not link.exists():
                link.symlink_to((data / f"{theirs}.{lang}").resolve())
    return task


def bible_segmenters(task: Path, work: Path, tokenizer: str, pieces: int) -> tuple[Path, Path]:
    """One subword model per language (made once; reused from --work)."""
    made = []
    for side in ("src", "tgt"):
        if tokenizer == "sentencepiece":
            path = work / f"spm_{side}.model"
            if not path.exists():
                toolkits.train_sentencepiece(task / f"train.{side}", path.with_suffix(""), pieces)
        else:
            path = work / f"bpe_{side}.codes"
            if not path.exists():
                toolkits.learn_bpe(task / f"train.{side}", path, pieces)
        made.append(path)
    return made[0], made[1]


def _timed(out: Path, train: Callable[[], object]) -> None:
    """Run `train`, writing its wall-clock seconds to out/train_seconds.txt."""
    started = time.perf_counter()
    train()
    (out / "train_seconds.txt").write_text(f"{time.perf_counter() - started:.0f}\n")


def prepare_bible(
    data: Path,
    work: Path,
    tokenizers: tuple[str, ...] = ("sentencepiece", "bpe"),
    setup: BibleSetup = BIBLE_SETUPS["brief"],
    toolkit_names: tuple[str, ...] = ("opennmt-py", "joeynmt"),
) -> list[dict[str, Any]]:
    """Train (once; reused from --work) and import one model per toolkit and tokenizer."""
    task = bible_task(data, work)
    models = []
    for tokenizer in tokenizers:
        src_model, tgt_model = bible_segmenters(task, work, tokenizer, setup.pieces)
        if "opennmt-py" in toolkit_names:
            models.append(_bible_onmt(task, work, tokenizer, (src_model, tgt_model), setup))
        if "joeynmt" in toolkit_names:
            models.append(_bible_joey(task, work, tokenizer, (src_model, tgt_model), setup))
    return models


def _bible_onmt(
    task: Path, work: Path, tokenizer: str, segmenters: tuple[Path, Path], setup: BibleSetup
) -> dict[str, Any]:
    out = work / f"onmt_{tokenizer}"
    options = {"transforms": [tokenizer], "batch_type": "tokens", "bucket_size": 8192,
               "learning_rate": 0.002, "src_subword_model": str(segmenters[0]),
               "tgt_subword_model": str(segmenters[1]), "src_seq_length": 200,
               "tgt_seq_length": 200, **setup.onmt}  # fmt: skip
    ckpt = out / f"model_step_{setup.steps}.pt"
    if not ckpt.exists():
        _timed(out, lambda: toolkits.train_onmt(task, out, options, steps=setup.steps))
    bundle = out / "bundle"
    if not bundle.exists():
        cli.main(["opennmt-py", "--checkpoint", str(ckpt), "--out", str(bundle), "--int8"])
    return {"toolkit": "opennmt-py", "model": f"{tokenizer}", "tokenizer": tokenizer,
            "bundle": bundle, "ckpt": ckpt, "extra": toolkits.onmt_transform_args(options)}  # fmt: skip


def _bible_joey(
    task: Path, work: Path, tokenizer: str, segmenters: tuple[Path, Path], setup: BibleSetup
) -> dict[str, Any]:
    out = work / f"joey_{tokenizer}"
    config = out / "config.yaml"
    kind = "sentencepiece" if tokenizer == "sentencepiece" else "subword-nmt"
    if not (out / "model" / "best.ckpt").exists():
        key = "model_file" if tokenizer == "sentencepiece" else "codes"
        sides = {side: {"level": "bpe", "tokenizer_type": kind, "max_length": 200,
                        "tokenizer_cfg": {key: str(model)}}
                 for side, model in zip(("src", "trg"), segmenters, strict=True)}  # fmt: skip
        _timed(
            out,
            lambda: toolkits.train_joey(
                task, out, setup.joey, setup.epochs, sides, setup.joey_training
            ),
        )
    bundle = out / "bundle"
    if not bundle.exists():
        cli.main(["joeynmt", "--config", str(config), "--checkpoint",
                  str(out / "model" / "best.ckpt"), "--out", str(bundle), "--int8"])  # fmt: skip
    return {"toolkit": "joeynmt", "model": kind, "tokenizer": kind, "bundle": bundle,
            "config": config}  # fmt: skip


def time_systems(
    systems: dict[str, Callable[[list[str]], list[str]]], lines: list[str], repeats: int
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Sentences/s of each system (median of `repeats` interleaved rounds, after a warm-up on 64
    lines) and each system's outputs of the last round."""
    times: dict[str, list[float]] = {k: [] for k in systems}
    outputs: dict[str, list[str]] = {}
    for name, system in systems.items():  # warm-up
        outputs[name] = system(lines[:64])
    for _ in range(repeats):  # interleaved
        for name, system in systems.items():
            start = time.perf_counter()
            outputs[name] = system(lines)
            times[name].append(time.perf_counter() - start)
    speeds = {name: round(len(lines) / statistics.median(times[name]), 1) for name in systems}
    return speeds, outputs


def measure(
    models: list[dict[str, Any]], lines: list[str], repeats: int, thread_counts: tuple[int, ...]
) -> list[dict[str, Any]]:
    rows = []
    for m in models:
        toolkit = (
            onmt_system(m["ckpt"], m.get("extra"))
            if m["toolkit"] == "opennmt-py"
            else joey_system(m["config"])
        )
        for threads in thread_counts:
            torch.set_num_threads(threads)
            systems = {
                "ours": ours(m["bundle"], threads, int8=False),
                "ours_int8": ours(m["bundle"], threads, int8=True),
                m["toolkit"]: toolkit,
            }
            speeds, outputs = time_systems(systems, lines, repeats)
            row: dict[str, Any] = {"toolkit": m["toolkit"], "model": m["model"], "threads": threads}
            for name in systems:
                row[f"{name}_sent_per_s"] = speeds[name]
            tool = row[f"{m['toolkit']}_sent_per_s"]
            row["speedup"] = round(row["ours_sent_per_s"] / tool, 2)
            row["speedup_int8"] = round(row["ours_int8_sent_per_s"] / tool, 2)
            same = sum(a == b for a, b in zip(outputs["ours"], outputs[m["toolkit"]], strict=True))
            row["identical_outputs"] = f"{same}/{len(lines)}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("runs/import_bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--bible", type=Path, help="the grc-en split: subword models on the Bible")
    parser.add_argument("--tokenizers", default="sentencepiece,bpe", help="with --bible")
    parser.add_argument("--toolkits", default="opennmt-py,joeynmt", help="with --bible")
    parser.add_argument(
        "--setup", choices=sorted(BIBLE_SETUPS), default="brief", help="with --bible: model sizes"
    )
    parser.add_argument(
        "--only", help="with --bible: prepare the models and stop (no timing)", action="store_true"
    )
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)
    torch.set_num_threads(1)
    tokenizers = tuple(args.tokenizers.split(","))
    if args.bible:
        setup, names = BIBLE_SETUPS[args.setup], tuple(args.toolkits.split(","))
        models = prepare_bible(args.bible, args.work, tokenizers, setup, names)
    else:
        models = prepare(args.work)
    if args.only:
        return 0
    lines = toolkits.read_lines(args.work / "task" / "test.src")
    threads = tuple(int(t) for t in args.threads.split(","))
    rows = measure(models, lines, args.repeats, threads)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
