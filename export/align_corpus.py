"""s2s-align-corpus: two plain-text files in, Pharaoh word links out, no gold needed.

    s2s-align-corpus --source corpus.grc --target corpus.en --out corpus.links [--minutes 60]
                     [--bundle models/my-aligner] [--work corpus.links.work] [--config my.toml]
                     [--links head|teacher]

1. checks the corpus as s2s-train does (export/data/parallel.py: the file and line of different
   line counts, a sentence facing an empty line, text that is not UTF-8) and refuses one of fewer
   than MIN_PAIRS pairs;
2. eflomal's links over every pair, both directions, grow-diag-final-and, 5 runs voting, each
   target word left unaligned joined to its nearest aligned neighbour's source words
   (export/train/teacher.py);
3. a translation model whose attention those links guide, within its share of --minutes
   (export/train/train.py; every 20th pair, at most 500, held out to choose the checkpoint);
4. the ONNX bundle and its link head, trained on the same silver links (export/link_head.py);
5. every line of the corpus aligned by the bundle's link head (`Align`, links "head"), one
   Pharaoh line per input line (0-based source-target over whitespace words; an empty line for a
   line empty on both sides) into --out.

--links teacher writes the teacher's links of stage 2 instead (eflomal as the recipe runs it), in a
few minutes: no model is trained unless --bundle asks for one (on the Greek New Testament a little
further from the gold than the head's, docs/align.md).

Everything lives in --work (default: OUT.work): run the same command again after an interruption
and it goes on from the last finished stage (the translation model from its last checkpoint, the
alignment from the last pair written). --bundle keeps the bundle for `s2s-align` and `s2s-serve`.
--config takes a TOML whose [model], [data], [optim], [link_head] and [alignment] tables replace
the default recipe's (DEFAULT_RECIPE, the one of configs/grc-en-nt-silver.toml; a table left out
keeps the recipe's); the command fills in [corpus], the teacher (eflomal), [bundle] and the time
limits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from tqdm import tqdm

from export.data.parallel import CorpusConfig, CorpusError, SplitSpec, load_split, read_lines
from export.link_head import load_engine, train_link_head
from export.pipeline import export_and_evaluate, with_links
from export.train.link_head import LinkHeadConfig
from export.train.teacher import AlignmentConfig
from export.train.train import BundleConfig, DataConfig, OptimConfig, TrainConfig, train
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions

MIN_PAIRS = 200  # below it the translation model learns too little for its states to help
DEV_EVERY, DEV_MAX = 20, 500
# Shares of --minutes: the translation model, then the link head; the rest for eflomal, export
# and aligning the corpus.
TRAIN_SHARE, HEAD_SHARE = 0.6, 0.2
ALIGN_CHUNK = 64
DEFAULT_RECIPE: dict[str, Any] = {
    "model": {
        "emb_dim": 256,
        "enc_hidden": 256,
        "dec_hidden": 256,
        "attn_dim": 256,
        "rnn": "gru",
        "attention": "additive",
        "decoder_style": "cgru",
        "dropout": 0.3,
    },
    "data": {"src_vocab": 3000, "tgt_vocab": 2000},
    "optim": {
        "lr": 0.002,
        "max_tokens": 2500,
        "label_smoothing": 0.1,
        "max_steps": 100000,
        "max_epochs": 200,
        "threads": 1,
        "eval_every": 200,
        "patience": 6,
        "lr_decay": 0.7,
        "seed": 1,
        "guided_alignment": 1.0,
    },
    "link_head": {"epochs": 6, "threads": 1},
    # the teacher of configs/grc-en-nt-silver.toml (export/train/teacher.py): words compared by
    # their first letters, 5 eflomal runs voting, unaligned target words joined to a neighbour's
    "alignment": {
        "source_prefix_len": 5,
        "target_prefix_len": 4,
        "runs": 5,
        "min_votes": 2,
        "attach_unaligned": "right",
    },
}
TABLES = ("model", "data", "optim", "link_head", "alignment")


class Stage:
    """The overall progress: which stage, and the minutes left of the budget."""

    def __init__(self, minutes: float, total: int = 5) -> None:
        self.minutes, self.total, self.start = minutes, total, time.monotonic()

    def left(self) -> float:
        return self.minutes - (time.monotonic() - self.start) / 60

    def say(self, number: int, what: str) -> None:
        tqdm.write(
            f"[{number}/{self.total}] {what} ({self.left():.1f} of {self.minutes:g} min left)"
        )


def read_corpus(source: Path, target: Path) -> tuple[list[tuple[str, str]], list[bool]]:
    """The pairs to train on and, per input line, whether it holds a pair (False: blank on both
    sides). CorpusError naming the file and line for what s2s-train refuses, or too few pairs."""
    split = load_split(SplitSpec("corpus", source, target))
    kept = [bool(s.split()) for s in read_lines(source)]  # load_split checked the other side
    if len(split.pairs) < MIN_PAIRS:
        raise CorpusError(
            f"{source} and {target} hold {len(split.pairs)} sentence pairs: too few to train an "
            f"aligner on (at least {MIN_PAIRS}); eflomal-align or fast_align work on any size"
        )
    return split.pairs, kept


def dev_indices(n: int) -> set[int]:
    """The pairs held out as dev: every DEV_EVERY-th, at most DEV_MAX."""
    return set(list(range(DEV_EVERY - 1, n, DEV_EVERY))[:DEV_MAX])


def write_splits(pairs: list[tuple[str, str]], folder: Path) -> CorpusConfig:
    """train and dev files under folder (dev: every DEV_EVERY-th pair, at most DEV_MAX)."""
    folder.mkdir(parents=True, exist_ok=True)
    dev_ids = dev_indices(len(pairs))
    parts = {
        "train": [p for i, p in enumerate(pairs) if i not in dev_ids],
        "dev": [pairs[i] for i in sorted(dev_ids)],
    }
    splits = {}
    for name, rows in parts.items():
        src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
        src.write_text("".join(s + "\n" for s, _ in rows), encoding="utf-8")
        tgt.write_text("".join(t + "\n" for _, t in rows), encoding="utf-8")
        splits[name] = SplitSpec(name, src, tgt)
    return CorpusConfig(splits=splits)


def recipe(config: Path | None) -> dict[str, Any]:
    if config is None:
        return json.loads(json.dumps(DEFAULT_RECIPE))
    raw = tomllib.loads(config.read_text(encoding="utf-8"))
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        raise ValueError(f"{config}: unknown tables {unknown} ({', '.join(TABLES)})")
    default = recipe(None)
    return {k: dict(raw[k]) if k in raw else default[k] for k in TABLES}


def make_config(
    raw: dict[str, Any], corpus: CorpusConfig, minutes: float, name: str
) -> TrainConfig:
    """The run's TrainConfig: the recipe with the corpus, eflomal's links and the time limits."""
    optim = OptimConfig(**{**raw["optim"], "max_minutes": max(1.0, TRAIN_SHARE * minutes)})
    head = LinkHeadConfig.from_dict({**raw["link_head"], "max_minutes": HEAD_SHARE * minutes})
    return TrainConfig(
        model=dict(raw["model"]),
        data=DataConfig(**raw["data"]),
        optim=optim,
        corpus=corpus,
        bundle=BundleConfig(name=name, version="1.0.0", credits="links by eflomal (silver)"),
        link_head=head,
        alignment=AlignmentConfig.from_dict({**raw["alignment"], "teacher": "eflomal"}),
    )


def digest(source: Path, target: Path) -> str:
    h = hashlib.sha256()
    for path in (source, target):
        h.update(path.read_bytes())
    return h.hexdigest()


def align_all(
    bundle: Path, pairs: list[tuple[str, str]], kept: list[bool], out: Path, threads: int = 1
) -> None:
    """One Pharaoh line per input line into out, by the bundle's link head, written through
    `<out>.partial` and resumed from its last complete line."""
    partial = out.with_name(out.name + ".partial")
    done = partial.read_bytes().count(b"\n") if partial.is_file() else 0
    pair_of_line = [-1] * len(kept)  # the pair index of every input line (-1: blank)
    n = 0
    for line, k in enumerate(kept):
        if k:
            pair_of_line[line], n = n, n + 1
    engine = load_engine(bundle, threads)
    options = AlignOptions(links="head")
    first = sum(1 for i in pair_of_line[:done] if i >= 0)
    with (
        partial.open("a", encoding="utf-8") as f,
        tqdm(total=len(pairs), initial=first, desc="aligning", unit="pair") as bar,
    ):
        line = done
        while line < len(kept):
            chunk: list[int] = []  # input lines of this chunk
            while line < len(kept) and sum(pair_of_line[i] >= 0 for i in chunk) < ALIGN_CHUNK:
                chunk.append(line)
                line += 1
            todo = [pairs[pair_of_line[i]] for i in chunk if pair_of_line[i] >= 0]
            results = iter(align(engine, todo, options) if todo else [])
            f.write(
                "".join(
                    (next(results).pharaoh if pair_of_line[i] >= 0 else "") + "\n" for i in chunk
                )
            )
            f.flush()
            bar.update(len(todo))
    partial.replace(out)


def write_teacher_links(data: Path, kept: list[bool], out: Path) -> None:
    """One Pharaoh line per input line into out, the teacher's links (the train and dev splits'
    files under data, put back in the corpus's order as write_splits took them apart)."""
    train = read_lines(data / "train.eflomal.pharaoh")
    dev = read_lines(data / "dev.eflomal.pharaoh")
    n = len(train) + len(dev)
    dev_ids = dev_indices(n)
    if len(dev_ids) != len(dev):
        raise RuntimeError(f"{data} holds {len(dev)} dev lines, the corpus split {len(dev_ids)}")
    train_lines, dev_lines = iter(train), iter(dev)
    pair_links = (next(dev_lines) if i in dev_ids else next(train_lines) for i in range(n))
    partial = out.with_name(out.name + ".partial")
    partial.write_text(
        "".join((next(pair_links) if k else "") + "\n" for k in kept), encoding="utf-8"
    )
    partial.replace(out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The five stages of the module's docstring; returns what they measured."""
    stage = Stage(args.minutes)
    work: Path = args.work or args.out.with_name(args.out.name + ".work")
    stage.say(1, f"checking {args.source} and {args.target}")
    pairs, kept = read_corpus(args.source, args.target)
    work.mkdir(parents=True, exist_ok=True)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    corpus_hash = digest(args.source, args.target)
    if state and state.get("corpus_sha256") != corpus_hash:
        raise CorpusError(f"{work} holds a run over other files: remove it, or give another --work")
    state.setdefault("corpus_sha256", corpus_hash)
    state.setdefault("minutes", args.minutes)
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    tqdm.write(
        f"{len(pairs)} pairs ({len(kept) - len(pairs)} lines blank on both sides kept blank)"
    )
    corpus = write_splits(pairs, work / "corpus")
    cfg = make_config(recipe(args.config), corpus, float(state["minutes"]), args.name)
    run_dir = work / "run"
    stage.say(
        2, f"eflomal's links, both directions, grow-diag-final-and, {cfg.alignment.runs} runs"
    )
    cfg, source = with_links(cfg, run_dir)
    bundle = run_dir / "bundle"
    head_json = run_dir / "link_head" / "link_head.json"
    if args.links == "head" or args.bundle is not None:
        if not (run_dir / "summary.json").is_file():
            minutes = cfg.optim.max_minutes
            stage.say(3, f"training the translation model (at most {minutes:.0f} min)")
            train(cfg, run_dir, resume=(run_dir / "last.pt").is_file())
        if not head_json.is_file():
            stage.say(4, "exporting the bundle and training its link head on the silver links")
            export_and_evaluate(cfg, run_dir, bundle)
            assert cfg.link_head is not None and cfg.corpus is not None
            train_link_head(cfg.corpus, cfg.link_head, bundle, run_dir / "link_head", source)
    if args.links == "teacher":
        stage.say(5, f"writing the teacher's links of {len(pairs)} pairs into {args.out}")
        write_teacher_links(run_dir / "data", kept, args.out)
    else:
        stage.say(5, f"aligning {len(pairs)} pairs into {args.out}")
        align_all(bundle, pairs, kept, args.out)
    if args.bundle is not None:
        if args.bundle.exists():
            shutil.rmtree(args.bundle)
        shutil.copytree(bundle, args.bundle)
        tqdm.write(f"kept the bundle in {args.bundle}")
    summary: dict[str, Any] = {"pairs": len(pairs), "out": str(args.out), "links": args.links}
    if head_json.is_file():
        summary["silver_dev_aer_of_the_head"] = json.loads(head_json.read_text())["dev_aer"]
    return summary | {
        "links_source": source,
        "minutes": round(stage.minutes - stage.left(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--source", type=Path, required=True, help="source sentences, one a line")
    p.add_argument("--target", type=Path, required=True, help="their translations, line by line")
    p.add_argument("--out", type=Path, required=True, help="Pharaoh links, one line per pair")
    p.add_argument("--minutes", type=float, default=60.0, help="time budget (default %(default)s)")
    p.add_argument("--bundle", type=Path, help="keep the trained bundle here")
    p.add_argument(
        "--links",
        choices=("head", "teacher"),
        default="head",
        help="whose links go into --out: the trained link head's (default), or the teacher's "
        "(eflomal as the recipe runs it: no model is trained unless --bundle asks for one)",
    )
    p.add_argument("--work", type=Path, help="working folder (default: OUT.work)")
    p.add_argument(
        "--config", type=Path, help="a recipe TOML: [model] [data] [optim] [link_head] [alignment]"
    )
    p.add_argument("--name", default="aligner", help="the bundle's model name")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    try:
        summary = run(args)
    except (CorpusError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
