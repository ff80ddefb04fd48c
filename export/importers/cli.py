"""s2s-import: turn a trained model into a bundle the server loads: an OpenNMT-py RNN or Transformer,
a Joey NMT RNN, a Marian s2s (RNN) or Transformer, or a Hugging Face MarianMTModel (Transformer).

    s2s-import opennmt-py --checkpoint model_step_N.pt --out models/mine [--name N --version V --int8]
        [--src-subword-model spm.model --tgt-subword-model spm.model]   (where the checkpoint's moved)
    s2s-import joeynmt --config config.yaml --checkpoint best.ckpt --out models/mine [...]
    s2s-import marian --model model.npz --vocabs src.spm tgt.spm --out models/mine [...]
    s2s-import huggingface --model opus-mt-de-en/ --out models/mine [...]   (a MarianMTModel directory)

A checkpoint the importer cannot rebuild exactly (an option it does not support, a configuration
that does not match the weights, a vocabulary of the wrong size, a file that is not a checkpoint)
gets one line on stderr saying what is wrong, exit status 2, and no bundle.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Top-level import names s2s-import needs beyond the serving install (the `import` extra).
IMPORT_MODULES = frozenset({"torch", "onnx", "yaml"})
INSTALL_HINT = "scripts/install.sh train,import (or pip install 'seq2seq-serve[train,import]')"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="s2s-import", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="toolkit", required=True)
    onmt = sub.add_parser(
        "opennmt-py", help="an OpenNMT-py 3.x checkpoint (.pt): an RNN or a Transformer"
    )
    joey = sub.add_parser(
        "joeynmt", help="a Joey NMT 2.x RNN (config + .ckpt); its Transformers are refused"
    )
    joey.add_argument("--config", required=True, type=Path, help="the training config.yaml")
    marian = sub.add_parser(
        "marian", help="a Marian model.npz, an s2s (RNN) or a transformer, and its vocabularies"
    )
    marian.add_argument("--model", type=Path, help="model.npz (its special:model.yml)")
    marian.add_argument(
        "--vocabs",
        nargs=2,
        type=Path,
        metavar=("SRC", "TGT"),
        help="the vocabularies as Marian takes them: SentencePiece .spm files or .yml lists",
    )
    marian.add_argument(
        "--config",
        type=Path,
        help="a marian-decoder config (decoder.yml, as OPUS-MT ships it): its model, vocabularies "
        "and decoding options (beam-size, normalize, word-penalty, max-length-factor) as the "
        "bundle's defaults; source.spm and target.spm beside it segment the text for .yml "
        "vocabularies",
    )
    marian.add_argument(
        "--segmenters",
        nargs=2,
        type=Path,
        metavar=("SRC_SPM", "TGT_SPM"),
        help="SentencePiece models that segment the text before .yml vocabularies of pieces",
    )
    hf = sub.add_parser("huggingface", help="a Hugging Face MarianMTModel directory (Transformer)")
    hf.add_argument(
        "--model",
        required=True,
        type=Path,
        help="the directory: config.json, model.safetensors or pytorch_model.bin, source.spm, "
        "target.spm, vocab.json",
    )
    for side in ("src", "tgt"):
        onmt.add_argument(
            f"--{side}-subword-model",
            type=Path,
            help=f"the {side} sentencepiece model or BPE codes, when not at the checkpoint's "
            f"-{side}_subword_model path",
        )
    for p in (onmt, joey):
        p.add_argument("--checkpoint", required=True, type=Path)
    for p in (onmt, joey, marian, hf):
        p.add_argument("--out", required=True, type=Path, help="bundle directory to write")
        p.add_argument("--name", default="imported")
        p.add_argument("--version", default="0.1.0")
        p.add_argument("--int8", action="store_true", help="also write decoder.int8.onnx")
        p.add_argument(
            "--source-language",
            default="",
            help="the source language's ISO 639 code (en, fr, deu, ...), written to the manifest's "
            "info: it picks the sentence splitter of documents (docs/documents.md)",
        )
    return parser.parse_args(argv)


def stamp_source_language(bundle: Path, language: str) -> None:
    """The manifest's info.source_language (documentation: no recorded hash covers info)."""
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest.setdefault("info", {})["source_language"] = language
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from export.importers.common import ImportRefused
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in IMPORT_MODULES:
            raise
        print(
            f"s2s-import: needs {missing}, which is not installed: {INSTALL_HINT}", file=sys.stderr
        )
        return 2
    try:
        if args.toolkit == "opennmt-py":
            from export.importers import opennmt

            out = opennmt.import_checkpoint(
                args.checkpoint,
                args.out,
                args.name,
                args.version,
                args.int8,
                args.src_subword_model,
                args.tgt_subword_model,
            )
        elif args.toolkit == "huggingface":
            from export.importers import huggingface

            out = huggingface.import_model(args.model, args.out, args.name, args.version, args.int8)
        elif args.toolkit == "marian":
            from export.importers import marian

            config = marian.DecoderConfig(args.model, args.vocabs, {}, None)
            if args.config is not None:
                config = marian.read_decoder_config(args.config)
            model, vocabs = args.model or config.model, args.vocabs or config.vocabs
            if model is None or vocabs is None:
                print("s2s-import marian: give --config, or --model and --vocabs", file=sys.stderr)
                return 2
            out = marian.import_model(
                model, tuple(vocabs), args.out, args.name, args.version, args.int8,
                segmenters=tuple(args.segmenters) if args.segmenters else config.segmenters,
                decoding=config.decoding,
            )  # fmt: skip
        else:
            from export.importers import joeynmt

            out = joeynmt.import_checkpoint(
                args.config, args.checkpoint, args.out, args.name, args.version, args.int8
            )
    except ImportRefused as err:
        print(f"s2s-import: error: {err}", file=sys.stderr)
        return 2
    if args.source_language:
        stamp_source_language(out, args.source_language)
    print(f"wrote bundle {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
