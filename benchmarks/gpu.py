"""The decode loop against batch size, on every execution provider this onnxruntime has.

    python -m benchmarks.gpu [--batches 1 4 16 64 128] [--models default realistic] [--json PATH]

Runs anywhere; meaningful on a GPU (onnxruntime-gpu with the CUDA provider, `pip install --no-deps
onnxruntime-gpu`). For each model (the default bundle; the realistic configuration, V 8k, E 256,
H 512, S 30, random weights, exported here, which needs torch) and each provider available (CPU
always, CUDA when present), at beam 5 and each batch size B (sentences; 5·B hypotheses):

- static: B sentences decode 30 target tokens together (EOS is never chosen, so every provider
  does the same work): hypothesis-steps/s = 5·B·30 / seconds, best of --repeats;
- churn: continuous batching's busiest case, one sentence leaving and one joining at every step
  with B sentences running (each lives B steps): hypothesis-steps/s over --steps steps;

with the host↔device bytes per step from the model's transfer ledger (encoder calls excluded:
sentences are encoded before the clock starts, as the server's encode-ahead thread does), and each
provider's speed-up over the CPU provider, measured side by side in the same run on the same
machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.configs import REALISTIC
from service.decode.beam import BeamSearch, SearchOptions
from service.decode.config import RuntimeConfig
from service.decode.runtime import CUDA, EncodedSentence, OnnxModel
from service.model.bundle import Bundle, load_bundle
from service.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
NEVER = -1  # an EOS id no step can produce
BEAM, TARGET_LEN = 5, 30
PROVIDERS = {"cpu": ("CPUExecutionProvider",), "cuda": (CUDA, "CPUExecutionProvider")}


@dataclass(frozen=True)
class Figures:
    hyp_steps_per_s: float
    bytes_per_step: float
    bytes_by_reason: dict[str, float]


def fixed_length(steps: int) -> SearchOptions:
    return SearchOptions(beam_size=BEAM, max_length_a=0.0, max_length_b=steps, max_length=steps)


def static(model: OnnxModel, encoded: list[EncodedSentence], repeats: int) -> Figures:
    """B sentences, TARGET_LEN steps together; the best of `repeats` runs after a warm-up."""
    vocab = model.bundle.architecture.tgt_vocab_size
    best, moved = float("inf"), None
    for run in range(repeats + 1):
        before = model.transfers.snapshot()
        started = time.perf_counter()
        decoder = model.new_decoder()
        decoder.add_sentences(encoded)
        search = BeamSearch(decoder, BEAM, bos_id=1, eos_id=NEVER, vocab_size=vocab)
        for b, sentence in enumerate(encoded):
            search.add(b, sentence.length, fixed_length(TARGET_LEN), state_row=b)
        while not search.is_empty:
            search.step()
        seconds = time.perf_counter() - started
        if run:  # run 0 is the warm-up
            best = min(best, seconds)
            moved = model.transfers.snapshot().minus(before)
    assert moved is not None
    steps = TARGET_LEN
    return Figures(
        hyp_steps_per_s=BEAM * len(encoded) * steps / best,
        bytes_per_step=moved.total_bytes / steps,
        bytes_by_reason={r: n / steps for r, n in moved.by_reason().items()},
    )


def churn(model: OnnxModel, pool: list[EncodedSentence], B: int, steps: int) -> Figures:
    """B sentences running, each living B steps, one joining at every step: after B warm-up steps
    one leaves and one joins at each of the `steps` timed ones."""
    vocab = model.bundle.architecture.tgt_vocab_size
    decoder = model.new_decoder()
    search = BeamSearch(decoder, BEAM, bos_id=1, eos_id=NEVER, vocab_size=vocab)
    sentences = itertools.cycle(pool)
    keys = itertools.count()

    def join_and_step() -> None:
        sentence = next(sentences)
        row = decoder.add_sentences([sentence])
        search.add(next(keys), sentence.length, fixed_length(B), state_row=row)
        search.step()

    for _ in range(B):
        join_and_step()
    before = model.transfers.snapshot()
    started = time.perf_counter()
    for _ in range(steps):
        join_and_step()
    seconds = time.perf_counter() - started
    moved = model.transfers.snapshot().minus(before)
    return Figures(
        hyp_steps_per_s=BEAM * B * steps / seconds,
        bytes_per_step=moved.total_bytes / steps,
        bytes_by_reason={r: n / steps for r, n in moved.by_reason().items()},
    )


def default_sources(n: int) -> tuple[Bundle, list[list[int]]]:
    bundle = load_bundle(REPO / "models" / "default")
    tok = Tokenizer.load(bundle.file("source.model"))
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()
    texts = [line.split("\t")[0] for line in lines if line.strip()]
    return bundle, [tok.encode(texts[i % len(texts)]) for i in range(n)]


def realistic_sources(n: int) -> tuple[Bundle, list[list[int]]]:
    """The realistic configuration, exported to a temporary bundle (needs torch)."""
    import torch

    from export.onnx.to_onnx import export_graphs
    from export.train.model import Seq2Seq

    torch.manual_seed(0)
    cfg = REALISTIC
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    export_graphs(Seq2Seq(cfg).eval(), tmp)
    files = {f: "" for f in ("encoder.onnx", "decoder.onnx")}
    bundle = Bundle(
        path=tmp, name="realistic", version="bench", architecture=cfg, files=files, info={}
    )
    rng = np.random.default_rng(0)
    return bundle, [rng.integers(4, cfg.src_vocab_size, size=30).tolist() for _ in range(n)]


MODELS: dict[str, Callable[[int], tuple[Bundle, list[list[int]]]]] = {
    "default": default_sources,
    "realistic": realistic_sources,
}


def available_providers() -> list[str]:
    import onnxruntime as ort

    return ["cpu"] + (["cuda"] if CUDA in ort.get_available_providers() else [])


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"providers": {}, "models": {}}
    providers = available_providers()
    for name in args.models:
        bundle, sources = MODELS[name](max(args.batches) + args.steps + max(args.batches))
        rows: list[dict[str, Any]] = []
        for provider in providers:
            # offline decoding with the machine to itself: spinning threads, as benchmarks.decode
            config = RuntimeConfig(providers=PROVIDERS[provider], spin_wait=True, encoder_threads=0)
            model = OnnxModel(bundle, config)
            report["providers"][provider] = model.providers
            if provider == "cuda" and model.providers[0] != CUDA:
                print(f"{name}: the CUDA provider did not load; skipped")
                continue
            pool = model.encode_sentences(sources)
            for B in args.batches:
                rows.append(
                    {
                        "provider": provider,
                        "sentences": B,
                        "hypotheses": BEAM * B,
                        "static": static(model, pool[:B], args.repeats).__dict__,
                        "churn": churn(model, pool, B, args.steps).__dict__,
                    }
                )
                print_row(name, rows[-1])
        add_speedups(rows)
        report["models"][name] = rows
    return report


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Each row's hypothesis-steps/s over the CPU provider's at the same batch size."""
    cpu = {r["sentences"]: r for r in rows if r["provider"] == "cpu"}
    for r in rows:
        base = cpu.get(r["sentences"])
        for kind in ("static", "churn"):
            r[kind]["speedup_over_cpu"] = (
                r[kind]["hyp_steps_per_s"] / base[kind]["hyp_steps_per_s"] if base else None
            )


def print_row(model: str, r: dict[str, Any]) -> None:
    s, c = r["static"], r["churn"]
    print(
        f"{model:9s} {r['provider']:4s} B {r['sentences']:4d} ({r['hypotheses']:4d} hyps): "
        f"static {s['hyp_steps_per_s']:9,.0f} hyp-steps/s {s['bytes_per_step']:10,.0f} B/step | "
        f"churn {c['hyp_steps_per_s']:9,.0f} hyp-steps/s {c['bytes_per_step']:10,.0f} B/step"
    )


def print_tables(report: dict[str, Any]) -> None:
    for name, rows in report["models"].items():
        print(f"\n## {name}\n")
        print(
            "| provider | sentences (hyps) | static hyp-steps/s | ×CPU | static bytes/step "
            "| churn hyp-steps/s | ×CPU | churn bytes/step |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            s, c = r["static"], r["churn"]
            print(
                f"| {r['provider']} | {r['sentences']} ({r['hypotheses']}) "
                f"| {s['hyp_steps_per_s']:,.0f} | {s['speedup_over_cpu']:.2f} | {s['bytes_per_step']:,.0f} "
                f"| {c['hyp_steps_per_s']:,.0f} | {c['speedup_over_cpu']:.2f} | {c['bytes_per_step']:,.0f} |"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--repeats", type=int, default=3, help="static runs timed (best counts)")
    p.add_argument("--steps", type=int, default=60, help="churn steps timed")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = p.parse_args(argv)
    report = run(args)
    print_tables(report)
    if "cuda" not in report["providers"]:
        print(
            "\nNo CUDA provider in this onnxruntime: CPU figures only (the GPU columns need one)."
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
