"""Translate lines from stdin with a model bundle, no server needed.

echo "ninety-seven" | s2s-translate --bundle models/default
s2s-translate --align < input.txt           # translation<TAB>Pharaoh alignment
s2s-translate --json --nbest 3 < input.txt  # one JSON object per line, with the matrices
s2s-translate --heatmap out.png <<< "March 5, 2021"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from service.bundle import BundleError
from service.config import RuntimeConfig
from service.engine import AlignmentMode, Engine, InvalidInput, Translation
from service.heatmap import save_heatmap_png
from service.options import SearchOptions, add_option_flags, options_from_args
from service.render import translation_to_json

DEFAULT_BUNDLE = Path(__file__).resolve().parent.parent / "models" / "default"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--bundle",
        type=Path,
        default=DEFAULT_BUNDLE,
        help="model bundle directory (default: %(default)s)",
    )
    add_option_flags(p, SearchOptions())
    p.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--align", action="store_true", help="print translation<TAB>Pharaoh alignment")
    out.add_argument("--json", action="store_true", help="print JSON with the alignment matrices")
    p.add_argument(
        "--word-level", action="store_true", help="merge subwords into words in alignments"
    )
    p.add_argument(
        "--heatmap", type=Path, help="save the first sentence's attention matrix as a PNG"
    )
    p.add_argument("--providers", default="CUDAExecutionProvider,CPUExecutionProvider")
    p.add_argument(
        "--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = all cores)"
    )
    p.add_argument("--int8", action="store_true", help="use the int8 decoder graph")
    return p.parse_args(argv)


def format_line(t: Translation, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(translation_to_json(t), ensure_ascii=False)
    lines = []
    for h in t.hypotheses:
        text = h.text if args.n_best == 1 else f"{h.score:.4f}\t{h.text}"
        lines.append(f"{text}\t{h.alignment.pharaoh}" if args.align and h.alignment else text)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runtime = RuntimeConfig(
            providers=tuple(args.providers.split(",")),
            intra_op_threads=args.threads,
            int8_decoder=args.int8,
        )
        engine = Engine.load(args.bundle, runtime)
        options = SearchOptions(**options_from_args(args))
    except (BundleError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    want_alignment = args.align or args.json or args.heatmap is not None
    mode: AlignmentMode = (
        ("word" if args.word_level else "subword")
        if want_alignment and engine.supports_alignment
        else "none"
    )
    lines = [line.rstrip("\n") for line in sys.stdin]
    status = 0
    for start in range(0, len(lines), args.batch_size):
        chunk = lines[start : start + args.batch_size]
        results: list[Translation | None]
        try:
            results = list(engine.translate(chunk, options, mode))
        except InvalidInput:
            results = translate_one_by_one(engine, chunk, options, mode)
            status = 1
        for line_no, result in enumerate(results, start=start + 1):
            if result is None:
                print("")
                continue
            print(format_line(result, args))
            if args.heatmap and line_no == 1 and result.hypotheses[0].alignment is not None:
                a = result.hypotheses[0].alignment
                save_heatmap_png(
                    a.matrix, a.source_tokens, a.target_tokens, args.heatmap, title=result.source
                )
    return status


def translate_one_by_one(
    engine: Engine, lines: list[str], options: SearchOptions, mode: AlignmentMode
) -> list[Translation | None]:
    """Fallback when a chunk holds a bad line: report each bad line on stderr, translate the rest."""
    out: list[Translation | None] = []
    for line in lines:
        try:
            out.append(engine.translate([line], options, mode)[0])
        except InvalidInput as err:
            print(f"error: {err}: {line[:60]!r}", file=sys.stderr)
            out.append(None)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
