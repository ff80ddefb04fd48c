"""A Transformer's speed on identical weights: this engine beside CTranslate2 and transformers.

    python -m benchmarks.importing.transformer_speed --shape opus-mt --sentences 128 \
        --threads 1 2 [--int8] [--json docs/benchmarks/transformer-speed.json]

One Hugging Face MarianMTModel directory (export/toolkits/hf_fixture.py: `opus-mt` is OPUS-MT's
shape, 6 + 6 layers, 512 wide, 8 heads, 2,048 swish feed-forward, a 32k shared vocabulary, random
weights; `tiny` is the tests' 2 + 2 layer model trained to copy) is imported with s2s-import
huggingface and converted with CTranslate2's own TransformersConverter, float32 and int8. Each
side translates the same sentences (6-72 source pieces, 33 on average, for the 128 of --shape
opus-mt; 6-91 for tiny's 1,000), beam 5, batches of 32 sorted by length,
at most `--max-tokens` target tokens, at 1 and 2 threads; ours returns every hypothesis's
alignment matrix (subword). The two sides run batch by batch in turn (side_by_side), so that a
slow stretch of this shared machine slows both. At one thread both sides run on
one core (`one_core`: unpinned, CTranslate2's worker thread and our calling thread could land on
different cores of this shared machine, and its rate swung 137-158 tokens/s between runs while
ours held 138-143). The figure is target tokens per second, each side
counting the tokens it produced (the end of sentence counted), with the ratio ours / CTranslate2.
Beside them, at one thread only: MarianMTModel.generate (torch) on the same batches, and with
`--optimum-python` Optimum's ORTModelForSeq2SeqLM.generate (optimum_row, in its own venv).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.decode.engine.engine import Engine
    from service.decode.shared.options import SearchOptions

SHAPES = {
    "opus-mt": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "extra_pieces": 32000},
    "tiny": {"d_model": 32, "layers": 2, "heads": 4, "ffn": 64, "train_steps": 800},
}
BATCH, BEAM = 32, 5


@dataclass
class Row:
    system: str
    threads: int
    sentences: int
    target_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.target_tokens / self.seconds


def sentences(count: int, seed: int) -> list[str]:
    """Texts of 6-22 number words (the fixture's SentencePiece model cuts the benchmark's into
    6-91 pieces)."""
    from export.toolkits.hf_fixture import WORDS

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 22))) for _ in range(count)]


def by_length(texts: list[str], pieces: list[list[str]]) -> list[int]:
    return sorted(range(len(texts)), key=lambda i: len(pieces[i]))


def load_ours(
    bundle: Path, threads: int, int8: bool, max_tokens: int
) -> tuple[Engine, SearchOptions]:
    """Our engine as the benchmark runs it, and its options (beam 5, the best hypothesis, at most
    `max_tokens`). Its threads spin while they wait for work, as CTranslate2's OpenMP threads do:
    the cores are the benchmark's."""
    from service.decode.engine.engine import Engine
    from service.decode.shared.config import RuntimeConfig
    from service.decode.shared.options import SearchOptions

    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=threads, encoder_threads=threads,
        int8_decoder=int8, spin_wait=True,
    )  # fmt: skip
    engine = Engine.load(bundle, config)
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": BEAM, "n_best": 1,
                               "max_length": max_tokens, "max_length_b": max_tokens})  # fmt: skip
    return engine, options


def our_engine(
    bundle: Path, threads: int, int8: bool, max_tokens: int
) -> Callable[[list[str]], int]:
    """Ours as a function of a batch of texts → the target tokens of its best translations (each
    with its alignment matrix)."""
    engine, options = load_ours(bundle, threads, int8, max_tokens)

    def translate(texts: list[str]) -> int:
        return sum(best_tokens(engine, options, texts))

    return translate


def best_tokens(engine: Engine, options: SearchOptions, texts: list[str]) -> list[int]:
    """Each text's best translation's target tokens (the end of sentence counted), each with its
    alignment matrix."""
    tokens = []
    for result in engine.translate(texts, options, "subword"):
        best = result.hypotheses[0]
        assert best.alignment is not None
        tokens.append(len(best.token_ids) + int(best.finished))
    return tokens


def ctranslate2_engine(
    model: Path, threads: int, int8: bool, max_tokens: int
) -> Callable[[list[list[str]]], int]:
    """CTranslate2 as a function of a batch of pieces → the target tokens of its best
    translations (the end of sentence counted: return_end_token)."""
    import ctranslate2

    translator = ctranslate2.Translator(
        str(model), device="cpu", compute_type="int8" if int8 else "float32",
        inter_threads=1, intra_threads=threads,
    )  # fmt: skip
    kwargs = {"beam_size": BEAM, "max_decoding_length": max_tokens, "return_end_token": True}

    def translate(pieces: list[list[str]]) -> int:
        return sum(len(r.hypotheses[0]) for r in translator.translate_batch(pieces, **kwargs))

    return translate


@contextlib.contextmanager
def one_core(threads: int) -> Iterator[None]:
    """At one thread, this thread (and the threads it starts: CTranslate2's worker) on the last
    CPU it may use until the block ends; at more, unchanged."""
    allowed = os.sched_getaffinity(0)
    if threads != 1 or len(allowed) < 2:
        yield
        return
    os.sched_setaffinity(0, {max(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def side_by_side(
    bundle: Path, converted: Path, texts: list[str], pieces: list[list[str]], threads: int,
    int8: bool, max_tokens: int,
) -> tuple[Row, Row]:  # fmt: skip
    """CTranslate2's row and ours, their batches interleaved (each side warmed up on the first
    batch first; then batch by batch, the side that goes first alternating): a slow stretch of
    this shared machine falls on both sides alike, not on whichever ran during it. At one thread,
    on one core (`one_core`)."""
    tokens = {"peer": 0, "mine": 0}
    seconds = {"peer": 0.0, "mine": 0.0}
    with one_core(threads):
        peer = ctranslate2_engine(converted, threads, int8, max_tokens)
        mine = our_engine(bundle, threads, int8, max_tokens)
        peer(pieces[:BATCH])
        mine(texts[:BATCH])
        for n, i in enumerate(range(0, len(texts), BATCH)):
            for side in ("peer", "mine") if n % 2 == 0 else ("mine", "peer"):
                start = time.perf_counter()
                if side == "peer":
                    tokens[side] += peer(pieces[i : i + BATCH])
                else:
                    tokens[side] += mine(texts[i : i + BATCH])
                seconds[side] += time.perf_counter() - start
    precision = " int8" if int8 else " float32"
    return (
        Row("ctranslate2" + precision, threads, len(texts), tokens["peer"], seconds["peer"]),
        Row("ours" + (" int8" if int8 else ""), threads, len(texts), tokens["mine"],
            seconds["mine"]),
    )  # fmt: skip


def generate_row(model_dir: Path, texts: list[str], threads: int, max_tokens: int) -> Row:
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    torch.set_num_threads(threads)
    model = MarianMTModel.from_pretrained(str(model_dir)).eval()
    tokenizer = MarianTokenizer.from_pretrained(str(model_dir))
    tokens = 0
    start = time.perf_counter()
    for i in range(0, len(texts), BATCH):
        batch = tokenizer(texts[i : i + BATCH], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, num_beams=BEAM, max_new_tokens=max_tokens)
        eos, pad = model.config.eos_token_id, model.config.pad_token_id
        for row in out:  # the start token and the padding after the end are not tokens
            tokens += int(((row != pad) | (row == eos)).sum())
    return Row("transformers generate", threads, len(texts), tokens, time.perf_counter() - start)


def optimum_row(
    python: Path, model_dir: Path, texts: list[str], work: Path, max_tokens: int
) -> Row:
    """Optimum's ORTModelForSeq2SeqLM.generate at one thread, run by `python` (a venv with
    optimum-onnx, which needs an older transformers than ours: benchmarks/importing/optimum_row.py)."""
    source = work / "optimum-texts.txt"
    source.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    command = [str(python), "-m", "benchmarks.importing.optimum_row", "--model", str(model_dir),
               "--texts", str(source), "--threads", "1", "--beam", str(BEAM),
               "--batch", str(BATCH), "--max-tokens", str(max_tokens)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Row("optimum ORTModelForSeq2SeqLM generate", 1, len(texts), figures["target_tokens"],
               figures["seconds"])  # fmt: skip


def prepare(shape: str, work: Path) -> tuple[Path, Path, dict[bool, Path]]:
    from ctranslate2.converters import TransformersConverter

    from export.importers.huggingface import import_model
    from export.toolkits.hf_fixture import write_model

    model_dir = write_model(work / "hf", **SHAPES[shape])  # type: ignore[arg-type]
    bundle = import_model(model_dir, work / "bundle", shape, "1", int8=True)
    converted = {}
    for int8 in (False, True):
        out = work / ("ct2-int8" if int8 else "ct2")
        TransformersConverter(str(model_dir)).convert(
            str(out), quantization="int8" if int8 else None
        )
        converted[int8] = out
    return model_dir, bundle, converted


def report(rows: list[Row], label: str, path: Path | None, about: dict[str, str]) -> None:
    """The rows as a table, each with its ratio to CTranslate2's of its threads and precision;
    and as JSON at `path` (with `about`) where given."""
    print(f"| system | threads | target tokens | s | tokens/s | x CTranslate2 ({label}) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        peer = next((r for r in rows if r.threads == row.threads and r.system.startswith(
            "ctranslate2") and r.system.endswith("int8") == row.system.endswith("int8")), None)  # fmt: skip
        ratio = f"{row.tokens_per_s / peer.tokens_per_s:.2f}" if peer else "-"
        print(f"| {row.system} | {row.threads} | {row.target_tokens} | {row.seconds:.1f} | "
              f"{row.tokens_per_s:.0f} | {ratio} |")  # fmt: skip
    if path:
        rows_out = [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in rows]
        path.write_text(json.dumps({**about, "rows": rows_out}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="opus-mt")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--int8", action="store_true", help="int8 rows too")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--optimum-python", type=Path,
                        help="python of a venv with optimum-onnx[onnxruntime]: an Optimum row")  # fmt: skip
    args = parser.parse_args(argv)
    import sentencepiece as spm

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, bundle, converted = prepare(args.shape, Path(tmp))
        cutter = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        texts = sentences(args.sentences, seed=5)
        pieces = [[*cutter.EncodeAsPieces(t), "</s>"] for t in texts]
        order = by_length(texts, pieces)
        texts, pieces = [texts[i] for i in order], [pieces[i] for i in order]
        # the most threads first: the OpenMP threads CTranslate2 starts outlive its translator,
        # and those started while pinned to one core (`one_core`) would keep a later run on it
        for threads in sorted(args.threads, reverse=True):
            for int8 in (False, True) if args.int8 else (False,):
                rows.extend(side_by_side(
                    bundle, converted[int8], texts, pieces, threads, int8, args.max_tokens
                ))  # fmt: skip
                print(rows[-2], rows[-1], flush=True)
        rows.sort(key=lambda row: row.threads)  # reported as asked: by threads, stable
        if not args.no_generate:
            rows.append(generate_row(model_dir, texts, 1, args.max_tokens))
        if args.optimum_python:
            rows.append(optimum_row(args.optimum_python, model_dir, texts, Path(tmp),
                                    args.max_tokens))  # fmt: skip
    report(rows, args.shape, args.json, {"shape": args.shape})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
