"""Model selection for the Greek→English model on dev, never on John: Translate's BLEU and chrF on the
dev split for a checkpoint (or a bundle) over a grid of decoding defaults.

    python -m benchmarks.quality.grc_en_dev --checkpoint runs/grc-en-nt-align/averaged.pt \
        --tokenizers runs/grc-en-nt-align --decoding 1.0,0.05 --decoding 1.0,0.07

A checkpoint is exported to a temporary bundle first (export/onnx/to_onnx.py, with its folded
step); each `--decoding LENGTH_PENALTY,COVERAGE_PENALTY` is then the engine's model defaults for
one pass over dev at `--beam` (5), scored as benchmarks/alignment/grc_en.py scores John (punctuation
stripped, the BSB words without `exclude` rows), with the output/reference length ratio in words.
Without `--decoding`, the bundle's own defaults. Prints one JSON line per setting.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu

from benchmarks.alignment.grc_en import read_split, translate
from export.data.bible import strip_punctuation
from export.onnx.to_onnx import export_bundle
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import OPTIONS


def parse_setting(text: str) -> dict[str, Any]:
    """'1.0,0.05' → {"length_penalty": 1.0, "coverage_penalty": 0.05}; or any decoding options
    as 'name=value;name=value' (e.g. 'length_penalty=1;stopping=patience;patience=2';
    a list option's entries separated by '|')."""
    if "=" in text:
        specs = {spec.name: spec for spec in OPTIONS}
        setting: dict[str, Any] = {}
        for item in text.split(";"):
            name, _, raw = item.partition("=")
            spec = specs.get(name.strip())
            if spec is None:
                raise argparse.ArgumentTypeError(f"unknown decoding option {name!r}")
            setting[spec.name] = parse_option_value(spec.kind, raw.strip())
        return setting
    try:
        length, coverage = (float(v) for v in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--decoding takes LENGTH_PENALTY,COVERAGE_PENALTY, e.g. 1.0,0.05, or "
            f"name=value;name=value; got {text!r}"
        ) from err
    return {"length_penalty": length, "coverage_penalty": coverage}


def parse_option_value(kind: type, raw: str) -> Any:
    if kind is tuple:
        return tuple(v for v in raw.split("|") if v)
    if kind is bool:
        return raw.lower() in ("1", "true", "yes", "on")
    return kind(raw)


def repeats_a_trigram(text: str) -> bool:
    """Whether some word trigram occurs twice in text (what a user sees as a repeating answer)."""
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) < len(grams)


def score_settings(
    bundle: Path, data: Path, settings: list[dict[str, Any]], beam: int, threads: int
) -> list[dict[str, object]]:
    """One row per setting (the bundle's own defaults when settings is empty)."""
    dev = read_split(data, "dev")
    runtime = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=threads, encoder_threads=threads
    )
    engine = Engine.load(bundle, runtime)
    rows: list[dict[str, object]] = []
    for setting in settings or [dict(engine.decoding_defaults)]:
        engine.decoding_defaults = dict(setting)
        hyps = [strip_punctuation(h) for h in translate(engine, dev.sources, beam, 32)]
        words = sum(len(h.split()) for h in hyps) / sum(len(r.split()) for r in dev.targets)
        rows.append(
            {
                "decoding": setting,
                "beam": beam,
                "verses": len(hyps),
                "bleu": round(float(sacrebleu.corpus_bleu(hyps, [dev.targets]).score), 2),
                "chrf": round(float(sacrebleu.corpus_chrf(hyps, [dev.targets]).score), 2),
                "length_ratio": round(words, 3),
                "repeating": sum(repeats_a_trigram(h) for h in hyps),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="exported to a temporary bundle")
    source.add_argument("--bundle", type=Path)
    p.add_argument("--tokenizers", type=Path, help="with --checkpoint: its run folder")
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--decoding", type=parse_setting, action="append", default=[])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle
        if args.checkpoint is not None:
            if args.tokenizers is None:
                p.error("--checkpoint needs --tokenizers (the run folder with source.model)")
            bundle = export_bundle(args.checkpoint, args.tokenizers, Path(tmp) / "b", "dev", "0")
        for row in score_settings(bundle, args.data, args.decoding, args.beam, args.threads):
            print(json.dumps({"model": str(args.checkpoint or args.bundle), **row}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
