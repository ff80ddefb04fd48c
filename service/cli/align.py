"""Forced alignment of parallel files with a model bundle, no server needed; like fast_align and eflomal.

s2s-align --bundle models/grc-en-nt --source-file corpus.grc --target-file corpus.en > links.txt
s2s-align --source-file F --target-file G --links intersect --scores --out links.txt

Writes one Pharaoh line per pair ("s-t ...", source word first, 0-based over each line's whitespace
words); a pair with an empty side gets an empty line, as fast_align and eflomal write it. --scores
puts log P(target | source) (end of sentence included) and a tab before the links. Pairs go through
the engine's Align pass (service/decode/align/aligner.py) in batches of similar length.

With --markup xml (or html) the source lines carry inline markup: each line written is the target
with the source's markup put back around the words the links align (docs/markup.md), e.g. a
translation memory's segments or subtitles with their tags:

s2s-align --markup xml --source-file segments.grc.xml --target-file segments.en > segments.en.xml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from service.cli.parallel import read_parallel
from service.cli.translate import DEFAULT_BUNDLE, DEFAULT_PROVIDERS, length_sorted_batches
from service.decode.align.aligner import align_prepared
from service.decode.align.forced import DEFAULT_LINKS, AlignedPair, AlignOptions
from service.decode.align.links import DEFAULT_THRESHOLD, LINK_MODES
from service.decode.align.pair_answers import check_aligner, prepare_pair
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.model.bundle import BundleError
from service.model.markup import INVALID_MARKUP, MARKUP_MODES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="s2s-align", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE, help="model bundle directory")
    p.add_argument("--source-file", type=Path, required=True, help="source sentences, one a line")
    p.add_argument(
        "--target-file", type=Path, required=True, help="target sentences, line for line"
    )
    p.add_argument("--out", type=Path, help="write the links here (default: stdout)")
    p.add_argument(
        "--links",
        choices=LINK_MODES,
        default="",
        help=f"default: the model's ('head' where it has a link head, else {DEFAULT_LINKS!r})",
    )
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="--links threshold")
    p.add_argument("--scores", action="store_true", help="'log_prob<TAB>links' lines")
    p.add_argument(
        "--markup",
        choices=MARKUP_MODES,
        default="none",
        help="the sources' inline markup: write each target with it put back instead of links",
    )
    p.add_argument(
        "--invalid-markup",
        choices=INVALID_MARKUP,
        default="refuse",
        help="markup that does not read: refuse (name the line and position) or read as text",
    )
    p.add_argument("--batch-size", type=int, default=64, help="pairs per forced batch")
    p.add_argument("--providers", default=DEFAULT_PROVIDERS, help="ONNX Runtime providers")
    p.add_argument("--threads", type=int, default=0, help="decoder threads (0: one per core)")
    p.add_argument("--max-source-tokens", type=int, default=1024)
    p.add_argument("--max-length", type=int, default=1024, help="the most target tokens")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    return args


def align_all(
    engine: Engine, pairs: Sequence[tuple[str, str]], options: AlignOptions, batch_size: int
) -> list[AlignedPair | None]:
    """Every pair's alignment, None for a pair with an empty side; batches of similar length."""
    todo = [i for i, (s, t) in enumerate(pairs) if s.strip() and t.strip()]
    lengths = [len(pairs[i][0].split()) + len(pairs[i][1].split()) for i in todo]
    out: list[AlignedPair | None] = [None] * len(pairs)
    check_aligner(engine, options)
    for batch in length_sorted_batches(lengths, batch_size, batch_size * 50):
        chosen = [todo[b] for b in batch]
        prepared = []
        for i in chosen:
            try:
                prepared.append(prepare_pair(engine, *pairs[i], options))
            except InvalidInput as err:
                raise InvalidInput(f"line {i + 1}: {err}") from err
        results = align_prepared(engine, prepared, options)
        for i, result in zip(chosen, results, strict=True):
            out[i] = result
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        pairs = read_parallel(args.source_file, args.target_file)
        engine = Engine.load(
            args.bundle,
            RuntimeConfig(
                providers=tuple(args.providers.split(",")), intra_op_threads=args.threads
            ),
            EngineLimits(max_source_tokens=args.max_source_tokens, max_length=args.max_length),
        )
        options = AlignOptions(
            links=args.links,
            threshold=args.threshold,
            matrices="none",
            markup=args.markup,
            invalid_markup=args.invalid_markup,
        )
        results = align_all(engine, pairs, options, args.batch_size)
    except (OSError, ValueError, BundleError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    lines = []
    for r in results:
        links = "" if r is None else (r.tagged_target if args.markup != "none" else r.pharaoh)
        lines.append(f"{r.log_prob:.4f}\t{links}" if args.scores and r is not None else links)
    text = "".join(line + "\n" for line in lines)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    skipped = sum(1 for r in results if r is None)
    if skipped:
        print(f"{skipped} pairs with an empty side: empty lines written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
