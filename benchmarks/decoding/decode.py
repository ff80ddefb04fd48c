"""Decoding throughput, measured side by side in one run (a script that prints figures, not a test).

    python -m benchmarks.decoding.decode [--quick] [--json docs/benchmarks/decode.json]

For the default model and for a larger realistic configuration (vocabulary 8k, embeddings 256,
hidden 512, source length 30, random weights), at beam 1 and beam 5, it times:
  (a) this engine: ONNX Runtime decoder-step graph + numpy beam search, all sentences batched;
  (b) the same engine, one sentence at a time;
  (c) the same search driven by the PyTorch model's own decoder step (eager), batched the same way;
  (d) the int8 decoder graph, batched.
Decoding is forced to a fixed length (EOS is never chosen) so every variant does the same work; inputs
are token ids (tokenization is excluded). It also measures the machine's fp32 matmul peak with numpy
and the achieved GFLOP/s of (a) at the largest batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.configs import REALISTIC
from export.onnx.quantize import quantize_decoder
from export.onnx.to_onnx import export_graphs
from export.train.checkpoint import load_checkpoint
from export.train.model import Seq2Seq
from export.train.torch_decoder import TorchDecoder
from service.decode.runtime.encoded import pad_ids
from service.decode.runtime.runtime import OnnxModel
from service.decode.search.beam import BeamSearch, SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.search_types import Decoder
from service.model.architecture import ModelConfig
from service.model.bundle import Bundle

NEVER = -1  # an EOS id no step can produce: every hypothesis runs to the fixed length
REPO = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Workload:
    name: str
    model: Seq2Seq
    onnx: OnnxModel
    onnx_int8: OnnxModel
    sources: list[list[int]]
    target_len: int


def decode(decoder: Decoder, lengths: list[int], beam: int, target_len: int, vocab: int) -> int:
    """Run the numpy search for target_len steps over a decoder whose state rows are 0..B-1."""
    options = SearchOptions(
        beam_size=beam, max_length_a=0.0, max_length_b=target_len, max_length=target_len
    )
    search = BeamSearch(decoder, beam, bos_id=1, eos_id=NEVER, vocab_size=vocab)
    for b, n in enumerate(lengths):
        search.add(b, n, options, state_row=b)
    steps = 0
    while not search.is_empty:
        search.step()
        steps += 1
    return steps


def onnx_batched(
    onnx: OnnxModel, sources: list[list[int]], beam: int, target_len: int, vocab: int
) -> None:
    decoder = onnx.new_decoder()
    decoder.add_sentences(onnx.encode_sentences(sources))
    decode(decoder, [len(s) for s in sources], beam, target_len, vocab)


def onnx_one_at_a_time(
    onnx: OnnxModel, sources: list[list[int]], beam: int, target_len: int, vocab: int
) -> None:
    for ids in sources:
        onnx_batched(onnx, [ids], beam, target_len, vocab)


def torch_batched(
    model: Seq2Seq, sources: list[list[int]], beam: int, target_len: int, vocab: int
) -> None:
    src, lengths = pad_ids(sources)
    decode(TorchDecoder(model, src, lengths), lengths.tolist(), beam, target_len, vocab)


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-run allocations and kernel selection
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


SETTLE_S = 0.1  # between two timed runs: the previous runtime's spinning threads go to sleep


def best_of_interleaved(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Each function's best time over `repeats` rounds, the functions taking turns within a round.

    This machine's speed drifts by ±15 % over tens of seconds (shared host); timing the variants
    one after another would hand one of them a slow phase. Taking turns exposes each to the same
    phases, and the best of several rounds is each one's speed when the machine was at its best.
    Both runtimes' worker threads spin for a while after their work (OpenMP's and ONNX Runtime's),
    so each run starts after a short pause rather than on top of the previous one's spinning.
    """
    for fn in fns.values():
        fn()  # warm-up: first-run allocations and kernel selection
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def step_flops(cfg: ModelConfig, S: int) -> float:
    """Multiply-adds ×2 of one decoder step for one hypothesis (matrix products only)."""
    E, H, D, A, V = cfg.emb_dim, cfg.dec_hidden, cfg.enc_out_dim, cfg.attn_dim, cfg.tgt_vocab_size
    gates = 3 if cfg.rnn == "gru" else 4
    rnn_in = E + (H if cfg.input_feeding else D)
    flops = 2 * (rnn_in + H) * gates * H * cfg.dec_layers  # recurrent cell
    flops += 2 * H * A + 2 * S * A + 2 * S * D  # query projection, scores, context
    flops += (
        2 * (H + D + E) * H if not cfg.input_feeding else 2 * (D + H) * H
    )  # readout / attentional state
    flops += 2 * H * V  # output projection
    return float(flops)


def numpy_matmul_gflops(n: int = 1024, repeats: int = 20) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    seconds = best_of(lambda: a @ b, repeats)
    return 2 * n**3 / seconds / 1e9


PEAK_N, PEAK_ROUND_REPEATS = 1024, 20
PEAK_ROUND_FLOPS = 2 * PEAK_N**3 * PEAK_ROUND_REPEATS


def torch_matmul_round() -> None:
    """20 fp32 1024x1024 products (~0.15 s): the peak, sampled in the same rounds as the decodes."""
    a, b = torch.ones(PEAK_N, PEAK_N), torch.ones(PEAK_N, PEAK_N)
    for _ in range(PEAK_ROUND_REPEATS):
        torch.mm(a, b)


def torch_matmul_gflops(n: int = 1024, repeats: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = best_of(lambda: torch.mm(a, b), repeats)
    return 2 * n**3 / seconds / 1e9


def matmul_peak_gflops() -> dict[str, float]:
    """The machine's fp32 matmul peak: the best of numpy (in a child process without the
    OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE overrides this machine sets, which slow OpenBLAS) and torch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    code = (
        "from benchmarks.decoding.decode import numpy_matmul_gflops; print(numpy_matmul_gflops())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    figures = {"numpy": float(out.stdout.strip().splitlines()[-1]), "torch": torch_matmul_gflops()}
    figures["peak"] = max(figures.values())
    return figures


def random_workload(n: int) -> Workload:
    torch.manual_seed(0)
    cfg = REALISTIC
    model = Seq2Seq(cfg).eval()
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, cfg.src_vocab_size, size=30).tolist() for _ in range(n)]
    return build_workload(
        "realistic (V 8k, E 256, H 512, S 30, random weights)", model, sources, 30
    )


def default_workload(checkpoint: Path, test_tsv: Path, tokenizer: Path, n: int) -> Workload:
    from export.data.corpus import read_tsv
    from service.model.tokenizer import Tokenizer

    model, _ = load_checkpoint(checkpoint)
    tok = Tokenizer.load(tokenizer)
    sources = [tok.encode(s) for s, _ in read_tsv(test_tsv)[:n]]
    return build_workload("default model (numbers en→fr)", model, sources, 30)


def build_workload(
    name: str, model: Seq2Seq, sources: list[list[int]], target_len: int
) -> Workload:
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    export_graphs(model, tmp)
    quantize_decoder(tmp / "decoder.onnx", tmp / "decoder.int8.onnx")
    files = {f: "" for f in ("encoder.onnx", "decoder.onnx", "decoder.int8.onnx")}
    bundle = Bundle(
        path=tmp, name=name, version="bench", architecture=model.cfg, files=files, info={}
    )
    # Offline batch decoding with the machine to itself: ONNX Runtime's threads spin between ops,
    # its own default and what PyTorch's OpenMP threads do too, and the encoder has every core as
    # PyTorch's has (the server turns spinning off and gives the encoder one thread, because there
    # the gRPC loop and the decode loop need the cores; see docs/benchmarks.md).
    runtime = RuntimeConfig(providers=("CPUExecutionProvider",), spin_wait=True, encoder_threads=0)
    onnx = OnnxModel(bundle, runtime)
    onnx_int8 = OnnxModel(bundle, replace(runtime, int8_decoder=True))
    return Workload(name, model, onnx, onnx_int8, sources, target_len)


def measure(w: Workload, beam: int, repeats: int) -> dict[str, Any]:
    V, T, n = w.model.cfg.tgt_vocab_size, w.target_len, len(w.sources)
    batched: dict[str, Callable[[], None]] = {
        "a_engine_batched": lambda: onnx_batched(w.onnx, w.sources, beam, T, V),
        "c_pytorch_eager_batched": lambda: torch_batched(w.model, w.sources, beam, T, V),
        "d_engine_int8_batched": lambda: onnx_batched(w.onnx_int8, w.sources, beam, T, V),
        "peak_matmul": torch_matmul_round,
    }
    times = best_of_interleaved(batched, repeats)
    peak_seconds = times.pop("peak_matmul")
    # one sentence at a time takes ~10x longer than the rest together: timed once, after them
    times["b_engine_one_at_a_time"] = best_of(
        lambda: onnx_one_at_a_time(w.onnx, w.sources, beam, T, V), 1
    )
    rows: dict[str, Any] = {}
    for name in ("a_engine_batched", "b_engine_one_at_a_time", "c_pytorch_eager_batched",
                 "d_engine_int8_batched"):  # fmt: skip
        seconds = times[name]
        rows[name] = {
            "seconds": seconds,
            "sentences_per_s": n / seconds,
            "target_tokens_per_s": n * T / seconds,
        }
    a = rows["a_engine_batched"]["seconds"]
    S = max(len(s) for s in w.sources)
    flops = step_flops(w.model.cfg, S) * n * beam * T
    return {
        "beam": beam,
        "sentences": n,
        "hypotheses_per_step": n * beam,
        "target_len": T,
        "variants": rows,
        "ratio_a_over_b": rows["b_engine_one_at_a_time"]["seconds"] / a,
        "ratio_a_over_c": rows["c_pytorch_eager_batched"]["seconds"] / a,
        "ratio_d_over_a": a / rows["d_engine_int8_batched"]["seconds"],
        "a_gflops": flops / a / 1e9,
        "peak_gflops_same_rounds": PEAK_ROUND_FLOPS / peak_seconds / 1e9,
    }


def print_table(name: str, results: list[dict[str, Any]], peak: float) -> None:
    print(f"\n## {name}")
    print("| beam | variant | sentences/s | target tokens/s |")
    print("|---|---|---|---|")
    for r in results:
        for variant, v in r["variants"].items():
            print(
                f"| {r['beam']} | {variant} | {v['sentences_per_s']:.1f} | {v['target_tokens_per_s']:.0f} |"
            )
    for r in results:
        print(
            f"beam {r['beam']} ({r['hypotheses_per_step']} hyps/step): (a)/(b) = {r['ratio_a_over_b']:.2f}x, "
            f"(a)/(c) = {r['ratio_a_over_c']:.2f}x, int8 (d)/(a) = {r['ratio_d_over_a']:.2f}x, "
            f"(a) achieves {r['a_gflops']:.1f} GFLOP/s = {100 * r['a_gflops'] / peak:.0f}% of the matmul peak"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="32 sentences, one repeat (a smoke run)")
    p.add_argument(
        "--sentences", type=int, default=128, help="sentences per batch (beam 5: x5 hypotheses)"
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed rounds; each variant's best counts"
    )
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.add_argument("--checkpoint", type=Path, default=REPO / "models" / "default.pt")
    p.add_argument("--test", type=Path, default=REPO / "docs" / "eval" / "test.tsv")
    p.add_argument("--tokenizer", type=Path, default=REPO / "models" / "default" / "source.model")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    repeats = 1 if args.quick else args.repeats
    n = 32 if args.quick else args.sentences
    peaks = matmul_peak_gflops()
    report: dict[str, Any] = {"matmul_gflops": peaks, "repeats": repeats, "workloads": {}}
    workloads = []
    if args.checkpoint.is_file() and args.test.is_file():
        workloads.append(default_workload(args.checkpoint, args.test, args.tokenizer, n))
    workloads.append(random_workload(n))
    measured = {w.name: [measure(w, beam, repeats) for beam in (1, 5)] for w in workloads}
    # the peak: the best of numpy and torch up front and of torch's rounds beside the decodes
    in_rounds = max(r["peak_gflops_same_rounds"] for rs in measured.values() for r in rs)
    peaks["torch_in_rounds"] = in_rounds
    peak = peaks["peak"] = max(peaks["numpy"], peaks["torch"], in_rounds)
    print(
        f"fp32 matmul 1024x1024: numpy {peaks['numpy']:.1f}, torch {peaks['torch']:.1f}, torch "
        f"beside the decodes {in_rounds:.1f} GFLOP/s -> peak {peak:.1f}; torch threads "
        f"{torch.get_num_threads()}; best of {repeats} interleaved rounds"
    )
    for name, results in measured.items():
        print_table(name, results, peak)
        report["workloads"][name] = results
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
