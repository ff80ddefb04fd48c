"""Variant (a) of benchmarks.decode alone (the engine, all sentences batched), for A/B runs of two
checkouts: the same function (`benchmarks.decode.onnx_batched`), the same runtime settings, the same
128 sentences and 30 target tokens, on the default bundle and the realistic configuration.

    python docs/benchmarks/ab_decode_a.py --export /tmp/realistic     # once (needs torch)
    PYTHONPATH=<checkout> python docs/benchmarks/ab_decode_a.py --realistic /tmp/realistic

Prints one line per (model, beam): sentences/s, best of --repeats after a warm-up. The driver that
interleaves two checkouts is docs/benchmarks/ab_cpu.sh.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.configs import REALISTIC
from benchmarks.decode import onnx_batched
from service.decode.config import RuntimeConfig
from service.decode.runtime import OnnxModel
from service.model.bundle import Bundle, load_bundle
from service.model.tokenizer import Tokenizer


def export(path: Path) -> None:
    import torch

    from export.onnx.to_onnx import export_graphs
    from export.train.model import Seq2Seq

    torch.manual_seed(0)
    path.mkdir(parents=True, exist_ok=True)
    export_graphs(Seq2Seq(REALISTIC).eval(), path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--export", type=Path)
    p.add_argument("--realistic", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sentences", type=int, default=128)
    args = p.parse_args()
    if args.export:
        export(args.export)
        return 0
    repo = Path(__file__).resolve().parent.parent.parent
    runtime = RuntimeConfig(providers=("CPUExecutionProvider",), spin_wait=True, encoder_threads=0)
    default = load_bundle(repo / "models" / "default")
    tok = Tokenizer.load(default.file("source.model"))
    lines = (repo / "docs" / "eval" / "test.tsv").read_text().splitlines()[: args.sentences]
    workloads = [("default", default, [tok.encode(line.split("\t")[0]) for line in lines])]
    if args.realistic:
        files = {f: "" for f in ("encoder.onnx", "decoder.onnx")}
        bundle = Bundle(
            path=args.realistic,
            name="realistic",
            version="ab",
            architecture=REALISTIC,
            files=files,
            info={},
        )
        rng = np.random.default_rng(0)
        sources = [rng.integers(4, 8000, size=30).tolist() for _ in range(args.sentences)]
        workloads.append(("realistic", bundle, sources))
    for name, bundle, sources in workloads:
        model = OnnxModel(bundle, runtime)
        vocab = bundle.architecture.tgt_vocab_size
        for beam in (1, 5):
            onnx_batched(model, sources, beam, 30, vocab)  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                time.sleep(0.1)
                started = time.perf_counter()
                onnx_batched(model, sources, beam, 30, vocab)
                best = min(best, time.perf_counter() - started)
            print(f"{name} beam {beam}: {len(sources) / best:.1f} sentences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
