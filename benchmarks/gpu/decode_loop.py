"""The decode loop against batch size, on every execution provider this onnxruntime has.

    python -m benchmarks.gpu.decode_loop [--batches 1 4 16 64 256] [--models default grc realistic]
        [--searches host device] [--json PATH]

Runs anywhere; meaningful on a GPU (onnxruntime-gpu with the CUDA provider, `pip install --no-deps
onnxruntime-gpu`). For each model (the default bundle; the realistic configuration, V 8k, E 256,
H 512, S 30, random weights, exported here, which needs torch) and each provider available (CPU
always, CUDA when present), at beam 5 and each batch size B (sentences; 5·B hypotheses):

- static: B sentences decode 30 target tokens together (EOS is never chosen, so every provider
  does the same work): hypothesis-steps/s = 5·B·30 / seconds, best of --repeats;
- churn: continuous batching's busiest case, one sentence leaving and one joining at every step
  with B sentences running (each lives B steps): hypothesis-steps/s over --steps steps, the best
  of --repeats runs;

with --rounds R, each (static, churn) figure is the median of R rounds in which the searches take
turns (on a shared machine a single run drifts by ±10%);

each under both searches, side by side (`--searches`): "host", the numpy search over the step's
top k (service/decode/search/beam.py), and "device", the search in the step's graph
(service/decode/search/device_search.py, the default); with the host↔device bytes per step from the
model's transfer ledger (encoder calls excluded:
sentences are encoded before the clock starts, as the server's encode-ahead thread does), and each
provider's speed-up over the CPU provider, measured side by side in the same run on the same
machine. Each row also gives the share of the step's wall time spent outside ONNX Runtime's
`run_with_iobinding` (the beam search in Python, binding, row ops), and, where the process was
started with benchmarks/gpu/cuda_copy_counter.so preloaded (S2S_COPY_COUNTER names it), the
host-to-device bytes per step the CUDA runtime itself copied, beside the ledger's.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import itertools
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.configs import REALISTIC
from benchmarks.sample_texts import bundle_texts
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.runtime import CUDA, OnnxDecoder, OnnxModel
from service.decode.search.beam import BeamSearch, SearchOptions
from service.decode.search.device_search import DeviceSearch
from service.decode.search.search import Joining
from service.decode.shared.config import SEARCHES, RuntimeConfig
from service.model.bundle import Bundle, load_bundle
from service.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent.parent
NEVER = -1  # an EOS id no step can produce
FP16 = "device-fp16"  # the device search over the float16 decoder step (RuntimeConfig.fp16_decoder)
KINDS = (*SEARCHES, FP16)
BEAM, TARGET_LEN = 5, 30
PROVIDERS = {"cpu": ("CPUExecutionProvider",), "cuda": (CUDA, "CPUExecutionProvider")}


@dataclass(frozen=True)
class Figures:
    hyp_steps_per_s: float
    bytes_per_step: float
    bytes_by_reason: dict[str, float]
    h2d_bytes_per_step: float  # the ledger's host-to-device bytes
    outside_run_share: float  # of the wall time, the part not inside the decoder's run
    measured_h2d_bytes_per_step: float | None = None  # the CUDA runtime's copies (the counter)
    measured_h2d_copies_per_step: float | None = None


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]  # --clock: "cpu" counts this thread's CPU time (one decoder thread only)


class TimedRuns:
    """A decoder session whose `run_with_iobinding` calls are timed; everything else passes through."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.seconds = 0.0

    def run_with_iobinding(self, binding: Any, run_options: Any = None) -> None:
        started = clock()
        self.session.run_with_iobinding(binding, run_options)
        self.seconds += clock() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def timed(decoder: OnnxDecoder) -> TimedRuns:
    runs = TimedRuns(decoder.main.session)
    decoder.main.session = runs  # type: ignore[assignment]
    return runs


class Search:
    """A running batch's search under test: `BeamSearch` over an OnnxDecoder ("host"), or the
    `DeviceSearch` ("device"), joined and stepped as RunningBatch does; its decoder calls timed."""

    def __init__(self, model: OnnxModel, kind: str) -> None:
        vocab = model.bundle.architecture.tgt_vocab_size
        self.device: DeviceSearch | None = None
        if kind in ("device", FP16):
            self.device = DeviceSearch(model, BEAM, bos_id=1, eos_id=NEVER, vocab_size=vocab)
            self.runs = TimedRuns(self.device.session)
            self.device.session = self.runs  # type: ignore[assignment]
        else:
            self.decoder = model.new_decoder()
            self.search = BeamSearch(self.decoder, BEAM, bos_id=1, eos_id=NEVER, vocab_size=vocab)
            self.runs = timed(self.decoder)

    @property
    def is_empty(self) -> bool:
        return self.device.is_empty if self.device is not None else self.search.is_empty

    def add(
        self, keys: list[int], sentences: list[EncodedSentence], options: SearchOptions
    ) -> None:
        if self.device is not None:
            self.device.add(
                [
                    Joining(key, sentence, options)
                    for key, sentence in zip(keys, sentences, strict=True)
                ]
            )
            return
        row = self.decoder.add_sentences(sentences)
        for i, (key, sentence) in enumerate(zip(keys, sentences, strict=True)):
            self.search.add(key, sentence.length, options, state_row=row + i)

    def step(self) -> None:
        if self.device is not None:
            self.device.step()
        else:
            self.search.step()


class CopyCounter:
    """The counters of benchmarks/gpu/cuda_copy_counter.so, when this process preloaded it."""

    KINDS = 5  # cudaMemcpyKind: host-to-host, host-to-device, device-to-host, device-to-device

    def __init__(self) -> None:
        path = os.environ.get("S2S_COPY_COUNTER", "")
        preloaded = path and path in os.environ.get("LD_PRELOAD", "")
        self.lib = ctypes.CDLL(path) if preloaded else None

    def snapshot(self) -> tuple[int, int] | None:
        """(host-to-device bytes, host-to-device copies) so far; None without the counter."""
        if self.lib is None:
            return None
        nbytes = (ctypes.c_uint64 * self.KINDS)()
        calls = (ctypes.c_uint64 * self.KINDS)()
        self.lib.s2s_copy_counts(nbytes, calls)
        return int(nbytes[1]), int(calls[1])


COUNTER = CopyCounter()


def figures(
    hyp_steps: int, seconds: float, steps: int, moved: Any, run_s: float, copies: Any
) -> Figures:
    h2d = sum(n for (d, _), n in moved.bytes.items() if d == "host_to_device")
    return Figures(
        hyp_steps_per_s=hyp_steps / seconds,
        bytes_per_step=moved.total_bytes / steps,
        bytes_by_reason={r: n / steps for r, n in moved.by_reason().items()},
        h2d_bytes_per_step=h2d / steps,
        outside_run_share=max(0.0, 1.0 - run_s / seconds),
        measured_h2d_bytes_per_step=None if copies is None else copies[0] / steps,
        measured_h2d_copies_per_step=None if copies is None else copies[1] / steps,
    )


def copies_since(before: tuple[int, int] | None) -> tuple[int, int] | None:
    after = COUNTER.snapshot()
    if before is None or after is None:
        return None
    return after[0] - before[0], after[1] - before[1]


@functools.cache  # made once per length: SearchOptions checks every option when made
def fixed_length(steps: int) -> SearchOptions:
    return SearchOptions(beam_size=BEAM, max_length_a=0.0, max_length_b=steps, max_length=steps)


def static(
    model: OnnxModel, encoded: list[EncodedSentence], repeats: int, kind: str = "host"
) -> Figures:
    """B sentences, TARGET_LEN steps together; the best of `repeats` runs after a warm-up."""
    best: Figures | None = None
    for run in range(repeats + 1):
        before, copied = model.transfers.snapshot(), COUNTER.snapshot()
        started = clock()
        search = Search(model, kind)
        search.add(list(range(len(encoded))), encoded, fixed_length(TARGET_LEN))
        while not search.is_empty:
            search.step()
        seconds = clock() - started
        row = figures(
            BEAM * len(encoded) * TARGET_LEN,
            seconds,
            TARGET_LEN,
            model.transfers.snapshot().minus(before),
            search.runs.seconds,
            copies_since(copied),
        )
        if run and (best is None or row.hyp_steps_per_s > best.hyp_steps_per_s):
            best = row  # run 0 is the warm-up
    assert best is not None
    return best


def churn(
    model: OnnxModel, pool: list[EncodedSentence], B: int, steps: int, kind: str = "host"
) -> Figures:
    """B sentences running, each living B steps, one joining at every step: after B warm-up steps
    one leaves and one joins at each of the `steps` timed ones."""
    search = Search(model, kind)
    sentences = itertools.cycle(pool)
    keys = itertools.count()

    def join_and_step() -> None:
        search.add([next(keys)], [next(sentences)], fixed_length(B))
        search.step()

    for _ in range(B):
        join_and_step()
    search.runs.seconds = 0.0
    before, copied = model.transfers.snapshot(), COUNTER.snapshot()
    started = clock()
    for _ in range(steps):
        join_and_step()
    seconds = clock() - started
    return figures(
        BEAM * B * steps,
        seconds,
        steps,
        model.transfers.snapshot().minus(before),
        search.runs.seconds,
        copies_since(copied),
    )


def churn_profile(
    model: OnnxModel, pool: list[EncodedSentence], B: int, steps: int, kind: str = "device"
) -> list[str]:
    """Where a churn step's time goes: cProfile over a churn run at B sentences (after the timed
    runs, not timed itself): the profiled total a step, then the 20 functions of most own time and
    the 12 of most cumulative time, in microseconds a step."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    churn(model, pool, B, steps, kind)
    profiler.disable()
    per = 1e6 / (B + steps)  # churn runs B warm-up steps and `steps` timed ones
    total = (time.perf_counter() - started) * per
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        (own, cumulative, calls, f"{Path(path).name}:{line}({name})")
        for (path, line, name), (_, calls, own, cumulative, _) in stats.items()
    ]

    def line(own: float, cumulative: float, calls: int, where: str) -> str:
        return f"{own * per:8.0f} us own {cumulative * per:8.0f} us cum {calls / (B + steps):6.1f} calls  {where}"

    by_own = sorted(rows, reverse=True)[:20]
    by_cumulative = sorted(rows, key=lambda r: -r[1])[:12]
    return (
        [
            f"profiled: {total:.0f} us a step (B {B}, cProfile's own overhead included)",
            "by own time:",
        ]
        + [line(*r) for r in by_own]
        + ["by cumulative time:"]
        + [line(*r) for r in by_cumulative]
    )


def default_sources(n: int) -> tuple[Bundle, list[list[int]]]:
    bundle = load_bundle(REPO / "models" / "default")
    tok = Tokenizer.load(bundle.file("source.model"))
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()
    texts = [line.split("\t")[0] for line in lines if line.strip()]
    return bundle, [tok.encode(texts[i % len(texts)]) for i in range(n)]


def grc_sources(n: int) -> tuple[Bundle, list[list[int]]]:
    """The Greek bundle, on Greek verses of its dev split."""
    bundle = load_bundle(REPO / "models" / "grc-en-nt")
    tok = Tokenizer.load(bundle.file("source.model"))
    texts = bundle_texts(bundle.path)
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
    "grc": grc_sources,
    "realistic": realistic_sources,
}


def available_providers() -> list[str]:
    import onnxruntime as ort

    return ["cpu"] + (["cuda"] if CUDA in ort.get_available_providers() else [])


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"providers": {}, "models": {}, "errors": {}}
    providers = [p for p in available_providers() if p in getattr(args, "providers", PROVIDERS)]
    for name in args.models:
        try:
            report["models"][name] = model_rows(name, providers, args, report)
        except Exception as err:
            report["errors"][name] = f"{type(err).__name__}: {err}"
            print(f"{name}: failed: {report['errors'][name]}")
    return report


def model_rows(
    name: str, providers: list[str], args: argparse.Namespace, report: dict[str, Any]
) -> list[dict[str, Any]]:
    bundle, sources = MODELS[name](max(args.batches) + args.steps + max(args.batches))
    rows: list[dict[str, Any]] = []
    for provider in providers:
        # offline decoding with the machine to itself: spinning threads, as
        # benchmarks.decoding.decode
        config = RuntimeConfig(
            providers=PROVIDERS[provider],
            spin_wait=True,
            encoder_threads=0,
            intra_op_threads=getattr(args, "threads", 0),
        )
        model = OnnxModel(bundle, config)
        report["providers"][provider] = model.providers
        if provider == "cuda" and model.providers[0] != CUDA:
            print(f"{name}: the CUDA provider did not load; skipped")
            continue
        pool = model.encode_sentences(sources)
        searches = getattr(args, "searches", ["host"])
        models = {kind: model for kind in searches}  # the fp16 step beside, the same encoder rows
        if FP16 in searches:
            models[FP16] = OnnxModel(bundle, replace(config, fp16_decoder=True))
        for B in args.batches:
            samples: dict[str, dict[str, list[Figures]]] = {
                kind: {"static": [], "churn": []} for kind in searches
            }
            for _ in range(getattr(args, "rounds", 1)):  # the searches interleaved, round by round
                for kind in searches:
                    m = models[kind]
                    samples[kind]["static"].append(static(m, pool[:B], args.repeats, kind))
                    samples[kind]["churn"].append(
                        max(
                            (churn(m, pool, B, args.steps, kind) for _ in range(args.repeats)),
                            key=lambda f: f.hyp_steps_per_s,
                        )
                    )
            for kind in searches:
                row: dict[str, Any] = {
                    "provider": provider,
                    "search": kind,
                    "sentences": B,
                    "hypotheses": BEAM * B,
                }
                for part, runs in samples[kind].items():
                    ranked = sorted(runs, key=lambda f: f.hyp_steps_per_s)
                    row[part] = ranked[len(ranked) // 2].__dict__  # the median round's
                    row[part]["rounds"] = [round(f.hyp_steps_per_s) for f in runs]
                rows.append(row)
                print_row(name, rows[-1])
        if getattr(args, "profile", False) and (provider == "cuda" or "cuda" not in providers):
            B = max(args.batches)
            profile = churn_profile(model, pool, B, B)
            report.setdefault("profiles", {})[f"{name} {provider} B {B}"] = profile
            print(f"{name} {provider} B {B}, a churn step:\n" + "\n".join(profile))
    add_speedups(rows)

    return rows


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Each row's hypothesis-steps/s over the CPU provider's at the same batch size and search."""
    cpu = {(r["sentences"], r.get("search")): r for r in rows if r["provider"] == "cpu"}
    for r in rows:
        base = cpu.get((r["sentences"], r.get("search")))
        for kind in ("static", "churn"):
            r[kind]["speedup_over_cpu"] = (
                r[kind]["hyp_steps_per_s"] / base[kind]["hyp_steps_per_s"] if base else None
            )


def print_row(model: str, r: dict[str, Any]) -> None:
    s, c = r["static"], r["churn"]
    print(
        f"{model:9s} {r['provider']:4s} {r.get('search', 'host'):6s} B {r['sentences']:4d} "
        f"({r['hypotheses']:4d} hyps): "
        f"static {s['hyp_steps_per_s']:9,.0f} hyp-steps/s {s['bytes_per_step']:10,.0f} B/step | "
        f"churn {c['hyp_steps_per_s']:9,.0f} hyp-steps/s {c['bytes_per_step']:10,.0f} B/step | "
        f"outside run {s['outside_run_share']:.0%}/{c['outside_run_share']:.0%} | "
        f"H2D ledger {s['h2d_bytes_per_step']:,.0f} measured {measured(s)}"
    )


def ratio(figures: dict[str, Any]) -> str:
    value = figures.get("speedup_over_cpu")
    return "-" if value is None else f"{value:.2f}"


def measured(figures: dict[str, Any]) -> str:
    value = figures.get("measured_h2d_bytes_per_step")
    return "-" if value is None else f"{value:,.0f}"


def print_tables(report: dict[str, Any]) -> None:
    for name, rows in report["models"].items():
        print(f"\n## {name}\n")
        print("\n".join(table(rows)))


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One model's rows as a Markdown table (also benchmarks/gpu/gpu_check.py's)."""
    lines = [
        "| provider | search | sentences (hyps) | static hyp-steps/s | ×CPU | static H2D B/step: "
        "ledger / measured | static outside run | churn hyp-steps/s | ×CPU | churn H2D B/step: "
        "ledger / measured | churn outside run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, c = r["static"], r["churn"]
        lines.append(
            f"| {r['provider']} | {r.get('search', 'host')} | {r['sentences']} ({r['hypotheses']}) "
            f"| {s['hyp_steps_per_s']:,.0f} | {ratio(s)} "
            f"| {s['h2d_bytes_per_step']:,.0f} / {measured(s)} | {s['outside_run_share']:.0%} "
            f"| {c['hyp_steps_per_s']:,.0f} | {ratio(c)} "
            f"| {c['h2d_bytes_per_step']:,.0f} / {measured(c)} | {c['outside_run_share']:.0%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=list(PROVIDERS))
    p.add_argument("--threads", type=int, default=0, help="CPU provider threads; 0 = one a core")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument(
        "--searches",
        nargs="+",
        default=["host", "device"],
        choices=KINDS,
        help="the searches measured, each beside the others in the same run (device-fp16: the "
        "device search over the float16 decoder step, for a GPU)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs timed a round (the best counts)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds, the searches interleaved in each; a row gives the median round's figures",
    )
    p.add_argument("--steps", type=int, default=60, help="churn steps timed")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall time, or this thread's CPU time (with --threads 1 on a shared CPU machine)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile a churn run at the largest batch (CUDA's, where it is here)",
    )
    args = p.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    report = run(args)
    report["clock"] = args.clock
    if args.json:  # first: a table that cannot print must not lose the figures
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_tables(report)
    if "cuda" not in report["providers"] and "cuda" in args.providers:
        print(
            "\nNo CUDA provider in this onnxruntime: CPU figures only (the GPU columns need one)."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
