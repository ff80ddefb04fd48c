"""Evaluation reports: markdown tables and plots of one run's or several runs' scores, and reading
a run's metrics.json back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.metrics.scoring import EvaluationError

METRICS_FILE = "metrics.json"
BUCKETS_FILE = "buckets.md"
BLEU_PLOT_FILE = "bleu_by_length.png"
HEATMAP_FILE = "attention_heatmap.png"
COMPARE_FILE = "compare.md"


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


ALIGNMENT_COLUMNS = (
    ("phrase_accuracy", "phrase acc. %"),
    ("word_accuracy", "word acc. %"),
    ("word_recall", "recall %"),
    ("aer", "AER %"),
    ("off_by_plus_one", "off by +1 %"),
    ("off_by_minus_one", "off by -1 %"),
    ("on_previous_target", "on previous target word %"),
)


def alignment_markdown(alignment: dict[str, Any], title: str) -> str:
    """A markdown table of the attention's agreement with gold links, overall and per family."""
    head = ["family", "sentences", "target words scored", *(h for _, h in ALIGNMENT_COLUMNS)]
    lines = [
        f"## Alignments against gold: {title}",
        "",
        f"Forced decoding of the reference; gold: `{alignment.get('gold', '?')}`. Word accuracy "
        "is the share of target words whose argmax source word is a gold link (AER: sure = "
        "possible = gold, alignment = those argmax links); off by ±1: a wrong argmax one source "
        "word after/before a gold one; on previous target word: a wrong argmax on the gold source "
        "of the target word before (attention lagging one step behind).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    rows = [*alignment.get("by_family", {}).items(), ("**all**", alignment)]
    for name, row in rows:
        counts = row["counts"]
        cells = [name, str(counts["sentences"]), str(counts["scored_words"])]
        cells += [_fmt(row[key]) for key, _ in ALIGNMENT_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    if alignment.get("skipped"):
        lines += ["", f"{alignment['skipped']} sentences skipped (pieces not mergeable to words)."]
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
