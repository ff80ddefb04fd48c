"""A Transformer served under load beside CTranslate2's offline rate, on the same weights and texts.

    python -m benchmarks.serving.transformer_served --model embedded --users 64 \
        [--rounds 2] [--json docs/benchmarks/transformer-served-embedded.json]
    python -m benchmarks.serving.transformer_served --model opus-mt --sentences 96 --users 64 \
        [--json docs/benchmarks/transformer-served-opus-mt.json]

The models:

- `embedded`: models/grc-en-nt-transformer (Marian, 3 + 3 layers, 256 wide) on the Greek dev
  verses (`python -m export.data.bible --out data/grc-en` writes them; `--texts` names another
  file). CTranslate2 decodes the same weights: the bundle written back as its Marian model.npz
  (benchmarks/importing/bundle_to_marian.py, which holds every weight to the bundle's) and
  converted by CTranslate2's MarianConverter. Ours decodes with the bundle's rules (Marian's
  length normalization and narrowing beam), CTranslate2 with length_penalty 1, its nearest: the
  two write about as many tokens (reported), not the same lists.
- `opus-mt`: OPUS-MT's shape (6 + 6 layers, 512 wide, 8 heads, a 32k shared vocabulary, random
  weights: export/toolkits/hf_fixture.py), a Hugging Face MarianMTModel directory imported with
  s2s-import huggingface and converted by CTranslate2's TransformersConverter, on
  benchmarks/importing/transformer_speed.py's texts (number words, 6-72 pieces). Its random
  weights write every sentence to the length cap, so both sides decode `--max-tokens` tokens a
  sentence: the same work on each side.

Per round, one after the other on this machine, nothing else running:

- CTranslate2 offline: every text, batches of 32 sorted by length, beam 5, two hypotheses, the
  attention returned, `--threads` intra-op threads: sentences/s;
- ours served: `python -m service.serve.server` on the bundle as users start it (its defaults: one
  front, one engine, the engine's threads one per core), `--users` closed-loop gRPC clients each
  sending one text at a time (beam 5, n-best 2, word alignment): the answers that end in a window
  after a warm-up a second (at 64 clients a request takes a good part of the window), p50 and p99
  of those that start and end in it;
- one at a time: CTranslate2 translating one sentence a call, and ours served to one client: p50.

The ratios are ours / CTranslate2 (rate) and ours / CTranslate2 (one-sentence p50). The clients
run on the same two cores as the server: the served figure pays for its load generator, which
the offline figure does not have.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.importing.transformer_speed import SHAPES, by_length, sentences
from benchmarks.serving.served import measure
from loadtest.harness import LocalServer

BEAM, BEST, BATCH = 5, 2, 32
EMBEDDED = Path(__file__).resolve().parents[2] / "models" / "grc-en-nt-transformer"


@dataclass
class Setup:
    """A model as both sides decode it: our bundle, CTranslate2's conversion, the texts (sorted
    by length) and their source pieces, CTranslate2's settings, our requests' length cap."""

    bundle: Path
    converted: Path
    texts: list[str]
    pieces: list[list[str]]
    peer: dict[str, Any]
    max_length: int | None


def prepare_opus_mt(work: Path, count: int, max_tokens: int) -> Setup:
    from ctranslate2.converters import TransformersConverter

    from export.importers.huggingface import import_model
    from export.toolkits.hf_fixture import write_model

    model_dir = write_model(work / "hf", **SHAPES["opus-mt"])  # type: ignore[arg-type]
    bundle = import_model(model_dir, work / "bundle", "opus-mt", "1")
    converted = work / "ct2"
    TransformersConverter(str(model_dir)).convert(str(converted))
    texts = sentences(count, seed=5)
    peer = {"max_decoding_length": max_tokens}
    return sorted_setup(bundle, converted, texts, model_dir / "source.spm", peer, max_tokens)


def prepare_embedded(work: Path, texts_file: Path, count: int) -> Setup:
    from benchmarks.importing.bundle_to_marian import convert_for_ctranslate2, write_marian

    if not texts_file.is_file():
        raise SystemExit(
            f"{texts_file} is not found: python -m export.data.bible --out data/grc-en"
        )
    model, vocabs = write_marian(EMBEDDED, work / "marian")
    converted = convert_for_ctranslate2(model, vocabs, work / "ct2")
    texts = texts_file.read_text(encoding="utf-8").splitlines()[:count]
    peer = {"length_penalty": 1.0, "max_decoding_length": 256}
    return sorted_setup(EMBEDDED, converted, texts, vocabs[0], peer, None)


def sorted_setup(
    bundle: Path, converted: Path, texts: list[str], source_spm: Path, peer: dict[str, Any],
    max_length: int | None,
) -> Setup:  # fmt: skip
    import sentencepiece as spm

    cutter = spm.SentencePieceProcessor(model_file=str(source_spm))
    pieces = [[*cutter.EncodeAsPieces(t), "</s>"] for t in texts]
    order = by_length(texts, pieces)
    return Setup(bundle, converted, [texts[i] for i in order], [pieces[i] for i in order], peer,
                 max_length)  # fmt: skip


def ctranslate2_rows(setup: Setup, threads: int, singles: int) -> dict[str, float]:
    """CTranslate2's offline rate over every text (and the tokens it wrote), and its p50
    translating one at a time."""
    import ctranslate2

    translator = ctranslate2.Translator(
        str(setup.converted), device="cpu", inter_threads=1, intra_threads=threads
    )
    kwargs = {"beam_size": BEAM, "num_hypotheses": BEST, "return_attention": True, **setup.peer}
    pieces = setup.pieces
    translator.translate_batch(pieces[:BATCH], **kwargs)  # warm-up
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(pieces), BATCH):
        for result in translator.translate_batch(pieces[i : i + BATCH], **kwargs):
            tokens += len(result.hypotheses[0])
    offline = len(pieces) / (time.perf_counter() - started)
    latencies = []
    for piece in pieces[:: max(1, len(pieces) // singles)][:singles]:
        started = time.perf_counter()
        translator.translate_batch([piece], **kwargs)
        latencies.append(time.perf_counter() - started)
    return {
        "offline_sentences_per_s": offline,
        "offline_target_tokens": tokens,
        "one_p50_ms": 1000 * statistics.median(latencies),
    }


def record_engines(server_pid: int, seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy recording each engine process of the server for `seconds` (raw stacks, 50 Hz) into
    OUT.engine<i>.txt; the warm-up is recorded too."""
    found = subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True, text=True)
    engines = [pid for pid in found.stdout.split()
               if "--role engine" in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")]  # fmt: skip
    recorders = []
    for i, pid in enumerate(engines):
        command = ["py-spy", "record", "-p", pid, "-d", str(int(seconds)), "-r", "50", "-f", "raw",
                   "--nonblocking", "-o", f"{out}.engine{i}.txt"]  # fmt: skip
        quiet = subprocess.DEVNULL
        recorders.append(subprocess.Popen(command, stdout=quiet, stderr=quiet))
    return recorders


# py-spy frames that name a part of the engine's work, the first match from the stack's top down
SPY_PARTS = (
    ("cache upkeep", ("CachesInPlace.arrange", "DeclaredStates.join", "HostRowOps.zero_rows",
                      "HostRowOps.keep_last")),
    ("encoder rows", ("DeviceSearch._bind_changes", "EncoderRows.")),
    ("encoder", ("Engine.encode", "EncodeAhead.")),
    ("graph", ("OnnxModel.run_step",)),
    ("search (host)", ("DeviceSearch.", "BeamSearch.", "RunningBatch.")),
    ("channel", ("channel.py", "Endpoint.", "engine_host.py")),
    ("worker", ("Worker.",)),
)  # fmt: skip


def summarize_spy(path: Path) -> dict[str, float]:
    """A py-spy raw recording's samples by part of the engine (SPY_PARTS), in % of the samples
    that were not waiting (a thread blocked in a wait or a poll is idle, not work)."""
    parts: dict[str, float] = {}
    total = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if any(idle in frames[-1] for idle in ("wait", "poll", "select", "sleep", "recv")):
            continue
        total += int(count)
        part = next((name for name, marks in SPY_PARTS
                     if any(m in frame for frame in frames for m in marks)), "other")  # fmt: skip
        parts[part] = parts.get(part, 0) + int(count)
    return {
        k: round(100 * v / max(total, 1), 1)
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
    }


def served_rows(
    setup: Setup, users: int, seconds: float, warmup_s: float, work: Path, server_args: list[str],
    checkout: Path | None = None, py_spy: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Ours served at `users` clients, then to one; the server of `checkout` where given (a
    worktree of another commit, its generated protos in place), else this one's; with `py_spy`,
    its engines recorded under the load (`record_engines`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    flags = ["--http-port", "-1", "--log-level", "WARNING", "--providers", "CPUExecutionProvider",
             *server_args]  # fmt: skip
    server = LocalServer.start(
        str(setup.bundle), "iteration", work, 600, extra=flags, env=env, cwd=checkout
    )
    texts, cap = setup.texts, setup.max_length
    try:
        spy = record_engines(server.process.pid, warmup_s + seconds, py_spy) if py_spy else []
        loaded = measure(server.target, texts, users, 2, warmup_s, seconds, "", cap)
        for recorder in spy:
            recorder.wait(timeout=120)
        alone = measure(server.target, texts, 1, 1, 3.0, seconds / 2, "", cap)
    finally:
        server.stop()
    return {
        "served_sentences_per_s": loaded["answered_per_s"],
        "served_p50_ms": loaded["p50_ms"],
        "served_p99_ms": loaded["p99_ms"],
        "served_errors": loaded["errors"],
        "one_client_p50_ms": alone["p50_ms"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"model": args.model, "users": args.users, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model == "embedded":
            setup = prepare_embedded(work, args.texts, args.sentences)
        else:
            setup = prepare_opus_mt(work, args.sentences, args.max_tokens)
        report["sentences"] = len(setup.texts)
        for _ in range(args.rounds):
            peer = ctranslate2_rows(setup, args.threads, 24)
            ours = served_rows(
                setup, args.users, args.seconds, args.warmup_s, work, args.server_args.split(),
                args.checkout, args.py_spy,
            )  # fmt: skip
            row = {
                **{f"ctranslate2_{k}": v for k, v in peer.items()},
                **ours,
                "rate_ratio": ours["served_sentences_per_s"] / peer["offline_sentences_per_s"],
                "one_p50_ratio": ours["one_client_p50_ms"] / peer["one_p50_ms"],
            }
            if args.py_spy:
                for recording in sorted(args.py_spy.parent.glob(f"{args.py_spy.name}.engine*.txt")):
                    row[f"py_spy_{recording.name}"] = summarize_spy(recording)
            report["rounds"].append(row)
            print(json.dumps(row), flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("embedded", "opus-mt"), default="embedded")
    parser.add_argument("--texts", type=Path, default=Path("data/grc-en/dev.grc"),
                        help="--model embedded: one source a line")  # fmt: skip
    parser.add_argument("--sentences", type=int, default=418, help="the first N texts")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--warmup-s", type=float, default=40.0)
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2's intra-op threads")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--server-args", default="", help="more server flags, e.g. --no-cache-in-place"
    )
    parser.add_argument("--checkout", type=Path,
                        help="serve from this checkout (a worktree of the commit before)")  # fmt: skip
    parser.add_argument("--py-spy", type=Path,
                        help="record the engines under load with py-spy into PATH.engine<i>.txt")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
