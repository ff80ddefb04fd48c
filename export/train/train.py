"""Train a model from a TOML config: corpus → tokenizers → teacher-forced training → best checkpoint.

    s2s-train --config configs/default.toml --out runs/default

Writes into --out: the corpus splits (when generated), source/target SentencePiece models,
`best.pt` (highest dev BLEU, or lowest dev WER with `optim.select_by = "wer"`) and
`train_log.jsonl`. The run ends at the first limit reached (optim.max_steps, optim.max_minutes,
optim.patience or optim.max_epochs); which one is printed, is the last line of `train_log.jsonl`
and is `ended_by` in `summary.json` and in best.pt's metadata.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import sacrebleu
import torch
from torch import nn
from tqdm import tqdm

from export.data import corpus, families, g2p, parallel, reversal
from export.data.gold import gold_path_for, read_gold, write_gold
from export.data.tokenizer import SpmOptions, train_joint_tokenizer, train_tokenizers
from export.metrics.g2p_metrics import word_error_rate
from export.train.checkpoint import (
    load_checkpoint,
    load_training_state,
    save_checkpoint,
    save_training_state,
)
from export.train.data import Batch, batches, encode_pairs
from export.train.greedy import translate_greedy
from export.train.guided import guided_loss, piece_guide
from export.train.link_head import LinkHeadConfig
from export.train.model import Seq2Seq, count_parameters
from export.train.teacher import AlignmentConfig
from service.model.architecture import PAD_ID, ModelConfig
from service.model.tokenizer import Tokenizer

TASKS = ("translation", "reversal")
LAST = "last.pt"  # the latest state of a run, for --resume


@dataclass(frozen=True)
class DataConfig:
    """Either TSV files (train/dev/test), the generated demo corpus (generate_seed set) or the
    CMUdict G2P corpus split by word (cmudict_seed set; see export/data/g2p.py). A plain-text
    parallel corpus is the config's [corpus] table instead (export/data/parallel.py).

    task = "reversal" trains on export/data/reversal.py's task instead (seeded by generate_seed, sizes
    n_train/n_dev/n_test, reversal_max_len words at most), written with its exact gold links."""

    task: str = "translation"  # "translation" (the sources below) or "reversal"
    reversal_max_len: int = 12
    train: str = ""
    dev: str = ""
    test: str = ""
    generate_seed: int | None = None
    n_train: int = 40000
    n_dev: int = 500
    n_test: int = 1000
    n_test_long: int = 200
    cmudict_seed: int | None = None
    src_vocab: int = 320
    tgt_vocab: int = 400
    # Weights of sentences of 1, 2, 3, ... phrases in the generated train/dev/test splits.
    part_weights: tuple[float, ...] = corpus.PART_WEIGHTS
    # Draw weights of value families by name (export/data/families.py FAMILIES); unnamed ones keep theirs.
    family_weights: dict[str, float] = field(default_factory=dict)
    # Lower-case every source sentence (tokenizer training, training, evaluation, the run's data/
    # files); the exported bundle then declares "input": {"lowercase": true}, so serving does too.
    lowercase_source: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "part_weights", tuple(float(w) for w in self.part_weights))
        if not self.part_weights or min(self.part_weights) < 0 or sum(self.part_weights) <= 0:
            raise ValueError(
                f"part_weights must be non-negative with a positive sum, got {self.part_weights}"
            )
        families.family_weights(self.family_weights)  # unknown names fail here, at load time


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-3
    max_tokens: int = 3000  # target tokens per batch, padding included
    clip_norm: float = 1.0
    label_smoothing: float = 0.0
    max_steps: int = 0  # the training budget in optimizer steps (reproducible); 0 = no step limit
    max_minutes: float = 20.0  # a wall-clock safety stop
    max_epochs: int = 50
    eval_every: int = 250  # steps
    patience: int = 4  # evaluations without dev-BLEU gain before stopping
    lr_decay: float = 0.5  # multiply the learning rate on each evaluation without gain
    min_lr: float = 5e-5
    seed: int = 1
    # A run directory to continue from: its init_checkpoint's weights and its tokenizers (a second stage,
    # e.g. at a lower learning rate); "" = a fresh model and new tokenizers.
    init_from: str = ""
    init_checkpoint: str = "best.pt"  # the file of init_from whose weights start the run
    # Train everything but the encoder (encoder.*): a later stage that keeps the encoder states a
    # link head reads (export/link_head.py) and the encoder checkpoint averaging keeps.
    freeze_encoder: bool = False
    select_by: str = "bleu"  # the dev score that picks best.pt: "bleu" (higher) or "wer" (lower)
    threads: int = 0  # torch intra-op threads; 0 = torch's default. 1 is robust when other jobs share the cores
    # Weight of the guided-alignment loss (export/train/guided.py) against the gold sidecar of the
    # training split; 0 = attention learns from the translation loss alone.
    guided_alignment: float = 0.0

    def __post_init__(self) -> None:
        if self.select_by not in ("bleu", "wer"):
            raise ValueError(f"select_by must be 'bleu' or 'wer', got {self.select_by!r}")
        if self.guided_alignment < 0:
            raise ValueError(f"guided_alignment must be >= 0, got {self.guided_alignment}")


@dataclass(frozen=True)
class TokenizerConfig:
    """[tokenizer.source] and [tokenizer.target]: SentencePiece options per side (sizes are in
    [data]); `[tokenizer] joint_vocab = N` trains one model of N pieces on both sides instead
    (with [tokenizer.source]'s options), shared by source and target."""

    source: SpmOptions = field(default_factory=SpmOptions)
    target: SpmOptions = field(default_factory=SpmOptions)
    joint_vocab: int = 0  # 0 = a model per side, sized by [data] src_vocab / tgt_vocab

    def __post_init__(self) -> None:
        if self.joint_vocab < 0:
            raise ValueError(f"[tokenizer] joint_vocab must be >= 0, got {self.joint_vocab}")


@dataclass(frozen=True)
class BundleConfig:
    """[bundle]: the name and version the exported bundle's manifest carries (the pipeline's
    export step, export/pipeline.py); int8 also writes a quantized decoder."""

    name: str = "seq2seq"
    version: str = "0.1.0"
    int8: bool = False
    credits: str = ""  # the data's sources and licences, recorded in the manifest's info
    # [bundle.decoding]: the model's default decoding options (the manifest's "decoding"), chosen
    # on dev; a request's own values and the server's --default-* flags are overridden/kept as
    # service/serve/protocol.py's default_options says
    decoding: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields except the vocab sizes
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # [corpus]: plain-text files (export/data/parallel.py), instead of [data]'s sources
    corpus: parallel.CorpusConfig | None = None
    bundle: BundleConfig | None = None  # [bundle]: export after training (export/pipeline.py)
    # [link_head]: after export, train the bundle's link head on [corpus]'s gold (export/link_head.py)
    link_head: LinkHeadConfig | None = None
    # [alignment]: where those links come from, gold files or eflomal (export/train/teacher.py)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        sections = {
            "model",
            "data",
            "optim",
            "tokenizer",
            "corpus",
            "bundle",
            "link_head",
            "alignment",
        }
        unknown = sorted(set(raw) - sections)
        if unknown:
            raise ValueError(f"{path}: unknown sections {unknown}")
        tok = dict(raw.get("tokenizer", {}))
        unknown = sorted(set(tok) - {"source", "target", "joint_vocab"})
        if unknown:
            raise ValueError(f"{path}: unknown [tokenizer] keys {unknown}")
        corpus_cfg = (
            parallel.CorpusConfig.from_dict(raw["corpus"], f"{path}: [corpus]")
            if "corpus" in raw
            else None
        )
        if corpus_cfg is not None and "dev" not in corpus_cfg.splits:
            raise ValueError(f"{path}: [corpus] has no [corpus.dev] split to choose checkpoints on")
        return cls(
            model=dict(raw.get("model", {})),
            data=_build(DataConfig, raw.get("data", {}), path),
            optim=_build(OptimConfig, raw.get("optim", {}), path),
            tokenizer=TokenizerConfig(
                source=_build(SpmOptions, tok.get("source", {}), path),
                target=_build(SpmOptions, tok.get("target", {}), path),
                joint_vocab=int(tok.get("joint_vocab", 0)),
            ),
            corpus=corpus_cfg,
            bundle=_build(BundleConfig, raw["bundle"], path) if "bundle" in raw else None,
            link_head=(
                LinkHeadConfig.from_dict(dict(raw["link_head"])) if "link_head" in raw else None
            ),
            alignment=AlignmentConfig.from_dict(dict(raw.get("alignment", {}))),
        )

    def to_json(self) -> dict[str, Any]:
        """The config as JSON-able values (paths as strings): what checkpoints record."""
        return cast(dict[str, Any], json.loads(json.dumps(asdict(self), default=str)))


def _build(cls: type, values: dict[str, Any], path: str | Path) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown} for {cls.__name__}")
    return cls(**values)


def prepare_parallel(
    cfg: parallel.CorpusConfig, lowercase: bool, out: Path, say: Any = print
) -> dict[str, list[tuple[str, str]]]:
    """Read and check the [corpus] files, say what each split kept and skipped, and write each
    split under out/data as TSV with its gold sidecar (what the guided loss and s2s-evaluate read).
    Sources are lower-cased when `lowercase`."""
    loaded = parallel.load_corpus(cfg)
    (out / "data").mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[tuple[str, str]]] = {}
    for name, split in loaded.items():
        say(f"corpus {split.report.line()}")
        pairs = lowercase_sources(split.pairs) if lowercase else split.pairs
        corpus.write_tsv(out / "data" / f"{name}.tsv", pairs)
        write_gold(out / "data" / f"{name}.gold.jsonl", split.gold_links())
        splits[name] = pairs
    return splits


def prepare_corpus(
    cfg: DataConfig, out: Path, corpus_cfg: parallel.CorpusConfig | None = None
) -> dict[str, list[tuple[str, str]]]:
    """Load the [corpus] files or the TSV splits, or generate the demo corpus (and write it, with
    its gold sidecar, under out/data). Sources are lower-cased when `cfg.lowercase_source` (the
    written files too: they are what the model saw)."""
    if corpus_cfg is not None:
        return prepare_parallel(corpus_cfg, cfg.lowercase_source, out, tqdm.write)
    if cfg.task not in TASKS:
        raise ValueError(f"[data] task must be one of {TASKS}, got {cfg.task!r}")
    if cfg.task == "reversal":
        splits = reversal.generate(
            cfg.generate_seed or 0, cfg.n_train, cfg.n_dev, cfg.n_test, cfg.reversal_max_len
        )
        reversal.write_splits(out / "data", splits)
        return splits
    if cfg.generate_seed is not None:
        examples = corpus.generate_examples(
            cfg.generate_seed,
            cfg.n_train,
            cfg.n_dev,
            cfg.n_test,
            cfg.n_test_long,
            part_weights=cfg.part_weights,
            weights=cfg.family_weights or None,
        )
        if cfg.lowercase_source:
            examples = {name: [e.lowercased() for e in split] for name, split in examples.items()}
        (out / "data").mkdir(parents=True, exist_ok=True)
        for name, split in examples.items():
            corpus.write_split(out / "data", name, split)
        return {name: [e.pair for e in split] for name, split in examples.items()}
    if cfg.cmudict_seed is not None:
        splits = g2p.cmudict_splits(cfg.cmudict_seed)
        (out / "data").mkdir(parents=True, exist_ok=True)
        for name, pairs in splits.items():
            corpus.write_tsv(out / "data" / f"{name}.tsv", pairs)
        return splits
    splits = {
        name: corpus.read_tsv(getattr(cfg, name))
        for name in ("train", "dev", "test")
        if getattr(cfg, name)
    }
    if cfg.lowercase_source:
        splits = {name: lowercase_sources(pairs) for name, pairs in splits.items()}
    return splits


def lowercase_sources(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The declared source normalization (service/model/input_rule.py's lowercase): str.lower()."""
    return [(s.lower(), t) for s, t in pairs]


def train_step(
    model: Seq2Seq,
    batch: Batch,
    loss_fn: nn.Module,
    opt: torch.optim.Optimizer,
    clip: float,
    guide_weight: float = 0.0,
) -> float:
    model.train()
    logits, attention = model.teacher_forced(batch.src, batch.lengths, batch.tgt_in)  # (B, T, ·)
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch.tgt_out.reshape(-1))
    if guide_weight and batch.guide is not None:
        loss = loss + guide_weight * guided_loss(attention, batch.guide)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def train_guides(
    cfg: DataConfig,
    out: Path,
    examples: list[tuple[list[int], list[int]]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
) -> list[np.ndarray | None]:
    """The piece-level gold attention of every training example, from the training split's gold
    sidecar: out/data/train.gold.jsonl for generated tasks, else beside the [data] train file."""
    path = gold_path_for(Path(cfg.train)) if cfg.train else out / "data" / "train.gold.jsonl"
    if not path.is_file():
        raise ValueError(f"optim.guided_alignment needs the training split's gold links: no {path}")
    gold = read_gold(path)
    if len(gold) != len(examples):
        raise ValueError(f"{path} has {len(gold)} lines but the training split {len(examples)}")
    guides = [
        piece_guide(links, src_tok.pieces(s), tgt_tok.pieces(t))
        for links, (s, t) in zip(gold, examples, strict=True)
    ]
    misfit = sum(g is None and bool(links.words) for g, links in zip(guides, gold, strict=True))
    guided = sum(g is not None and bool(g.any()) for g in guides)
    tqdm.write(
        f"guided alignment: {guided} of {len(guides)} training pairs guided; {misfit} pairs' "
        "links do not fit their tokenized words and go unguided"
    )
    return guides


def budget_spent(o: OptimConfig, step: int, minutes: float) -> str | None:
    """Which training budget is spent after `step` steps and `minutes` minutes: "max_steps",
    "max_minutes" (a wall-clock safety stop that can cut a run short of its max_steps), or None.
    The step budget wins a tie, since it is the one that makes a run reproducible."""
    if step == o.max_steps:
        return "max_steps"
    if minutes >= o.max_minutes:
        return "max_minutes"
    return None


def describe_end(o: OptimConfig, ended_by: str, step: int, minutes: float) -> str:
    """One line saying which limit ended the run, and what to change when it was not the one asked for."""
    line = f"training ended by {ended_by} at step {step} after {minutes:.2f} min"
    if ended_by == "max_minutes" and o.max_steps:
        return (
            f"{line}: max_minutes ({o.max_minutes:g}) ran out before max_steps ({o.max_steps}); "
            "raise --max-minutes (optim.max_minutes) to train for the full step budget"
        )
    if ended_by == "patience":
        return f"{line}: no dev-BLEU gain in {o.patience} evaluations (optim.patience)"
    return line


def minutes_left(o: OptimConfig, step: int, minutes: float, steps_per_epoch: int) -> float:
    """The time left before the first budget runs out, at the speed so far (the progress line)."""
    per_step = minutes / max(step, 1)
    left = [o.max_minutes - minutes]
    if o.max_steps:
        left.append((o.max_steps - step) * per_step)
    left.append((o.max_epochs * steps_per_epoch - step) * per_step)
    return max(0.0, min(left))


def make_tokenizers(
    cfg: TrainConfig, train_pairs: list[tuple[str, str]], out: Path
) -> tuple[Path, Path]:
    """out/source.model and out/target.model: copied from optim.init_from, one joint model
    ([tokenizer] joint_vocab) or one per side."""
    if cfg.optim.init_from:
        return cast(
            tuple[Path, Path],
            tuple(
                Path(shutil.copyfile(Path(cfg.optim.init_from) / f"{s}.model", out / f"{s}.model"))
                for s in ("source", "target")
            ),
        )
    if cfg.tokenizer.joint_vocab:
        return train_joint_tokenizer(
            train_pairs, out, cfg.tokenizer.joint_vocab, cfg.tokenizer.source
        )
    return train_tokenizers(
        train_pairs,
        out,
        cfg.data.src_vocab,
        cfg.data.tgt_vocab,
        cfg.tokenizer.source,
        cfg.tokenizer.target,
    )


@dataclass
class Progress:
    """The counters a run carries between evaluations, saved in last.pt for --resume."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already trained
    best: float = -float("inf")
    stale: int = 0
    minutes: float = 0.0  # training minutes before this process (earlier, resumed runs)
    last_eval: int = -1
    epoch_rng: Any = None  # the batch order's random state at the start of `epoch`
    loss_sum: float = 0.0  # training loss since the last evaluation
    loss_steps: int = 0


def train(cfg: TrainConfig, out: Path, quiet: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run training; returns a summary (best dev BLEU, steps, minutes, paths). With `resume`,
    continue from out/last.pt (the weights, optimizer, step, budgets spent and batch order of the
    run that wrote it) instead of starting afresh."""
    o = cfg.optim
    random.seed(o.seed)
    torch.manual_seed(o.seed)
    if o.threads:
        torch.set_num_threads(o.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    if resume and not (out / LAST).is_file():
        raise ValueError(f"--resume: no {out / LAST} to continue from (was the run started?)")
    splits = prepare_corpus(cfg.data, out, cfg.corpus)
    if resume:  # the tokenizers the run was trained with, not new ones
        src_path, tgt_path = out / "source.model", out / "target.model"
    else:
        src_path, tgt_path = make_tokenizers(cfg, splits["train"], out)
    src_tok, tgt_tok = Tokenizer.load(src_path), Tokenizer.load(tgt_path)
    model, model_cfg = build_model(cfg, src_tok, tgt_tok, device, resume)
    train_examples = encode_pairs(splits["train"], src_tok, tgt_tok)
    guides = (
        train_guides(cfg.data, out, train_examples, src_tok, tgt_tok)
        if o.guided_alignment
        else None
    )
    opt = torch.optim.Adam([w for w in model.parameters() if w.requires_grad], lr=o.lr)
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_ID, label_smoothing=o.label_smoothing)
    rng = random.Random(o.seed)
    p = Progress(epoch_rng=rng.getstate())
    if resume:
        p = resume_from(out / LAST, model, opt, model_cfg)
        rng.setstate(p.epoch_rng)
        tqdm.write(f"resuming {out} at step {p.step} (epoch {p.epoch}, {p.minutes:.1f} min done)")
    else:
        (out / "train_log.jsonl").write_text("")
    started = time.monotonic() - p.minutes * 60  # minutes count across resumed runs
    run = Run(cfg, out, model, opt, splits["dev"], src_tok, tgt_tok, device, p, started, quiet)
    ended_by = train_epochs(run, train_examples, guides, loss_fn, rng)
    return finish(run, ended_by)


def build_model(
    cfg: TrainConfig, src_tok: Tokenizer, tgt_tok: Tokenizer, device: torch.device, resume: bool
) -> tuple[Seq2Seq, ModelConfig]:
    """The model for the tokenizers' vocabularies: initialized from optim.init_from (unless
    resuming: last.pt's weights come later), its encoder frozen with optim.freeze_encoder."""
    o = cfg.optim
    model_cfg = ModelConfig(
        src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size, **cfg.model
    )
    model = Seq2Seq(model_cfg).to(device)
    if o.init_from and not resume:
        start, _ = load_checkpoint(Path(o.init_from) / o.init_checkpoint)
        if start.cfg != model_cfg:
            raise ValueError(
                f"{o.init_from}/{o.init_checkpoint} is a {start.cfg}, the config asks for {model_cfg}"
            )
        model.load_state_dict(start.state_dict())
    if o.freeze_encoder:
        model.encoder.requires_grad_(False)
    return model, model_cfg


@dataclass
class Run:
    """A training run's parts, shared by its steps: the model and its optimizer, the dev split
    it is scored on, where it writes, and its counters."""

    cfg: TrainConfig
    out: Path
    model: Seq2Seq
    opt: torch.optim.Optimizer
    dev: list[tuple[str, str]]
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    device: torch.device
    p: Progress
    started: float  # time.monotonic() at the start, less the minutes of earlier (resumed) runs
    quiet: bool
    steps_per_epoch: int = 1  # the current epoch's batches (for the time left)

    @property
    def log_path(self) -> Path:
        return self.out / "train_log.jsonl"

    def minutes(self) -> float:
        """Training minutes so far, earlier runs included."""
        return (time.monotonic() - self.started) / 60

    def log(self, entry: dict[str, Any]) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")


def train_epochs(
    run: Run,
    examples: list[tuple[list[int], list[int]]],
    guides: list[np.ndarray | None] | None,
    loss_fn: nn.Module,
    rng: random.Random,
) -> str:
    """Epochs from the run's counters on, until a limit; returns which limit ended the run."""
    o, p = run.cfg.optim, run.p
    while p.epoch < o.max_epochs:
        p.epoch_rng = rng.getstate()
        epoch_batches = list(batches(examples, o.max_tokens, rng, guides=guides))
        run.steps_per_epoch = len(epoch_batches)
        ended_by = train_epoch(run, epoch_batches[p.batch_in_epoch :], loss_fn)
        if ended_by is not None:
            return ended_by
        p.epoch, p.batch_in_epoch = p.epoch + 1, 0
    if p.last_eval != p.step:
        evaluate_and_checkpoint(run)
    return "max_epochs"


def train_epoch(run: Run, epoch_batches: list[Batch], loss_fn: nn.Module) -> str | None:
    """The epoch's batches not trained yet, evaluated every optim.eval_every steps; returns the
    limit reached (a budget spent, or "patience"), None at the end of the epoch."""
    o, p = run.cfg.optim, run.p
    bar = tqdm(
        epoch_batches,
        desc=f"epoch {p.epoch}",
        disable=run.quiet,
        leave=False,
        mininterval=5.0,
    )
    for batch in bar:
        tick = time.monotonic()
        loss = train_step(
            run.model, batch.to(run.device), loss_fn, run.opt, o.clip_norm, o.guided_alignment
        )
        p.step += 1
        p.batch_in_epoch += 1
        p.loss_sum, p.loss_steps = p.loss_sum + loss, p.loss_steps + 1
        minutes = run.minutes()
        bar.set_postfix(
            step=p.step,
            loss=f"{loss:.3f}",
            tok_s=f"{batch.n_target_tokens / (time.monotonic() - tick):.0f}",
            left=f"{minutes_left(o, p.step, minutes, run.steps_per_epoch):.0f}m",
        )
        spent = budget_spent(o, p.step, minutes)
        if p.step % o.eval_every == 0 or spent:
            stop = evaluate_and_checkpoint(run) or spent is not None
            if stop:
                return spent or "patience"
    return None


def evaluate_and_checkpoint(run: Run) -> bool:
    """Dev score, checkpoint on gain, lr decay on no gain; returns True to stop early."""
    o, p, opt = run.cfg.optim, run.p, run.opt
    by_wer = o.select_by == "wer"
    p.last_eval = p.step
    dev = run.dev
    hyps = translate_greedy(
        run.model, [run.src_tok.encode(s) for s, _ in dev], run.tgt_tok, run.device
    )
    references = [[t for _, t in dev]]
    bleu = float(sacrebleu.corpus_bleu(hyps, references).score)
    # WER over distinct sources: a hypothesis is right when it equals any target of its source
    wer = word_error_rate(dev, hyps)
    minutes = run.minutes()
    # the figures that mean something for the task: WER where whole answers are right or
    # wrong (selecting by it: G2P), chrF beside BLEU for translation
    figures = (
        {"dev_bleu": round(bleu, 2), "dev_wer": round(wer, 2)}
        if by_wer
        else {
            "dev_bleu": round(bleu, 2),
            "dev_chrf": round(float(sacrebleu.corpus_chrf(hyps, references).score), 2),
        }
    )
    entry = {
        "step": p.step,
        "epoch": p.epoch,
        "train_loss": round(p.loss_sum / max(p.loss_steps, 1), 4),
        **figures,
        "lr": opt.param_groups[0]["lr"],
        "minutes": round(minutes, 2),
        "minutes_left": round(minutes_left(o, p.step, minutes, run.steps_per_epoch), 1),
    }
    p.loss_sum, p.loss_steps = 0.0, 0
    gain = -wer if by_wer else bleu
    run.log(entry)
    if not run.quiet:
        tqdm.write(json.dumps(entry))
    stop = False
    if gain > p.best:
        p.best, p.stale = gain, 0
        meta = {"train_config": run.cfg.to_json(), "dev_bleu": bleu, "step": p.step, "dev_wer": wer}
        save_checkpoint(run.out / "best.pt", run.model, meta)
    else:
        p.stale += 1
        for group in opt.param_groups:
            group["lr"] = max(group["lr"] * o.lr_decay, o.min_lr)
        stop = p.stale >= o.patience
    p.minutes = minutes
    save_training_state(run.out / LAST, run.model, opt, asdict(p))
    return stop


def finish(run: Run, ended_by: str) -> dict[str, Any]:
    """The run's last log line and summary.json; best.pt told how the run ended. Returns the
    summary."""
    o, step, best = run.cfg.optim, run.p.step, run.p.best
    minutes = run.minutes()
    run.log({"step": step, "ended_by": ended_by, "minutes": round(minutes, 2)})
    if not run.quiet:
        tqdm.write(describe_end(o, ended_by, step, minutes))
    best_path = run.out / "best.pt"
    if best_path.is_file():  # the checkpoint says how its run ended (it may predate the end)
        best_model, meta = load_checkpoint(best_path)
        save_checkpoint(best_path, best_model, {**meta, "ended_by": ended_by, "last_step": step})
    summary = {
        f"best_dev_{o.select_by}": round(-best if o.select_by == "wer" else best, 2),
        "steps": step,
        "ended_by": ended_by,
        "minutes": round(minutes, 2),
        "parameters": count_parameters(run.model),
        "checkpoint": str(best_path),
    }
    (run.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def resume_from(
    path: Path, model: Seq2Seq, opt: torch.optim.Optimizer, model_cfg: ModelConfig
) -> Progress:
    """Load last.pt's weights and optimizer state into `model` and `opt`; returns its counters."""
    state = load_training_state(path)
    if state.config != model_cfg.to_dict():
        raise ValueError(
            f"{path} was trained as {state.config}, the config now asks for "
            f"{model_cfg.to_dict()}: resume with the config the run started with"
        )
    model.load_state_dict(state.model)
    opt.load_state_dict(state.optimizer)
    counters = dict(state.progress)
    counters["epoch_rng"] = rng_state(counters["epoch_rng"])
    return Progress(**counters)


def rng_state(saved: Any) -> tuple[Any, ...]:
    """random.Random's state back from its saved form (lists where it had tuples)."""
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


def main(argv: list[str] | None = None) -> int:
    parser = train_parser()
    args = parser.parse_args(argv)
    cfg = load_config(args)
    print(json.dumps(train(cfg, args.out, resume=args.resume), indent=2))
    return 0


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="TOML file with [model], [data], [optim]")
    parser.add_argument("--out", required=True, type=Path, help="run directory")
    parser.add_argument("--max-minutes", type=float, help="override optim.max_minutes")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last.pt (weights, optimizer, step, minutes spent)",
    )
    return parser


def load_config(args: argparse.Namespace) -> TrainConfig:
    """The config file, with --max-minutes applied."""
    cfg = TrainConfig.load(args.config)
    if args.max_minutes is not None:
        optim = OptimConfig(**{**asdict(cfg.optim), "max_minutes": args.max_minutes})
        cfg = replace(cfg, optim=optim)
    return cfg


if __name__ == "__main__":
    raise SystemExit(main())
