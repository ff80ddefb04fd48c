"""Evaluate a G2P model on a CMUdict split: WER and PER against every pronunciation of each word,
stress kept and removed, overall and by word length; greedy in PyTorch and beam 5 through the
serving engine on the exported bundle (beam search lives there), plus attention heatmaps.

    python -m export.evaluate.evaluate g2p --checkpoint runs/g2p/best.pt --tokenizers runs/g2p \
        --test runs/g2p/data/test.tsv --bundle models/g2p --out docs/eval/g2p

Writes metrics.json, report.md and one alignment_<word>.png per --heatmap-words word into --out.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from export.data.corpus import read_tsv
from export.data.g2p import strip_stress
from export.metrics.g2p_metrics import g2p_scores, references
from export.train.checkpoint import load_checkpoint
from export.train.train import translate_greedy
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.model.tokenizer import Tokenizer

DEFAULT_HEATMAP_WORDS = ("knight", "phoenix", "thoughtfully", "xylophone")
LENGTH_EDGES = (4, 6, 8, 10, 12)  # letters: 1-4, 5-6, 7-8, 9-10, 11-12, 13+
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.md"


def cpu_engine(bundle: Path, int8: bool = False, threads: int = 1) -> Engine:
    """The serving engine on the CPU with `threads` decoder threads (the benchmark machine's setting)."""
    runtime = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=threads, int8_decoder=int8
    )
    return Engine.load(bundle, runtime=runtime)


def decode_engine(
    engine: Engine, words: Sequence[str], beam_size: int, batch_size: int = 256
) -> tuple[dict[str, str], float]:
    """word → best hypothesis through Engine.translate in batches; also the seconds it took."""
    options = SearchOptions(beam_size=beam_size)
    out: dict[str, str] = {}
    started = time.perf_counter()
    for start in range(0, len(words), batch_size):
        chunk = list(words[start : start + batch_size])
        for word, result in zip(
            chunk, engine.translate(chunk, options, alignment="none"), strict=True
        ):
            out[word] = result.hypotheses[0].text
    return out, time.perf_counter() - started


def decode_torch_greedy(
    checkpoint: Path, tokenizers: Path, words: Sequence[str]
) -> tuple[dict[str, str], float]:
    """word → greedy hypothesis of the PyTorch model (the trainer's own decoder); and its seconds."""
    model, _ = load_checkpoint(checkpoint)
    src_tok, tgt_tok = (
        Tokenizer.load(tokenizers / f"{side}.model") for side in ("source", "target")
    )
    started = time.perf_counter()
    hyps = translate_greedy(model, [src_tok.encode(w) for w in words], tgt_tok, torch.device("cpu"))
    return dict(zip(words, hyps, strict=True)), time.perf_counter() - started


def score_both(refs: dict[str, list[str]], hyps: dict[str, str]) -> dict[str, Any]:
    """Scores with stress markers kept and removed."""
    identity: Callable[[str], str] = lambda s: s  # noqa: E731
    return {
        "stress": g2p_scores(refs, hyps, identity, LENGTH_EDGES),
        "no_stress": g2p_scores(refs, hyps, strip_stress, LENGTH_EDGES),
    }


def plot_word_alignments(engine: Engine, word: str, path: Path, n_best: int = 3) -> dict[str, Any]:
    """Beam 5's n-best hypotheses of one word, each with its own alignment matrix, side by side."""
    result = engine.translate(
        [word], SearchOptions(beam_size=5, n_best=n_best), alignment="subword"
    )[0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hyps = result.hypotheses
    fig, axes = plt.subplots(1, len(hyps), figsize=(3.2 * len(hyps) + 1, 3.6), squeeze=False)
    for ax, hyp in zip(axes[0], hyps, strict=True):
        assert hyp.alignment is not None  # asked for "subword"
        matrix = hyp.alignment.matrix  # (T_y, T_x)
        ax.imshow(matrix, cmap="Blues", aspect="auto", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(matrix.shape[1]), hyp.alignment.source_tokens)
        ax.set_yticks(range(matrix.shape[0]), [t.lstrip("▁") for t in hyp.alignment.target_tokens])
        ax.set_title(f"{hyp.text}\nlog p {hyp.log_prob:.2f}", fontsize=8)
    fig.suptitle(f"{word!r}: beam 5, {len(hyps)} best, attention per hypothesis", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {
        "word": word,
        "path": path.name,
        "hypotheses": [{"text": h.text, "log_prob": round(h.log_prob, 3)} for h in hyps],
    }


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def report_markdown(metrics: dict[str, Any]) -> str:
    """Tables: WER/PER per decoder, stress kept and removed, then by word length."""
    runs: dict[str, Any] = metrics["runs"]
    lines = [
        f"# G2P evaluation: {metrics['words']} test words ({metrics['test']})",
        "",
        "A word is right when the prediction equals any of its CMUdict pronunciations; PER is the",
        "edit distance to the closest one over its length. Percent; lower is better.",
        "",
        "| decoder | WER | PER | WER, no stress | PER, no stress | words/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        s, n = run["stress"]["overall"], run["no_stress"]["overall"]
        lines.append(
            f"| {name} | {_pct(s['wer'])} | {_pct(s['per'])} | {_pct(n['wer'])} | {_pct(n['per'])} "
            f"| {run['words_per_s']:.0f} |"
        )
    lines += ["", "By word length (letters), stress removed: WER / PER", ""]
    names = list(runs)
    lines.append("| letters | words | " + " | ".join(names) + " |")
    lines.append("|---|---|" + "---|" * len(names))
    first = runs[names[0]]["no_stress"]["by_length"]
    for i, bucket in enumerate(first):
        cells = [
            f"{_pct(runs[n]['no_stress']['by_length'][i]['wer'])} / "
            f"{_pct(runs[n]['no_stress']['by_length'][i]['per'])}"
            for n in names
        ]
        lines.append(f"| {bucket['letters']} | {bucket['words']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    refs = references(read_tsv(args.test))
    words = list(refs)  # the split's own (shuffled) order
    runs: dict[str, Any] = {}
    hyps, seconds = decode_torch_greedy(args.checkpoint, args.tokenizers, words)
    runs["greedy (PyTorch)"] = {**score_both(refs, hyps), "words_per_s": len(words) / seconds}
    engine = None
    for int8 in (False, True) if args.int8 else (False,):
        engine = cpu_engine(args.bundle, int8=int8, threads=args.threads)
        hyps, seconds = decode_engine(engine, words, args.beam_size)
        name = f"beam {args.beam_size} (engine, {'int8' if int8 else 'fp32'} decoder)"
        runs[name] = {**score_both(refs, hyps), "words_per_s": len(words) / seconds}
    metrics: dict[str, Any] = {
        "test": str(args.test),
        "bundle": str(args.bundle),
        "words": len(words),
        "threads": args.threads,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if engine is not None and args.heatmap_words:
        metrics["heatmaps"] = [
            plot_word_alignments(engine, w, args.out / f"alignment_{w}.png")
            for w in args.heatmap_words.split(",")
        ]
    (args.out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (args.out / REPORT_FILE).write_text(report_markdown(metrics), encoding="utf-8")
    return metrics


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.evaluate.evaluate g2p",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="best.pt of the G2P run")
    p.add_argument("--tokenizers", type=Path, required=True, help="folder with the .model files")
    p.add_argument("--test", type=Path, required=True, help="word<TAB>phonemes, one row per pron.")
    p.add_argument("--bundle", type=Path, required=True, help="the exported bundle (beam search)")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--int8", action="store_true", help="also score the bundle's int8 decoder")
    p.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads")
    p.add_argument(
        "--heatmap-words",
        default=",".join(DEFAULT_HEATMAP_WORDS),
        help="comma-separated words to plot (empty: none)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    metrics = run(args)
    for name, r in metrics["runs"].items():
        print(name, json.dumps({k: r[k]["overall"] for k in ("stress", "no_stress")}))
    print(f"wrote {METRICS_FILE}, {REPORT_FILE} into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
