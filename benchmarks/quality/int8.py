"""Quality and speed of a bundle's int8 decoder schemes beside fp32, as served: the serving engine
(not PyTorch) on a test split, on this machine's CPU (named in the output with the flags that
decide how ONNX Runtime sums int8 products).

    python -m benchmarks.quality.int8 --bundle models/default --test docs/eval/test.tsv --beam 5 \
        --threads 1 [--schemes s8-channel-7bit s8-tensor-8bit u8-channel] [--json out.json]
    python -m benchmarks.quality.int8 --bundle models/grc-en-nt --source data/grc-en/dev.grc \
        --reference data/grc-en/dev.en --beam 5 --threads 1

Each scheme (export/onnx/quantize.py) quantizes the bundle's decoder.onnx into a copy of the
bundle. Per system: BLEU, chrF and exact match against the references; against fp32, the share of
sentences with the same best text and the largest and mean difference of its score on those; the
time of a pass over the split in batches of `--batch-size` sorted by length, the best of
`--rounds` passes, the systems taking turns within a round (a slow stretch of this shared machine
slows each of them).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from export.data.corpus import read_tsv
from export.metrics.scoring import score
from export.onnx.quantize import DEFAULT_SCHEME, SCHEMES, requantize_bundle
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.decode.text.translation import TranslationHypothesis as Hypothesis
from service.model.int8 import VNNI_FLAGS, host_sums_int8_exactly

FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512bw", *VNNI_FLAGS)


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU's model name and the flags that choose ONNX Runtime's int8 kernels."""
    try:
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    model = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), "")
    flags = set(next((ln for ln in lines if ln.startswith("flags")), "").partition(":")[2].split())
    return {
        "machine": platform.machine(),
        "model": model or platform.processor(),
        "flags": [f for f in FLAGS_OF_INTEREST if f in flags],
        "sums_int8_exactly": host_sums_int8_exactly(),
    }


def best_hypotheses(
    engine: Engine, sources: list[str], beam: int, batch_size: int
) -> tuple[list[Hypothesis], float]:
    """Each source's best hypothesis and the seconds the pass took (batches sorted by length)."""
    options = SearchOptions(beam_size=beam)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    best: list[Hypothesis | None] = [None] * len(sources)
    started = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        results = engine.translate([sources[i] for i in idx], options, "none")
        for i, result in zip(idx, results, strict=True):
            best[i] = result.hypotheses[0]
    seconds = time.perf_counter() - started
    return [h for h in best if h is not None], seconds


def against_fp32(fp32: list[Hypothesis], other: list[Hypothesis]) -> dict[str, Any]:
    """Same best text as fp32 (share), and |score difference| on those: largest and mean."""
    same = [(a, b) for a, b in zip(fp32, other, strict=True) if a.text == b.text]
    differences = [abs(a.score - b.score) for a, b in same] or [0.0]
    return {
        "same_text": round(len(same) / len(fp32), 4),
        "score_difference_max": round(max(differences), 4),
        "score_difference_mean": round(float(np.mean(differences)), 5),
    }


def quantized_copies(bundle: Path, schemes: list[str], work: Path) -> dict[str, Path]:
    """A copy of the bundle per scheme, its decoder.int8.onnx made in that scheme."""
    copies = {}
    for scheme in schemes:
        copy = work / scheme
        shutil.copytree(bundle, copy)
        requantize_bundle(copy, scheme)
        copies[scheme] = copy
    return copies


def measure(
    bundle: Path, pairs: list[tuple[str, str]], schemes: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Every system's quality, agreement with fp32 and best time over the rounds."""
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        copies = quantized_copies(bundle, schemes, Path(tmp))
        engines = {
            "fp32": Engine.load(bundle, runtime_config(args.threads, int8=False)),
            **{s: Engine.load(copies[s], runtime_config(args.threads, int8=True)) for s in schemes},
        }
        outputs: dict[str, list[Hypothesis]] = {}
        seconds: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                outputs[name], took = best_hypotheses(engine, sources, args.beam, args.batch_size)
                seconds[name] = min(seconds.get(name, float("inf")), took)
    report: dict[str, Any] = {}
    for name, hyps in outputs.items():
        row = score([h.text for h in hyps], references)
        if name != "fp32":
            row.update(against_fp32(outputs["fp32"], hyps))
        row.update(
            seconds=round(seconds[name], 2),
            sentences_per_s=round(len(sources) / seconds[name], 1),
            speed_vs_fp32=round(seconds["fp32"] / seconds[name], 2),
        )
        report[name] = row
        print(name, json.dumps(row), flush=True)
    return report


def runtime_config(threads: int, int8: bool) -> RuntimeConfig:
    return RuntimeConfig(
        providers=("CPUExecutionProvider",), intra_op_threads=threads, int8_decoder=int8
    )


def read_pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.test:
        return read_tsv(args.test)
    if not (args.source and args.reference):
        raise SystemExit("give --test TSV, or --source and --reference")
    sources = args.source.read_text(encoding="utf-8").splitlines()
    references = args.reference.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(references):
        raise SystemExit(
            f"{args.source}: {len(sources)} lines, {args.reference}: {len(references)}"
        )
    return list(zip(sources, references, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--test", type=Path, help="a TSV of source<TAB>reference")
    p.add_argument("--source", type=Path, help="one source a line (with --reference)")
    p.add_argument("--reference", type=Path)
    p.add_argument("--limit", type=int, help="the first N pairs only")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--schemes", nargs="+", choices=sorted(SCHEMES),
        default=[DEFAULT_SCHEME, "s8-tensor-8bit", "u8-channel"],
    )  # fmt: skip
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    pairs = read_pairs(args)[: args.limit]
    report: dict[str, Any] = {
        "bundle": str(args.bundle),
        "test": str(args.test or args.source),
        "beam": args.beam,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "sentences": len(pairs),
        "cpu": cpu_description(),
        "systems": measure(args.bundle, pairs, list(args.schemes), args),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
