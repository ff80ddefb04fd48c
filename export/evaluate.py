"""Evaluate a checkpoint on a test split: BLEU, chrF and exact match, overall and by source length,
plus an attention heatmap for one sentence; `compare` lines up several runs' BLEU by length.

    python -m export.evaluate --checkpoint runs/default/best.pt --tokenizers runs/default \
        --test runs/default/data/test.tsv --out docs/eval/default \
        [--heatmap-index 0 | --heatmap-text "..."] [--train runs/default/data/train.tsv]

    python -m export.evaluate compare --runs docs/eval/default docs/eval/none \
        --labels attention none --out docs/eval/compare

    python -m export.evaluate g2p ...   (a G2P model's WER and PER: see export/g2p_eval.py)

Evaluation writes metrics.json, buckets.md, bleu_by_length.png and attention_heatmap.png (not for
attention "none" models) into --out; compare writes compare.md and bleu_by_length.png.
Source length is counted in source SentencePiece tokens; decoding is greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import torch

from export import corpus
from export.checkpoint import CheckpointError, load_checkpoint
from export.data import make_batch
from export.model import Seq2Seq
from export.train import translate_greedy
from service.tokenizer import Tokenizer, TokenizerError

# Bucket upper bounds in source tokens: 1-10, 11-20, 21-30, 31-40, 41-50, 51+.
DEFAULT_EDGES: tuple[int, ...] = (10, 20, 30, 40, 50)
METRICS_FILE = "metrics.json"
BUCKETS_FILE = "buckets.md"
BLEU_PLOT_FILE = "bleu_by_length.png"
HEATMAP_FILE = "attention_heatmap.png"
COMPARE_FILE = "compare.md"


class EvaluationError(ValueError):
    """Bad evaluation input: an unreadable split, a mismatched tokenizer, an index out of range."""


# --- length buckets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """Source lengths lo..hi in tokens, inclusive; hi None means open-ended."""

    lo: int
    hi: int | None

    @property
    def label(self) -> str:
        return f"{self.lo}+" if self.hi is None else f"{self.lo}-{self.hi}"


def make_buckets(edges: Sequence[int] = DEFAULT_EDGES) -> list[Bucket]:
    """Edges (10, 20) → buckets 1-10, 11-20, 21+."""
    if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
        raise EvaluationError(
            f"bucket edges must be increasing positive integers, got {list(edges)}"
        )
    los = [1, *(e + 1 for e in edges)]
    his: list[int | None] = [*edges, None]
    return [Bucket(lo, hi) for lo, hi in zip(los, his, strict=True)]


def bucket_index(length: int, buckets: Sequence[Bucket]) -> int:
    """Index of the bucket holding `length` (an empty source counts in the first bucket)."""
    for i, b in enumerate(buckets):
        if b.hi is None or length <= b.hi:
            return i
    raise AssertionError("the last bucket is open-ended")


def beyond_train(bucket: Bucket, n_beyond: int, max_train_len: int | None) -> str | None:
    """'all' if the whole bucket is longer than any training source, 'some' if part of it, else 'none'."""
    if max_train_len is None:
        return None
    if bucket.lo > max_train_len:
        return "all"
    return "some" if n_beyond > 0 else "none"


# --- scores ------------------------------------------------------------------------------------


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF (sacrebleu defaults) and exact match in %; None scores when empty."""
    n = len(hyps)
    if n == 0:
        return {"n": 0, "bleu": None, "chrf": None, "exact_match": None}
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score
    chrf = sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score
    exact = 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs, strict=True)) / n
    return {"n": n, "bleu": round(bleu, 2), "chrf": round(chrf, 2), "exact_match": round(exact, 2)}


def bucket_scores(
    lengths: Sequence[int],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[Bucket],
    max_train_len: int | None,
) -> list[dict[str, Any]]:
    """One row per bucket: its range, scores, and how much of it lies beyond the training lengths."""
    members: list[list[int]] = [[] for _ in buckets]
    for i, length in enumerate(lengths):
        members[bucket_index(length, buckets)].append(i)
    rows = []
    for bucket, idx in zip(buckets, members, strict=True):
        n_beyond = sum(lengths[i] > max_train_len for i in idx) if max_train_len is not None else 0
        rows.append(
            {
                "label": bucket.label,
                "lo": bucket.lo,
                "hi": bucket.hi,
                **score([hyps[i] for i in idx], [refs[i] for i in idx]),
                "n_beyond_train": n_beyond if max_train_len is not None else None,
                "beyond_train": beyond_train(bucket, n_beyond, max_train_len),
            }
        )
    return rows


def compute_metrics(
    lengths: Sequence[int],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[Bucket],
    max_train_len: int | None,
) -> dict[str, Any]:
    """Overall scores and per-bucket scores of one system's outputs."""
    return {
        "overall": score(hyps, refs),
        "max_train_source_len": max_train_len,
        "buckets": bucket_scores(lengths, hyps, refs, buckets, max_train_len),
    }


# --- decoding with attention -------------------------------------------------------------------


@torch.no_grad()
def greedy_with_attention(
    model: Seq2Seq, src_ids: Sequence[int], max_len: int | None = None
) -> tuple[list[int], np.ndarray]:
    """Greedy-decode one sentence; returns target ids (ending with EOS if produced) and weights (T_y, T_x).

    Row t holds the attention used to emit target token t (all zeros for attention "none").
    """
    model.eval()
    cfg = model.cfg
    device = next(model.parameters()).device
    batch = make_batch([(list(src_ids), [])]).to(device)  # src (1, T_x)
    enc = model.encode(batch.src, batch.lengths)
    max_len = max_len if max_len is not None else 2 * len(src_ids) + 10
    token = torch.tensor([cfg.bos_id], device=device)  # (1,)
    state = enc.state  # (1, state_dim)
    ids: list[int] = []
    rows: list[torch.Tensor] = []
    for _ in range(max_len):
        logits, state, weights = model.decode_step(token, state, enc.keys, enc.values, enc.mask)
        token = logits.argmax(-1)  # (1,)
        ids.append(int(token))
        rows.append(weights[0])  # (T_x,)
        if ids[-1] == cfg.eos_id:
            break
    return ids, torch.stack(rows).cpu().numpy()  # (T_y, T_x)


# --- markdown ----------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _beyond_mark(row: dict[str, Any]) -> str:
    mark = row.get("beyond_train")
    if mark == "all":
        return "all"
    if mark == "some":
        return f"{row['n_beyond_train']} of {row['n']}"
    return ""


def buckets_markdown(metrics: dict[str, Any], title: str) -> str:
    """A markdown table of one run: BLEU, chrF and exact match per source-length bucket."""
    has_train = metrics.get("max_train_source_len") is not None
    head = ["source tokens", "sentences", "BLEU", "chrF", "exact match %"]
    head += ["beyond train"] if has_train else []
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in [*metrics["buckets"], {**metrics["overall"], "label": "**all**"}]:
        cells = [
            row["label"],
            str(row["n"]),
            _fmt(row["bleu"]),
            _fmt(row["chrf"]),
            _fmt(row["exact_match"]),
        ]
        cells += [_beyond_mark(row)] if has_train else []
        lines.append("| " + " | ".join(cells) + " |")
    if has_train:
        lines += ["", f"Longest training source: {metrics['max_train_source_len']} tokens."]
    return "\n".join(lines) + "\n"


def compare_markdown(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A markdown table with BLEU per bucket (rows) per run (columns), sentence counts in brackets."""
    labels = bucket_labels(runs)
    head = ["source tokens", *(name for name, _ in runs)]
    lines = [
        "## BLEU by source length",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for label in labels:
        cells = [label + _compare_mark(runs, label)]
        for _, metrics in runs:
            row = next((r for r in metrics["buckets"] if r["label"] == label), None)
            cells.append("–" if row is None else f"{_fmt(row['bleu'])} ({row['n']})")
        lines.append("| " + " | ".join(cells) + " |")
    overall = [f"{_fmt(m['overall']['bleu'])} ({m['overall']['n']})" for _, m in runs]
    lines.append("| **all** | " + " | ".join(overall) + " |")
    if any(_compare_mark(runs, label) for label in labels):
        lines += ["", "† some or all of the bucket is longer than any training source."]
    return "\n".join(lines) + "\n"


def bucket_labels(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Bucket labels of all runs, in first-seen order."""
    labels: list[str] = []
    for _, metrics in runs:
        labels += [r["label"] for r in metrics["buckets"] if r["label"] not in labels]
    return labels


def _compare_mark(runs: Sequence[tuple[str, dict[str, Any]]], label: str) -> str:
    beyond = any(
        r["label"] == label and r.get("beyond_train") in ("all", "some")
        for _, m in runs
        for r in m["buckets"]
    )
    return " †" if beyond else ""


# --- plots (matplotlib, Agg backend) -----------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bleu_by_length(runs: Sequence[tuple[str, dict[str, Any]]], path: Path, title: str) -> None:
    """One line per run: BLEU against source-length bucket; empty buckets are left out."""
    plt = _pyplot()
    labels = bucket_labels(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, metrics in runs:
        by_label = {r["label"]: r["bleu"] for r in metrics["buckets"] if r["bleu"] is not None}
        xs = [i for i, label in enumerate(labels) if label in by_label]
        ax.plot(xs, [by_label[labels[i]] for i in xs], marker="o", label=name)
    beyond = [i for i, label in enumerate(labels) if _compare_mark(runs, label)]
    for i in beyond:
        ax.axvspan(i - 0.5, i + 0.5, color="0.9", zorder=0)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_ylim(0, 100)
    shaded = "; shaded: holds sources longer than any in training" if beyond else ""
    ax.set_xlabel("source length (tokens)" + shaded)
    ax.set_ylabel("BLEU")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(
    weights: np.ndarray,
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    path: Path,
    title: str,
) -> None:
    """Heatmap of weights (T_y, T_x): source pieces on x, target pieces on y, as in Bahdanau et al."""
    plt = _pyplot()
    T_y, T_x = weights.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.3 * T_x + 2.0), max(3.0, 0.3 * T_y + 1.5)))
    image = ax.imshow(weights, cmap="Blues", aspect="auto", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(T_x), list(src_pieces), rotation=90)
    ax.set_yticks(range(T_y), list(tgt_pieces))
    ax.set_xlabel("source pieces")
    ax.set_ylabel("target pieces (greedy output)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention weight")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    (args.out / BUCKETS_FILE).write_text(buckets_markdown(metrics, name), encoding="utf-8")
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
        prog="python -m export.evaluate",
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
        "--bucket-edges",
        type=parse_edges,
        default=DEFAULT_EDGES,
        help="bucket upper bounds in source tokens (default 10,20,30,40,50)",
    )
    p.add_argument("--label", help="name of the model in titles (default: its attention kind)")
    p.add_argument("--batch-size", type=int, default=200, help="sentences per greedy batch")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    return p


# --- the compare command -----------------------------------------------------------------------


def read_metrics(path: Path) -> dict[str, Any]:
    """A metrics.json, given the file or the folder holding it."""
    file = path / METRICS_FILE if path.is_dir() else path
    try:
        metrics = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EvaluationError(f"cannot read metrics from {file}: {err}") from err
    if not isinstance(metrics, dict) or "buckets" not in metrics or "overall" not in metrics:
        raise EvaluationError(
            f"{file} is not an evaluation metrics.json (expected 'overall' and 'buckets')"
        )
    return metrics


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
        prog="python -m export.evaluate compare",
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
            from export import g2p_eval  # the G2P task's metrics, in their own module

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
    print(
        f"wrote {METRICS_FILE}, {BUCKETS_FILE}, {BLEU_PLOT_FILE}"
        + (f", {HEATMAP_FILE}" if "heatmap" in metrics else "")
        + f" into {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
