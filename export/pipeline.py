"""s2s-train: train from a TOML config, then (with a bundle to write) export, check and evaluate.

    s2s-train --config configs/my-corpus.toml --out runs/my-corpus [--bundle models/my-corpus]
    s2s-train --config configs/my-corpus.toml --out runs/my-corpus --resume

1. training (export/train/train.py): progress on the terminal and in <out>/train_log.jsonl;
   --resume continues from <out>/last.pt;
2. with --bundle (or a [bundle] table in the config, which then writes <out>/bundle): the ONNX
   bundle (export/onnx/to_onnx.py), named and versioned by [bundle];
3. the parity check: the bundle's graphs teacher-forced through dev sentences against PyTorch
   (export/onnx/parity.py); a mismatch stops the command;
4. with a test split: sacrebleu BLEU and chrF of the served bundle (ONNX Runtime, beam 5) and of
   PyTorch greedy decoding, and the attention's AER against the test split's gold links where it
   has them (export/evaluate/evaluate.py), into <out>/eval; the served figures also go into the
   bundle's manifest ("info");
5. with a [link_head] table and gold links in [corpus]'s train and dev splits: the bundle's link
   head, Align's supervised word aligner (export/link_head.py), into <out>/link_head.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import sacrebleu

from export.data import corpus
from export.data.parallel import CorpusError
from export.evaluate.evaluate import evaluate_parser, run_evaluate
from export.link_head import train_link_head
from export.onnx.parity import check_parity
from export.onnx.to_onnx import export_bundle
from export.train.checkpoint import load_checkpoint
from export.train.data import encode_pairs
from export.train.teacher import links_source, resolve_teacher, silver_corpus
from export.train.train import BundleConfig, TrainConfig, load_config, train, train_parser
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.model.bundle import add_files
from service.model.tokenizer import Tokenizer

PARITY_SENTENCES = 32  # dev pairs teacher-forced through the exported graphs
BEAM = 5


def served_scores(bundle: Path, pairs: list[tuple[str, str]], beam: int = BEAM) -> dict[str, Any]:
    """BLEU and chrF of the bundle as served (ONNX Runtime, beam search) on `pairs`."""
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": beam})
    hyps: list[str] = []
    for start in range(0, len(pairs), 64):
        chunk = [s for s, _ in pairs[start : start + 64]]
        hyps += [t.hypotheses[0].text for t in engine.translate(chunk, options, alignment="none")]
    refs = [[t for _, t in pairs]]
    return {
        "decoding": f"ONNX Runtime, beam {beam}" + describe_defaults(engine.decoding_defaults),
        "sentences": len(pairs),
        "bleu": round(float(sacrebleu.corpus_bleu(hyps, refs).score), 2),
        "chrf": round(float(sacrebleu.corpus_chrf(hyps, refs).score), 2),
    }


def describe_defaults(defaults: dict[str, Any]) -> str:
    """The test figure's note on the model's decoding defaults: ", the model's defaults
    (length_penalty 1.0, ...)", or "" without any."""
    if not defaults:
        return ""
    return ", the model's defaults (" + ", ".join(f"{k} {v}" for k, v in defaults.items()) + ")"


def bundle_dir(cfg: TrainConfig, out: Path, given: Path | None) -> Path | None:
    """--bundle, else <out>/bundle when the config has a [bundle] table, else None (train only)."""
    if given is not None:
        return given
    return out / "bundle" if cfg.bundle is not None else None


def export_and_evaluate(
    cfg: TrainConfig, out: Path, bundle: Path, checkpoint_name: str = "best.pt"
) -> dict[str, Any]:
    """Steps 2-4 of the module's docstring on a trained run folder (its checkpoint_name, best.pt
    unless told: an averaged one, export/train/average.py); returns their figures."""
    checkpoint = out / checkpoint_name
    model, _ = load_checkpoint(checkpoint)
    data = out / "data"
    figures: dict[str, Any] = {}
    named = cfg.bundle or BundleConfig()
    test_path = data / "test.tsv"
    test = corpus.read_tsv(test_path) if test_path.is_file() else []
    credits = {"credits": named.credits} if named.credits else {}
    sections = {"decoding": named.decoding} if named.decoding else None
    export_bundle(
        checkpoint,
        out,
        bundle,
        named.name,
        named.version,
        named.int8,
        extra=credits,
        sections=sections,
    )
    src_tok, tgt_tok = Tokenizer.load(out / "source.model"), Tokenizer.load(out / "target.model")
    dev = corpus.read_tsv(data / "dev.tsv")[:PARITY_SENTENCES]
    parity = check_parity(model, bundle, encode_pairs(dev, src_tok, tgt_tok))
    figures["parity"] = parity.to_dict()
    print(f"parity: {json.dumps(figures['parity'])}")
    if test:
        figures["test_served"] = served_scores(bundle, test)
        print(f"test, served: {json.dumps(figures['test_served'])}")
        args = evaluate_parser().parse_args(
            [
                "--checkpoint",
                str(checkpoint),
                "--tokenizers",
                str(out),
                "--test",
                str(test_path),
                "--train",
                str(data / "train.tsv"),
                "--out",
                str(out / "eval"),
            ]
        )
        metrics = run_evaluate(args)
        figures["test_greedy"] = {k: metrics["overall"][k] for k in ("bleu", "chrf")}
        if "alignment" in metrics:
            figures["test_attention_aer"] = metrics["alignment"].get("aer")
        print(f"test, PyTorch greedy: {json.dumps(figures['test_greedy'])}")
        # the manifest records what the bundle scores as served (the graphs are not exported again)
        add_files(bundle, [], info={"test": figures["test_served"]})
    (out / "pipeline.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def with_links(cfg: TrainConfig, out: Path) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The config whose [corpus] holds the links the run learns from, and their source for the
    manifest: gold files as named, or eflomal's silver links (export/train/teacher.py) with
    [alignment] teacher = "eflomal", or "auto" on a corpus without gold that needs links."""
    corpus_cfg = cfg.corpus
    if corpus_cfg is None:
        return cfg, None
    needs = cfg.optim.guided_alignment > 0 or cfg.link_head is not None
    teacher = resolve_teacher(cfg.alignment, corpus_cfg, needs)
    settings = None
    if teacher == "eflomal":
        if cfg.alignment.teacher == "auto":
            print("links: the corpus names no gold alignments, so eflomal's links are used")
        corpus_cfg, settings = silver_corpus(corpus_cfg, cfg.alignment, out)
    elif not any(s.alignments for s in corpus_cfg.splits.values()):
        print("links: none (no alignment files, and guided alignment and [link_head] are off)")
    return replace(cfg, corpus=corpus_cfg), links_source(corpus_cfg, teacher, settings)


def main(argv: list[str] | None = None) -> int:
    parser = train_parser()
    parser.description = __doc__
    parser.add_argument(
        "--bundle",
        type=Path,
        help="write the ONNX bundle here, check it and evaluate it (default: <out>/bundle when "
        "the config has a [bundle] table; without either, train only)",
    )
    parser.add_argument(
        "--skip-train", action="store_true", help="export and evaluate the run in --out as it is"
    )
    parser.add_argument(
        "--train-only", action="store_true", help="train, then stop (no export, even with [bundle])"
    )
    parser.add_argument(
        "--checkpoint",
        default="best.pt",
        help="the checkpoint in --out to export (default: %(default)s; e.g. one written by "
        "python -m export.train.average)",
    )
    args = parser.parse_args(argv)
    if args.skip_train and args.train_only:
        parser.error("--skip-train and --train-only leave nothing to do")
    try:
        cfg, source = with_links(load_config(args), args.out)
        if not args.skip_train:
            print(json.dumps(train(cfg, args.out, resume=args.resume), indent=2))
        bundle = None if args.train_only else bundle_dir(cfg, args.out, args.bundle)
        if bundle is not None:
            export_and_evaluate(cfg, args.out, bundle, args.checkpoint)
            if cfg.link_head is not None and cfg.corpus is not None:
                head = train_link_head(
                    cfg.corpus, cfg.link_head, bundle, args.out / "link_head", source
                )
                print(f"link head: dev AER {head['served_dev_aer']} (served)")
            print(f"wrote bundle {bundle}")
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
