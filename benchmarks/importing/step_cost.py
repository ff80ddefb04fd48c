"""Where a small Transformer's decoding step goes, ours beside CTranslate2's (issue 50: why the
`tiny` shape of transformer_speed.py stays under CTranslate2 when OPUS-MT's does not).

python -m benchmarks.importing.step_cost [--shape tiny] [--json PATH]

The model is transformer_speed's (`prepare`: Hugging Face MarianMT weights, imported by s2s-import
and converted by CTranslate2's own converter). Two cases, beam 5, one thread, both sides on one
core (`one_core`), CTranslate2 float32 and ours with the host search and its alignment matrices,
as transformer_speed runs them:

- one sentence of the benchmark's that decodes to the maximum length on both sides (the runaway
  sentence a batch of the tiny model holds most of its steps for: 5 rows, a cache growing to
  `--max-tokens` entries): time per decoder step, each side's whole time divided by its steps
  (the maximum length: CTranslate2 stops there too);
- a batch of 32 of the benchmark's sentences (its middle by length): time per batch.

Ours is split into ONNX Runtime's Run of the decoder step (`OnnxModel.run_step`, timed around
each call) and the rest (the search's Python and bindings, the encoder, the text side). Beside
them, the decoder-step graph alone on that sentence's last step's shapes (5 rows, the cache at
its longest), as exported (dynamic axes) and with every axis fixed (ONNX Runtime then folds the
shape arithmetic away): what the graph's nodes cost without the search around them. Each figure
is the best of `--repeats` runs."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.decoding.decode import best_of
from benchmarks.importing.transformer_speed import (
    BEAM,
    best_tokens,
    by_length,
    load_ours,
    one_core,
    prepare,
    sentences,
)
from service.decode.engine.engine import Engine
from service.decode.shared.options import SearchOptions


@dataclass
class StepRow:
    system: str
    case: str
    steps: int  # decoder calls (ours counted; CTranslate2's: the maximum length)
    ms: float  # the case's whole time, best of the repeats
    run_ms: float  # of which ONNX Runtime's Run of the decoder step (ours)

    @property
    def us_per_step(self) -> float:
        return 1e3 * self.ms / self.steps if self.steps else 0.0


@contextmanager
def timed_steps(engine: Engine) -> Iterator[list[float]]:
    """Every decoder-step Run of `engine`'s model timed (seconds, one entry a call) while the
    block runs."""
    model = engine.model
    run_step = model.run_step
    times: list[float] = []

    def timed(session: object, binding: object) -> None:
        start = time.perf_counter()
        run_step(session, binding)
        times.append(time.perf_counter() - start)

    model.run_step = timed  # type: ignore[method-assign]
    try:
        yield times
    finally:
        del model.run_step


def graph_alone(
    decoder: Path, rows: int, src_len: int, past: int, repeats: int
) -> dict[str, float]:
    """The decoder step graph's Run (microseconds, median of `repeats`) on `rows` rows of one
    sentence of `src_len` pieces with `past` cached entries: as exported, and with every axis
    fixed to those sizes."""
    import onnx
    import onnxruntime as ort

    sizes = {"hyps": rows, "state_rows": rows, "batch": 1, "src_len": src_len,
             "key_len": src_len, "past": past}  # fmt: skip
    dynamic = onnx.load(str(decoder))
    fixed = onnx.load(str(decoder))
    for value in fixed.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for value in dynamic.graph.input:
        shape = [sizes.get(d.dim_param, d.dim_value) for d in value.type.tensor_type.shape.dim]
        special = {
            "tokens": rng.integers(4, 20, rows), "reorder": np.arange(rows), "k": np.array(BEAM + 1),
            "positions": np.full(rows, past), "mask": np.ones(shape, bool),
        }  # fmt: skip
        feeds[value.name] = special.get(value.name, rng.standard_normal(shape))
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[value.name] = feeds[value.name].astype(np.float32)
        elif value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[value.name] = feeds[value.name].astype(np.int64)
    out: dict[str, float] = {}
    for name, model in (("graph alone, dynamic axes", dynamic), ("graph alone, axes fixed", fixed)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        optimized = decoder.parent / f"optimized-{len(out)}.onnx"
        options.optimized_model_filepath = str(optimized)
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        session.run(None, feeds)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            session.run(None, feeds)
            seconds.append(time.perf_counter() - start)
        out[name] = 1e6 * float(np.median(seconds))
        out[name + " (nodes after ONNX Runtime's optimizer)"] = len(
            onnx.load(str(optimized)).graph.node
        )
        optimized.unlink()
    return out


def ours_best(engine: Engine, options: SearchOptions, texts: list[str], repeats: int) -> StepRow:
    """Ours on `texts`, the fastest of `repeats` runs after one to warm up, with its decoder
    steps and their Run time."""
    engine.translate(texts, options, "subword")
    best = StepRow("ours", "", 0, float("inf"), 0.0)
    for _ in range(repeats):
        with timed_steps(engine) as runs:
            start = time.perf_counter()
            engine.translate(texts, options, "subword")
            seconds = time.perf_counter() - start
        if 1e3 * seconds < best.ms:
            best = StepRow("ours", "", len(runs), 1e3 * seconds, 1e3 * sum(runs))
    return best


def measure(shape: str, max_tokens: int, repeats: int) -> tuple[list[StepRow], dict[str, float]]:
    """Both cases on both sides, and the step graph alone (`graph_alone`)."""
    import ctranslate2
    import sentencepiece as spm

    rows: list[StepRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, bundle, converted = prepare(shape, Path(tmp))
        with one_core(1):
            cutter = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
            texts = sentences(200, seed=5)
            pieces = [[*cutter.EncodeAsPieces(t), "</s>"] for t in texts]
            peer = ctranslate2.Translator(str(converted[False]), device="cpu", inter_threads=1,
                                          intra_threads=1)  # fmt: skip
            kwargs = {
                "beam_size": BEAM,
                "max_decoding_length": max_tokens,
                "return_end_token": True,
            }
            theirs = [len(r.hypotheses[0]) for r in peer.translate_batch(pieces, **kwargs)]
            engine, options = load_ours(bundle, 1, False, max_tokens)
            ours = best_tokens(engine, options, texts)
            both = [min(n) for n in zip(theirs, ours, strict=True)]
            runaway = next(i for i, n in enumerate(both) if n >= max_tokens)  # on both sides
            order = by_length(texts, pieces)
            cases = {
                "one sentence to the maximum length": [runaway],
                "a batch of 32 (the middle by length)": order[len(order) // 2 - 16 :][:32],
            }
            for case, chosen in cases.items():
                batch = [pieces[i] for i in chosen]
                peer_s = best_of(partial(peer.translate_batch, batch, **kwargs), repeats)
                steps = max_tokens if len(chosen) == 1 else 0  # a batch's: not known
                rows.append(StepRow("ctranslate2 float32", case, steps, 1e3 * peer_s, 0.0))
                mine = ours_best(engine, options, [texts[i] for i in chosen], repeats)
                rows.append(replace(mine, case=case))
            alone = graph_alone(
                bundle / "decoder.onnx", BEAM, len(pieces[runaway]), max_tokens - 1, 300
            )
    return rows, alone


def print_table(rows: list[StepRow], alone: dict[str, float]) -> None:
    print(
        "| system | case | decoder steps | ms | us a step | of it ONNX Runtime's Run (us a step) |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        run = f"{1e3 * row.run_ms / row.steps:.0f}" if row.run_ms and row.steps else "-"
        step = f"{row.us_per_step:.0f}" if row.steps else "-"
        print(f"| {row.system} | {row.case} | {row.steps or '-'} | {row.ms:.1f} | {step} | {run} |")
    for name, value in alone.items():
        print(f"{name}: {value:.0f}" + ("" if "nodes" in name else " us a Run (median)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows, alone = measure(args.shape, args.max_tokens, args.repeats)
    print_table(rows, alone)
    if args.json:
        out = {"shape": args.shape, "max_tokens": args.max_tokens, "graph_alone": alone,
               "rows": [{**asdict(r), "us_per_step": r.us_per_step} for r in rows]}  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
