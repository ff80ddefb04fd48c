"""Translate lines from stdin with a model bundle, no server needed.

echo "ninety-seven" | s2s-translate --bundle models/default
s2s-translate --align < input.txt           # translation<TAB>Pharaoh<TAB>source words<TAB>target words
s2s-translate --align --subword < input.txt # the same over subword pieces
s2s-translate --json --nbest 3 < input.txt  # one JSON object per line, with the matrices
s2s-translate --heatmap out.png <<< "March 5, 2021"
s2s-translate --verbose < input.txt         # decode time and sentences/s on stderr
s2s-translate --confidence < input.txt      # confidence<TAB>translation (low ones marked "?")
s2s-translate --origin < input.txt          # origin<TAB>translation (model, memory or mixed)

Lines are decoded in batches of similar length, as Marian's maxi-batch and OpenNMT-py do: within
a window of --batch-size x --maxi-batch lines, sorted by token count, longest first, so a batch
wastes few steps on sentences that finished early; the output keeps the input's order.

With --lanes N, N batches decode at once, each on a lane of its own (the model loaded again, with
--threads / N threads), as CTranslate2's inter_threads: a small model's step splits badly over
threads (grc-en-nt-transformer: two one-thread lanes decode 1.45x as fast as one lane of two
threads on two cores), batches side by side do not. The output is the same as with one lane.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from service.cli.heatmap import save_heatmap_png
from service.cli.render import (
    add_column_flags,
    alternative_column,
    origin_column,
    translation_to_json,
)
from service.decode.engine.engine import Engine, InvalidInput
from service.decode.requests import in_process
from service.decode.shared.config import AUTO, EngineLimits, RuntimeConfig
from service.decode.shared.options import (
    SearchOptions,
    add_option_flags,
    merge_options,
    options_from_args,
)
from service.decode.text.translation import AlignmentMode, Translation
from service.model.bundle import BundleError

DEFAULT_BUNDLE = Path(__file__).resolve().parents[2] / "models" / "default"
# the GPU where there is one, else the CPU (service/decode/runtime/providers.py)
DEFAULT_PROVIDERS = AUTO


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="s2s-translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--bundle",
        type=Path,
        default=DEFAULT_BUNDLE,
        help="model bundle directory (default: %(default)s)",
    )
    add_option_flags(p, None, unset="the model's, else the built-in one")
    p.add_argument(
        "--memory",
        type=Path,
        help="a memory file (source<TAB>target) over the bundle's own memory (docs/memory.md)",
    )
    p.add_argument(
        "--glossary-file",
        type=Path,
        help="a glossary file (source<TAB>target terms) over the bundle's own (docs/markup.md)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sentences decoded together (default: %(default)s)",
    )
    p.add_argument(
        "--maxi-batch",
        type=int,
        default=100,
        help="batches read ahead and sorted by length together; 1 keeps the input order "
        "(default: %(default)s)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--align",
        action="store_true",
        help="print translation<TAB>Pharaoh alignment<TAB>source tokens<TAB>target tokens "
        "(the indices count those tokens)",
    )
    out.add_argument("--json", action="store_true", help="print JSON with the alignment matrices")
    p.add_argument(
        "--subword",
        action="store_true",
        help="alignments over subword pieces (default: over words, pieces merged)",
    )
    p.add_argument(
        "--heatmap", type=Path, help="save the first sentence's attention matrix as a PNG"
    )
    p.add_argument(
        "--providers",
        default=DEFAULT_PROVIDERS,
        help="ONNX Runtime execution providers, comma-separated, in order of preference; auto: "
        "the GPU where there is one, else the CPU (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="ONNX Runtime intra-op threads (default: 0 = one per core)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="batches decoded at once, each lane the model loaded again with --threads / lanes "
        "threads (default: %(default)s; on a small model, one a core is fastest)",
    )
    p.add_argument("--int8", action="store_true", help="use the bundle's int8 decoder graph")
    add_column_flags(
        p,
        "line",
        "below the threshold (--min-confidence; the confidence is the geometric-mean token "
        "probability)",
    )
    p.add_argument(
        "--min-confidence",
        type=float,
        default=-1.0,
        help="confidence threshold in [0, 1] that marks hypotheses low_confidence (default: the "
        "bundle's manifest threshold, if any)",
    )
    p.add_argument(
        "--document",
        action="store_true",
        help="read stdin whole as one text, its lines and blank lines kept, and write its "
        "translation exactly so (with --split-sentences on: each sentence decoded alone; "
        "docs/documents.md)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="report the decode time and sentences/s on stderr at the end",
    )
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.maxi_batch < 1:
        p.error("--batch-size and --maxi-batch must be >= 1")
    if args.lanes < 1:
        p.error("--lanes must be >= 1")
    return args


def format_line(t: Translation, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(translation_to_json(t), ensure_ascii=False)
    lines = []
    for h in t.hypotheses:
        text = h.text if len(t.hypotheses) == 1 else f"{h.score:.4f}\t{h.text}"
        text = alternative_column(h) + text
        if args.origin:
            text = origin_column(h) + text
        if args.confidence:
            text = f"{confidence_column(h.confidence, h.low_confidence)}\t{text}"
        if args.align and h.alignment:
            a = h.alignment
            text = "\t".join(
                (text, a.pharaoh, " ".join(a.source_tokens), " ".join(a.target_tokens))
            )
        lines.append(text)
    return "\n".join(lines)


def confidence_column(confidence: float, low: bool) -> str:
    """The confidence as the CLIs print it: 4 decimals, '?' after one below the threshold."""
    return f"{confidence:.4f}" + ("?" if low else "")


def length_sorted_batches(lengths: list[int], batch_size: int, window: int) -> list[list[int]]:
    """Line indices in decoding batches: each window of `window` lines sorted by length, longest
    first (ties keep the input order), then cut into batches of `batch_size`."""
    batches = []
    for start in range(0, len(lengths), window):
        order = sorted(range(start, min(start + window, len(lengths))), key=lambda i: -lengths[i])
        batches += [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return batches


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        engines = [load_engine(args) for _ in range(args.lanes)]
        engine = engines[0]
        for refusal in engine.memory.refused:  # the rest of the memory is used
            print(f"warning: memory entry refused: {refusal}", file=sys.stderr)
        options = SearchOptions(**merge_options(engine.decoding_defaults, options_from_args(args)))
        args.n_best = options.n_best  # the value in effect (the output's columns follow it)
    except (BundleError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    want_alignment = args.align or args.json or args.heatmap is not None
    mode: AlignmentMode = (
        ("subword" if args.subword else "word")
        if want_alignment and engine.supports_alignment
        else "none"
    )
    if args.document:
        return translate_document(engine, sys.stdin.read(), options, mode, args)
    lines = [line.rstrip("\n") for line in sys.stdin]
    window = args.batch_size * args.maxi_batch
    status, decode_s = 0, 0.0
    with ThreadPoolExecutor(1, thread_name_prefix="markup") as restorer:
        for start in range(0, len(lines), window):
            chunk = lines[start : start + window]
            lengths = [len(engine.src_tok.encode(line)) for line in chunk]
            started = time.perf_counter()
            if len(engines) == 1:
                results, failed = translate_window(
                    engine, chunk, lengths, args, options, mode, restorer
                )
            else:
                results, failed = translate_window_in_lanes(
                    engines, chunk, lengths, args, options, mode
                )
            decode_s += time.perf_counter() - started
            status = max(status, failed)
            for i in range(len(chunk)):
                write_result(results[i], args, first=start + i == 0)
    if args.verbose:
        rate = len(lines) / decode_s if decode_s > 0 else 0.0
        print(
            f"translated {len(lines)} lines in {decode_s:.2f} s of decoding "
            f"({rate:.1f} sentences/s; batch size {args.batch_size}, "
            f"sorted by length within {window} lines)",
            file=sys.stderr,
        )
    return status


def translate_document(
    engine: Engine, text: str, options: SearchOptions, mode: AlignmentMode, args: argparse.Namespace
) -> int:
    """--document: the text translated whole, written as the answer has it (its layout kept);
    with --json, the whole answer as one JSON object."""
    try:
        [result] = in_process.translate(engine, [text], options, mode)
    except InvalidInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json or args.align or len(result.hypotheses) > 1:
        print(format_line(result, args))
    else:
        sys.stdout.write(result.hypotheses[0].text)
    return 0


def load_engine(args: argparse.Namespace) -> Engine:
    """The bundle loaded for one lane (its threads: --threads, or the cores, over the lanes),
    with the user's memory and glossary."""
    threads = args.threads
    if args.lanes > 1:
        threads = max(1, (args.threads or os.cpu_count() or 1) // args.lanes)
    runtime = RuntimeConfig(
        providers=tuple(args.providers.split(",")),
        intra_op_threads=threads,
        int8_decoder=args.int8,
    )
    engine = Engine.load(args.bundle, runtime, EngineLimits(min_confidence=args.min_confidence))
    if args.memory is not None:
        engine.user_memory = engine.read_memory(args.memory)
    if args.glossary_file is not None:
        engine.terms.user_glossary = engine.terms.read_glossary(args.glossary_file)
    return engine


def translate_window(
    engine: Engine,
    chunk: list[str],
    lengths: list[int],
    args: argparse.Namespace,
    options: SearchOptions,
    mode: AlignmentMode,
    restorer: Executor,
) -> tuple[dict[int, Translation | None], int]:
    """One window's lines decoded in length-sorted batches: (each line's result by its index in
    the chunk, 1 where a line could not be translated else 0). With markup, each batch's markup is
    put back on `restorer` while the next batch decodes (on one core, the restore of 400 verses of
    John took half as long as their decoding)."""
    results: dict[int, Translation | None] = {}
    pending: list[tuple[list[int], SearchOptions, Future[list[Translation]]]] = []
    failed: list[tuple[list[int], SearchOptions]] = []  # batches that hold a bad line
    for batch in length_sorted_batches(lengths, args.batch_size, len(chunk)):
        texts = [chunk[i] for i in batch]
        batch_options = options
        if options.target_prefix:  # the first --target-prefix starts every line's translation
            batch_options = replace(options, target_prefix=options.target_prefix[:1] * len(texts))
        try:
            decoded = in_process.decode(engine, texts, batch_options, mode)
        except InvalidInput:
            failed.append((batch, batch_options))
            continue
        restored = restorer.submit(in_process.finish, decoded, mode)
        pending.append((batch, batch_options, restored))
    for batch, batch_options, restored in pending:
        try:
            results.update(zip(batch, restored.result(), strict=True))
        except InvalidInput:
            failed.append((batch, batch_options))
    for batch, batch_options in failed:
        texts = [chunk[i] for i in batch]
        got = translate_one_by_one(engine, texts, batch_options, mode)
        results.update(zip(batch, got, strict=True))
    return results, int(bool(failed))


def translate_window_in_lanes(
    engines: list[Engine],
    chunk: list[str],
    lengths: list[int],
    args: argparse.Namespace,
    options: SearchOptions,
    mode: AlignmentMode,
) -> tuple[dict[int, Translation | None], int]:
    """`translate_window` with each batch decoded (and its markup put back) by whichever lane is
    free: the same results, len(engines) batches at a time."""
    free: queue.SimpleQueue[Engine] = queue.SimpleQueue()
    for engine in engines:
        free.put(engine)

    def on_a_lane(texts: list[str], batch_options: SearchOptions) -> list[Translation] | None:
        engine = free.get()
        try:
            return in_process.translate(engine, texts, batch_options, mode)
        except InvalidInput:
            return None  # a bad line: its batch goes line by line below
        finally:
            free.put(engine)

    results: dict[int, Translation | None] = {}
    failed = False
    with ThreadPoolExecutor(len(engines), thread_name_prefix="lane") as lanes:
        pending = []
        for batch in length_sorted_batches(lengths, args.batch_size, len(chunk)):
            texts = [chunk[i] for i in batch]
            batch_options = options
            if options.target_prefix:  # as translate_window
                batch_options = replace(
                    options, target_prefix=options.target_prefix[:1] * len(texts)
                )
            pending.append(
                (batch, texts, batch_options, lanes.submit(on_a_lane, texts, batch_options))
            )
        for batch, texts, batch_options, done in pending:
            decoded = done.result()
            if decoded is None:
                failed = True
                results.update(
                    zip(
                        batch,
                        translate_one_by_one(engines[0], texts, batch_options, mode),
                        strict=True,
                    )
                )
            else:
                results.update(zip(batch, decoded, strict=True))
    return results, int(failed)


def write_result(result: Translation | None, args: argparse.Namespace, first: bool) -> None:
    """One input line's output (an empty line for a line that could not be translated)."""
    if result is None:
        print("")
        return
    print(format_line(result, args))
    if args.heatmap and first and result.hypotheses[0].alignment is not None:
        a = result.hypotheses[0].alignment
        save_heatmap_png(
            a.matrix, a.source_tokens, a.target_tokens, args.heatmap, title=result.source
        )


def translate_one_by_one(
    engine: Engine, lines: list[str], options: SearchOptions, mode: AlignmentMode
) -> list[Translation | None]:
    """Fallback when a batch holds a bad line: report each bad line on stderr, translate the rest."""
    out: list[Translation | None] = []
    for i, line in enumerate(lines):
        try:
            out.append(in_process.translate(engine, [line], options.for_text(i), mode)[0])
        except InvalidInput as err:
            print(f"error: {err}: {line[:60]!r}", file=sys.stderr)
            out.append(None)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
