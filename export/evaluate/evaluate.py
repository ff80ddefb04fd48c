"""Evaluate a checkpoint on a test split: BLEU, chrF and exact match, overall and by source length,
plus an attention heatmap for one sentence; `compare` lines up several runs' BLEU by length.

    python -m export.evaluate.evaluate --checkpoint runs/default/best.pt --tokenizers runs/default \
        --test runs/default/data/test.tsv --out docs/eval/default \
        [--heatmap-index 0 | --heatmap-text "..."] [--train runs/default/data/train.tsv]
        [--gold runs/default/data/test.gold.jsonl | --no-gold]

    python -m export.evaluate.evaluate compare --runs docs/eval/default docs/eval/none \
        --labels attention none --out docs/eval/compare

    python -m export.evaluate.evaluate g2p ...   (a G2P model's WER and PER: see export/evaluate/g2p_eval.py)

Evaluation writes metrics.json, buckets.md, bleu_by_length.png and attention_heatmap.png (not for
attention "none" models) into --out; compare writes compare.md and bleu_by_length.png. This module
is the command line: the scores are export/metrics/scoring.py's, the reports export/evaluate/report.py's, the
greedy decoding export/train/greedy.py's.
Source length is counted in source SentencePiece tokens; decoding is greedy.

With a gold alignment sidecar (--gold, by default <test>.gold.jsonl beside --test when it exists),
metrics.json's "alignment" and buckets.md also hold the attention's agreement with the gold links:
phrase and word accuracy, recall, AER, the share of links one source word off (+1, -1) and of links
on the previous target word's source (attention lagging one step behind), measured by
forced decoding of the reference (export/evaluate/alignment_eval.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from export.data import corpus
from export.data.gold import GoldLinks, gold_path_for, read_gold
from export.evaluate.alignment_eval import evaluate_alignments
from export.evaluate.report import (
    BLEU_PLOT_FILE,
    BUCKETS_FILE,
    COMPARE_FILE,
    HEATMAP_FILE,
    METRICS_FILE,
    alignment_markdown,
    buckets_markdown,
    compare_markdown,
    plot_attention,
    plot_bleu_by_length,
    read_metrics,
)
from export.metrics.scoring import DEFAULT_EDGES, EvaluationError, compute_metrics, make_buckets
from export.train.checkpoint import CheckpointError, load_checkpoint
from export.train.greedy import greedy_with_attention, translate_greedy
from export.train.model import Seq2Seq
from service.model.tokenizer import Tokenizer, TokenizerError

# --- the evaluate command ----------------------------------------------------------------------


def read_split(path: Path) -> list[tuple[str, str]]:
    """A TSV split, with read errors as EvaluationError."""
    try:
        return corpus.read_tsv(path)
    except (OSError, ValueError) as err:
        raise EvaluationError(f"cannot read {path}: {err}") from err


def load_tokenizers(folder: Path, model: Seq2Seq) -> tuple[Tokenizer, Tokenizer]:
    """source.model and target.model from `folder`, checked against the model's vocabulary sizes."""
    src_tok, tgt_tok = (
        Tokenizer.load(folder / "source.model"),
        Tokenizer.load(folder / "target.model"),
    )
    for side, tok, size in (
        ("source", src_tok, model.cfg.src_vocab_size),
        ("target", tgt_tok, model.cfg.tgt_vocab_size),
    ):
        if tok.vocab_size != size:
            raise EvaluationError(
                f"{tok.path} has {tok.vocab_size} pieces but the checkpoint's {side} vocabulary is {size}: "
                "pass the tokenizers the model was trained with"
            )
    return src_tok, tgt_tok


def longest_source(path: Path, src_tok: Tokenizer) -> int:
    """Length in source tokens of the longest source sentence of a split."""
    return max((len(src_tok.encode(s)) for s, _ in read_split(path)), default=0)


def gold_file(args: argparse.Namespace) -> Path | None:
    """--gold, else the sidecar beside --test when it exists; None with --no-gold."""
    if args.no_gold:
        return None
    if args.gold is not None:
        if not args.gold.is_file():
            raise EvaluationError(f"gold alignment file not found: {args.gold}")
        return Path(args.gold)
    beside = gold_path_for(args.test)
    return beside if beside.is_file() else None


def read_gold_file(path: Path) -> list[GoldLinks]:
    """A gold sidecar, with read errors as EvaluationError."""
    try:
        return read_gold(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EvaluationError(f"cannot read gold alignments {path}: {err}") from err


def heatmap_source(
    args: argparse.Namespace, test: Sequence[tuple[str, str]]
) -> tuple[str, str] | None:
    """(description, source text) for the heatmap, or None when none is wanted."""
    if args.no_heatmap:
        return None
    if args.heatmap_text is not None:
        return "given text", args.heatmap_text
    if not 0 <= args.heatmap_index < len(test):
        raise EvaluationError(
            f"--heatmap-index {args.heatmap_index} is outside the test split (0..{len(test) - 1})"
        )
    return f"test sentence {args.heatmap_index}", test[args.heatmap_index][0]


def write_heatmap(
    model: Seq2Seq, src_tok: Tokenizer, tgt_tok: Tokenizer, text: str, what: str, path: Path
) -> dict[str, Any]:
    """Decode `text` greedily and plot its attention; returns what was plotted."""
    src_ids = src_tok.encode(text)
    tgt_ids, weights = greedy_with_attention(model, src_ids)  # (T_y, T_x)
    src_pieces = src_tok.pieces(src_ids) or ["<pad>"]  # an empty source still has one position
    tgt_pieces = ["</s>" if i == model.cfg.eos_id else tgt_tok.pieces([i])[0] for i in tgt_ids]
    hypothesis = tgt_tok.decode([i for i in tgt_ids if i != model.cfg.eos_id])
    title = f"{what}: {hypothesis}"
    plot_attention(
        weights, src_pieces, tgt_pieces, path, title if len(title) <= 90 else title[:89] + "…"
    )
    return {"what": what, "source": text, "hypothesis": hypothesis, "path": path.name}


def run_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Decode the test split, score it, write the reports; returns the metrics."""
    buckets = make_buckets(args.bucket_edges)
    model, extra = load_checkpoint(args.checkpoint)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device)
    src_tok, tgt_tok = load_tokenizers(args.tokenizers, model)
    test = read_split(args.test)
    if not test:
        raise EvaluationError(f"{args.test} holds no sentence pairs")
    heatmap = heatmap_source(args, test)
    gold_path = gold_file(args)
    gold = read_gold_file(gold_path) if gold_path is not None else None
    max_train = longest_source(args.train, src_tok) if args.train else None
    sources = [src_tok.encode(s) for s, _ in test]
    hyps = translate_greedy(model, sources, tgt_tok, device, batch_size=args.batch_size)
    metrics = {
        "checkpoint": str(args.checkpoint),
        "test": str(args.test),
        "decoding": "greedy",
        "model": model.cfg.to_dict(),
        "checkpoint_step": extra.get("step"),
        **compute_metrics(
            [len(s) for s in sources], hyps, [t for _, t in test], buckets, max_train
        ),
    }
    if gold is not None and gold_path is not None and model.cfg.attention != "none":
        metrics["alignment"] = {
            "gold": str(gold_path),
            "decoding": "forced (reference target)",
            **evaluate_alignments(
                model, src_tok, tgt_tok, test, gold, args.batch_size, device=device
            ),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.label or f"{model.cfg.attention} attention"
    if heatmap is not None and model.cfg.attention == "none":
        print("note: no attention heatmap for an attention 'none' model", file=sys.stderr)
    elif heatmap is not None:
        metrics["heatmap"] = write_heatmap(
            model, src_tok, tgt_tok, heatmap[1], heatmap[0], args.out / HEATMAP_FILE
        )
    (args.out / METRICS_FILE).write_text(
        json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    markdown = buckets_markdown(metrics, name)
    if "alignment" in metrics:
        markdown += "\n" + alignment_markdown(metrics["alignment"], name)
    (args.out / BUCKETS_FILE).write_text(markdown, encoding="utf-8")
    plot_bleu_by_length(
        [(name, metrics)], args.out / BLEU_PLOT_FILE, f"BLEU by source length: {name}"
    )
    return metrics


def parse_edges(text: str) -> tuple[int, ...]:
    """'10,20,30' → (10, 20, 30)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from err


def evaluate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.evaluate.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="a best.pt written by training")
    p.add_argument(
        "--tokenizers", type=Path, required=True, help="folder with source.model and target.model"
    )
    p.add_argument("--test", type=Path, required=True, help="test split, source<TAB>target")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument(
        "--train",
        type=Path,
        help="training split, to mark buckets beyond the longest training source",
    )
    p.add_argument(
        "--heatmap-index",
        type=int,
        default=0,
        help="test sentence to plot attention for (default 0)",
    )
    p.add_argument(
        "--heatmap-text", help="source text to plot attention for, instead of a test sentence"
    )
    p.add_argument("--no-heatmap", action="store_true", help="skip the attention heatmap")
    p.add_argument(
        "--gold",
        type=Path,
        help="gold alignment sidecar of --test (default: <test>.gold.jsonl beside it, if present)",
    )
    p.add_argument("--no-gold", action="store_true", help="skip the alignment evaluation")
    p.add_argument(
        "--bucket-edges",
        type=parse_edges,
        default=DEFAULT_EDGES,
        help="bucket upper bounds in source tokens (default 10,20,30,40,50)",
    )
    p.add_argument("--label", help="name of the model in titles (default: its attention kind)")
    p.add_argument("--batch-size", type=int, default=200, help="sentences per greedy batch")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    return p


# --- the compare command ---------------------------------------------------------------------


def run_compare(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Read each run's metrics and write the comparison table and plot."""
    labels = args.labels or [str(p) for p in args.runs]
    if len(labels) != len(args.runs):
        raise EvaluationError(
            f"got {len(args.runs)} runs but {len(labels)} labels: give one label per run"
        )
    runs = [(label, read_metrics(path)) for label, path in zip(labels, args.runs, strict=True)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / COMPARE_FILE).write_text(compare_markdown(runs), encoding="utf-8")
    plot_bleu_by_length(runs, args.out / BLEU_PLOT_FILE, "BLEU by source length")
    return runs


def compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.evaluate.evaluate compare",
        description="Compare several runs' BLEU by source length.",
    )
    p.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        required=True,
        help="metrics.json files or folders holding one",
    )
    p.add_argument("--labels", nargs="+", help="one name per run (default: the paths)")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    return p


# --- entry point -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`compare ...` compares runs; anything else evaluates one checkpoint."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["g2p"]:
            from export.evaluate import g2p_eval  # the G2P task's metrics, in their own module

            return g2p_eval.main(argv[1:])
        if argv[:1] == ["compare"]:
            args = compare_parser().parse_args(argv[1:])
            run_compare(args)
            print(f"wrote {args.out / COMPARE_FILE} and {args.out / BLEU_PLOT_FILE}")
            return 0
        args = evaluate_parser().parse_args(argv)
        metrics = run_evaluate(args)
    except (CheckpointError, TokenizerError, EvaluationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(metrics["overall"]))
    if "alignment" in metrics:
        print(json.dumps({k: v for k, v in metrics["alignment"].items() if k != "by_family"}))
    print(
        f"wrote {METRICS_FILE}, {BUCKETS_FILE}, {BLEU_PLOT_FILE}"
        + (f", {HEATMAP_FILE}" if "heatmap" in metrics else "")
        + f" into {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
