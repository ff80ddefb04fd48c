"""Train a bundle's link head on a corpus's gold word links and add it to the bundle.

    python -m export.link_head --config configs/grc-en-nt-align.toml --bundle models/grc-en-nt

The config's [corpus] train split must have gold alignments (Pharaoh, over whitespace words); its
dev split, with gold too, chooses the epoch (lowest AER). With a `[link_head.teacher]` table (a
bigger head to learn from, not `[alignment]`'s teacher of the links) and `distil` > 0, that head is
trained first and the head learns its scores beside the links (export/train/link_head.py); the
manifest's info.link_head records both. With `[alignment] teacher = "eflomal"`
(or a corpus without alignment files) the links are eflomal's over [corpus]'s text instead
(export/train/teacher.py, written under <out>/silver; no gold file opened). `[link_head]` (optional) sets the
sizes and schedule (export/train/link_head.py's LinkHeadConfig). The translation model is not
changed: its encoder graph gives the states the head reads. Writes link_head.onnx and
link_lexicon.json into the bundle, re-hashes its manifest, checks the graph against the module,
then aligns dev through the served path (`Align`, links "head") and reports that AER.
s2s-train runs this as its last step when the config has a [link_head] table.

    python -m export.link_head --config C --bundle NEW --from-bundle OLD

carries OLD's head over to NEW instead of training one, for a bundle whose encoder and tokenizers
are OLD's to the byte (a decoder-side stage, `[optim] freeze_encoder`, or a re-export: the head
reads only those), refused otherwise; then aligns dev through NEW as above.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
import tomllib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from export.data.parallel import (
    CorpusConfig,
    CorpusError,
    ParallelSplit,
    SplitSpec,
    load_corpus,
    read_lines,
)
from export.metrics.aer import parse_pharaoh as parse_links
from export.metrics.aer import score_corpus
from export.onnx.link_head import export_link_head, parity_error
from export.train.link_head import Example, LinkHeadConfig, fit_members, predict
from export.train.teacher import (
    AlignmentConfig,
    directional_paths,
    recorded_source,
    resolve_teacher,
    silver_corpus,
)
from service.decode.align import links as link_modes
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.pair_answers import prepare_pair
from service.decode.engine.engine import Engine
from service.decode.runtime.lexicon import Lexicon
from service.decode.runtime.link_head import GRAPH, LEXICON, Thresholds, head_links
from service.decode.shared.alignment import mean_pool
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.model.bundle import LINK_HEAD_FILES, add_files, read_manifest

log = logging.getLogger(__name__)
PARITY_PAIRS = 16
PARITY_TOLERANCE = 1e-3
# The thresholds tried on dev: row 0 links every target word; cell 1.0 adds no second links.
ROW_THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
CELL_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
Link = tuple[int, int]


def load_engine(bundle: Path, threads: int) -> Engine:
    return Engine.load(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=threads),
        EngineLimits(max_source_tokens=4096, max_length=4096),
    )


def gold_pairs(split: ParallelSplit) -> list[tuple[str, str, list[Link]]]:
    """The split's pairs that have gold links."""
    return [(s, t, list(g)) for (s, t), g in zip(split.pairs, split.gold, strict=True) if g]


def agreement_pairs(
    spec: SplitSpec, split: ParallelSplit
) -> tuple[list[tuple[str, str, list[Link]]], list[list[Link]]]:
    """The split's pairs labelled by agreement of eflomal's two directions (the files beside its
    symmetrized links, export/train/teacher.py): the links both propose, and per pair the cells
    only one (or only the symmetrization) proposes, left out of the loss. Pairs with no agreed
    link are left out."""
    if spec.alignments is None:
        raise CorpusError("[link_head] labels = 'agreement' needs eflomal's links ([alignment])")
    fwd_path, rev_path = directional_paths(spec.alignments)
    if not fwd_path.is_file() or not rev_path.is_file():
        raise CorpusError(
            f"[link_head] labels = 'agreement' needs {fwd_path} and {rev_path}: eflomal's two "
            "directions, written by [alignment] teacher = 'eflomal'"
        )
    forward = [parse_links(x) for x in read_lines(fwd_path)]
    reverse = [parse_links(x) for x in read_lines(rev_path)]
    if not len(forward) == len(reverse) == len(split.pairs):
        raise CorpusError(f"{fwd_path} and {rev_path} do not pair with {spec.source} line by line")
    pairs, unlabeled = [], []
    for (s, t), links, f, r in zip(split.pairs, split.gold, forward, reverse, strict=True):
        agreed = f & r
        if agreed:
            pairs.append((s, t, sorted(agreed)))
            unlabeled.append(sorted((f | r | set(links or [])) - agreed))
    return pairs, unlabeled


def make_examples(engine: Engine, pairs: Sequence[tuple[str, str, list[Link]]]) -> list[Example]:
    """Tokenized as Align tokenizes (word by word), the source encoded by the bundle's encoder
    graph; lexicon features are left empty (filled by the caller)."""
    out: list[Example] = []
    for start in range(0, len(pairs), 64):
        chunk = pairs[start : start + 64]
        prepared = [prepare_pair(engine, s, t) for s, t, _ in chunk]
        encoded = engine.encode([p.source for p in prepared])
        for p, rows, (_, _, gold) in zip(prepared, encoded, chunk, strict=True):
            S_w, T_w = len(p.src.words), len(p.tgt.words)
            states = mean_pool(p.src.word_of, S_w) @ rows[0].values  # (S_w, D)
            out.append(
                Example(
                    states=states.astype(np.float32),
                    src_ids=np.array(p.src.ids, np.int64),
                    src_word_of=p.src.word_of,
                    tgt_ids=np.array(p.tgt.ids, np.int64),
                    tgt_word_of=p.tgt.word_of,
                    features=np.zeros((T_w, S_w, 0), np.float32),
                    gold=gold,
                    src_words=p.src.words,
                    tgt_words=p.tgt.words,
                )
            )
    return out


def aer_at(logits: list[np.ndarray], examples: Sequence[Example], thresholds: Thresholds) -> float:
    """AER of the served "head" links at one (row, cell) threshold pair."""
    predicted = [head_links(x, *thresholds) for x in logits]
    return score_corpus(predicted, [set(e.gold) for e in examples]).aer


def best_thresholds(
    logits: list[np.ndarray], examples: Sequence[Example]
) -> tuple[Thresholds, float]:
    """((row, cell), AER) with the lowest AER on the grid."""
    grid = [(r, c) for r in ROW_THRESHOLDS for c in CELL_THRESHOLDS]
    return min(((t, aer_at(logits, examples, t)) for t in grid), key=lambda x: x[1])


def dev_aer(logits: list[np.ndarray], examples: Sequence[Example]) -> float:
    """The epoch's score: its AER at its best thresholds."""
    return best_thresholds(logits, examples)[1]


def head_figures(cfg: LinkHeadConfig, histories: list[list[dict[str, float]]]) -> dict[str, Any]:
    """What the manifest says of how a head (or its teacher) was made: its shape and losses, and
    each member's best dev AER."""
    figures: dict[str, Any] = {
        "hidden": cfg.hidden,
        "passes": cfg.passes,
        "span_loss": cfg.span_loss,
        "members": cfg.members,
        "member_dev_aer": [round(min(e["dev_aer"] for e in h), 4) for h in histories],
    }
    if cfg.distil:
        figures["distil"] = cfg.distil
    return figures


def served_dev_aer(bundle: Path, pairs: Sequence[tuple[str, str, list[Link]]]) -> float:
    """Dev aligned through the bundle as served, links "head"."""
    engine = load_engine(bundle, 1)
    results = align(engine, [(s, t) for s, t, _ in pairs], AlignOptions(links="head"))
    predicted = [link_modes.parse_pharaoh(r.pharaoh) for r in results]
    return score_corpus(predicted, [set(g) for _, _, g in pairs]).aer


def train_link_head(
    corpus_cfg: CorpusConfig,
    head_cfg: LinkHeadConfig,
    bundle: Path,
    out: Path,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train, export into the bundle, check; returns the figures (also in <out>/link_head.json).
    `source` says where the corpus's links came from (export/train/teacher.py's links_source:
    gold files or eflomal with its settings); the manifest's info.link_head records it as
    "links_source" (when not given: the teacher's record beside the train split's alignment file,
    else gold), which ModelInfo's links_source shows."""
    splits = load_corpus(corpus_cfg)
    if "dev" not in splits:
        raise CorpusError(
            "the link head needs a [corpus.dev] split with gold links to choose its epoch"
        )
    train_pairs, dev_pairs = gold_pairs(splits["train"]), gold_pairs(splits["dev"])
    if not train_pairs or not dev_pairs:
        raise CorpusError("the link head needs gold links in both the train and the dev split")
    start = time.monotonic()
    engine = load_engine(bundle, head_cfg.threads)
    unlabeled: list[list[Link]] = []
    if head_cfg.labels == "agreement":
        train_pairs, unlabeled = agreement_pairs(corpus_cfg.splits["train"], splits["train"])
    train, dev = make_examples(engine, train_pairs), make_examples(engine, dev_pairs)
    if head_cfg.labels == "agreement":
        for e, cells in zip(train, unlabeled, strict=True):
            e.unlabeled = cells
    lexicon = Lexicon.from_links((e.src_words, e.tgt_words, e.gold) for e in train)
    for e in dev:
        e.features = lexicon.features(e.src_words, e.tgt_words)
    vocab = (engine.cfg.src_vocab_size, engine.cfg.tgt_vocab_size)
    teacher, taught = None, {}
    if head_cfg.teacher is not None:
        teacher, teacher_histories = fit_members(head_cfg.teacher, train, dev, dev_aer, *vocab)
        taught = {"teacher": head_figures(head_cfg.teacher, teacher_histories)}
        taught["teacher"]["dev_aer"] = round(dev_aer(predict(teacher, dev), dev), 4)
        log.info("link head: the teacher's dev AER %.4f", taught["teacher"]["dev_aer"])
    net, histories = fit_members(
        head_cfg, train, dev, dev_aer, *vocab, partial(predict, teacher) if teacher else None
    )
    logits = predict(net, dev)
    thresholds, best_aer = best_thresholds(logits, dev)
    export_link_head(net, dev[0], bundle / GRAPH)
    lexicon.save(bundle / LEXICON)
    worst = parity_error(net, bundle / GRAPH, dev[:PARITY_PAIRS])
    if worst > PARITY_TOLERANCE:
        raise RuntimeError(
            f"link head graph differs from the module by {worst:.2e} (> {PARITY_TOLERANCE})"
        )
    figures: dict[str, Any] = {
        "train_pairs": len(train),
        "dev_pairs": len(dev),
        "dev_aer": round(best_aer, 4),
        "row_threshold": thresholds[0],
        "cell_threshold": thresholds[1],
        "dev_aer_every_target_word_linked_once": round(aer_at(logits, dev, (0.0, 1.0)), 4),
        "parity_max_abs": worst,
        "minutes": round((time.monotonic() - start) / 60, 1),
        "links_source": source or recorded_source(corpus_cfg.splits["train"].alignments),
        "labels": head_cfg.labels,
        **head_figures(head_cfg, histories),
        "graph_mb": round((bundle / GRAPH).stat().st_size / 1e6, 1),
        **taught,
        "history": histories[0] if len(histories) == 1 else histories,
    }
    add_files(
        bundle,
        [GRAPH, LEXICON],
        info={"link_head": {k: v for k, v in figures.items() if k != "history"}},
        sections={"link_head": {"row_threshold": thresholds[0], "cell_threshold": thresholds[1]}},
    )
    figures["served_dev_aer"] = round(served_dev_aer(bundle, dev_pairs), 4)
    out.mkdir(parents=True, exist_ok=True)
    (out / "link_head.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


# What a link head reads of its bundle: the encoder's states and both sides' pieces.
HEAD_INPUT_FILES = ("encoder.onnx", "source.model", "target.model")


def carry_link_head(
    old: Path, bundle: Path, pairs: Sequence[tuple[str, str, list[Link]]], out: Path
) -> dict[str, Any]:
    """old's link head (files, thresholds, figures) into bundle, whose encoder and tokenizers must
    be old's (ValueError naming the file that differs); returns the figures with bundle's served
    dev AER (also in <out>/link_head.json)."""
    before, after = read_manifest(old), read_manifest(bundle)
    if "link_head" not in before or any(f not in before["files"] for f in LINK_HEAD_FILES):
        raise ValueError(f"{old} has no link head to carry over")
    for name in HEAD_INPUT_FILES:
        if before["files"].get(name) != after["files"].get(name):
            raise ValueError(
                f"{bundle / name} is not {old / name}: the link head reads it, so it must be "
                f"trained again for {bundle} (leave out --from-bundle)"
            )
    for name in LINK_HEAD_FILES:
        shutil.copyfile(old / name, bundle / name)
    figures = dict(before["info"].get("link_head", {}))
    add_files(
        bundle,
        list(LINK_HEAD_FILES),
        info={"link_head": {**figures, "carried_from": str(old)}},
        sections={"link_head": before["link_head"]},
    )
    figures["served_dev_aer"] = round(served_dev_aer(bundle, pairs), 4)
    out.mkdir(parents=True, exist_ok=True)
    (out / "link_head.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def read_config(path: Path) -> tuple[CorpusConfig, LinkHeadConfig]:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    if "corpus" not in raw:
        raise CorpusError(
            f"{path}: no [corpus] table: name the train and dev files with gold links"
        )
    corpus_cfg = CorpusConfig.from_dict(raw["corpus"], f"{path}: [corpus]")
    return corpus_cfg, LinkHeadConfig.from_dict(dict(raw.get("link_head", {})))


def read_alignment(path: Path) -> AlignmentConfig:
    """The config's [alignment] table: with teacher = "eflomal" the head learns eflomal's links
    over [corpus]'s text (export/train/teacher.py), written under <out>/silver."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    return AlignmentConfig.from_dict(dict(raw.get("alignment", {})))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config", type=Path, required=True, help="TOML with [corpus] (and [link_head])"
    )
    p.add_argument("--bundle", type=Path, required=True, help="the bundle to add the head to")
    p.add_argument(
        "--out", type=Path, help="where link_head.json goes (default: runs/<bundle>-link-head)"
    )
    p.add_argument(
        "--from-bundle",
        type=Path,
        help="carry this bundle's link head over instead of training one (same encoder and "
        "tokenizers)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = args.out or Path("runs") / f"{args.bundle.name}-link-head"
    try:
        corpus_cfg, head_cfg = read_config(args.config)
        source = None
        teacher = read_alignment(args.config)
        if resolve_teacher(teacher, corpus_cfg, needs_links=True) == "eflomal":
            corpus_cfg, source = silver_corpus(corpus_cfg, teacher, out / "silver")
        if args.from_bundle:
            splits = load_corpus(corpus_cfg)
            if "dev" not in splits:
                raise CorpusError(
                    "--from-bundle aligns the [corpus.dev] split: the config has none"
                )
            figures = carry_link_head(args.from_bundle, args.bundle, gold_pairs(splits["dev"]), out)
        else:
            figures = train_link_head(corpus_cfg, head_cfg, args.bundle, out, source)
    except (CorpusError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in figures.items() if k != "history"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
