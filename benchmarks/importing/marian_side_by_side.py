"""Marian's s2s models on John, side by side with their import: fidelity, quality and speed on the
same weights.

    python -m benchmarks.importing.marian_side_by_side --data /work/data/grc-en --work /work/runs/marian_bible \
        --models s2s --phases fidelity,quality,speed --threads 1 --json out.json

Each model is a directory under --work holding Marian's model.npz and its src.spm / tgt.spm, or
src.yml / tgt.yml word vocabularies (trained by `--train`, or by hand); it is imported once into
bundle/ (with the int8 decoder). The `words` shape is a user's: a bi-LSTM encoder, GRU decoder
cells, tied embeddings and Marian's word vocabularies with `--dim-vocabs 8000 6000`.

- fidelity: marian-decoder on John at beam 1 and 5 (n-best, `--alignment soft`, one sentence a
  mini-batch so that each has its own length limit) against (a) marian-decoder's search rule over our
  graphs (export/toolkits/marian_search.py): n-best texts, scores within 1e-4, soft alignments; and
  (b) the engine as served with the bundle's defaults (Marian's rules: stopping "narrowing",
  max_length_factor 3): best outputs and n-best texts.
- quality: BLEU/chrF of Marian's and the served beam-5 outputs (benchmarks/alignment/grc_en.py's
  scoring).
- speed: sentences/s on the first --speed-verses verses of John, beam 5, batches of 32, interleaved
  rounds and medians (benchmarks/importing/import_speed.py's time_systems): ours fp32 and int8 (the
  engine, 32 verses a call in input order) against Marian float32 and with `--gemm-type packed8`
  (pymarian.Translator in this process, --mini-batch 32 --maxi-batch 100 --maxi-batch-sort src).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.alignment import grc_en
from benchmarks.importing import import_speed
from export.data import bible
from export.importers import marian
from export.toolkits import marian_toolkit
from export.toolkits.marian_search import MarianRules, MarianSearch
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import EngineLimits, RuntimeConfig

BATCH, BEAM = 32, 5
# Marian's defaults apart from size and time (and the learning rate: see docs/import.md): its
# options, its vocabularies' kind (SentencePiece or words) and --dim-vocabs
SHAPES: dict[str, tuple[list[str], str, tuple[int, int]]] = {
    "s2s": ([], "spm", (3000, 2000)),
    "lstm": (["--enc-cell", "lstm", "--dec-cell", "lstm"], "spm", (3000, 2000)),
    "words": (
        ["--enc-cell", "lstm", "--dec-cell", "gru", "--tied-embeddings"],
        "yml",
        (8000, 6000),
    ),
}
TRAIN = ["--dim-emb", "256", "--dim-rnn", "256",
         "--mini-batch", "32", "--learn-rate", "0.001", "--save-freq", "200u"]  # fmt: skip
MARIAN_GEMMS = {"marian_fp32": "float32", "marian_packed8": "packed8"}


def served_options(beam: int) -> SearchOptions:
    """marian-decoder's rules as served options, the bundle's defaults (marian.DECODING): the beam
    narrows for good, at most ceil(3 x the source's tokens with `</s>`), no normalization."""
    return SearchOptions(beam_size=beam, n_best=1, max_length=1024, **marian.DECODING)


def load_engine(bundle: Path, threads: int, int8: bool = False) -> Engine:
    runtime = RuntimeConfig(
        providers=("CPUExecutionProvider",),
        intra_op_threads=threads,
        encoder_threads=threads,
        int8_decoder=int8,
    )
    return Engine.load(bundle, runtime, EngineLimits(max_source_tokens=1024, max_length=1024))


def served_nbest(engine: Engine, lines: Sequence[str], beam: int) -> list[list[str]]:
    """Every hypothesis of the served n-best list (n = beam), in order."""
    options = replace(served_options(beam), n_best=beam)
    out: list[list[str]] = []
    for i in range(0, len(lines), BATCH):
        batch = engine.translate(list(lines[i : i + BATCH]), options, "none")
        out += [[h.text for h in t.hypotheses] for t in batch]
    return out


def served(engine: Engine, lines: Sequence[str], beam: int) -> list[str]:
    out: list[str] = []
    for i in range(0, len(lines), BATCH):
        batch = engine.translate(list(lines[i : i + BATCH]), served_options(beam), "none")
        out += [t.hypotheses[0].text for t in batch]
    return out


def vocab_files(model_dir: Path) -> tuple[Path, Path]:
    """The model's vocabularies: src.spm / tgt.spm, else src.yml / tgt.yml."""
    kind = "spm" if (model_dir / "src.spm").exists() else "yml"
    return model_dir / f"src.{kind}", model_dir / f"tgt.{kind}"


def imported(model_dir: Path) -> Path:
    bundle = model_dir / "bundle"
    if not (bundle / "manifest.json").exists():
        vocabs = vocab_files(model_dir)
        marian.import_model(model_dir / "model.npz", vocabs, bundle, model_dir.name, "1.0.0", True)
    return bundle


def fidelity(model_dir: Path, test: Path, threads: int) -> dict[str, Any]:
    lines = test.read_text(encoding="utf-8").splitlines()
    vocabs = vocab_files(model_dir)
    bundle = imported(model_dir)
    search = MarianSearch(bundle, threads)
    engine = load_engine(bundle, threads)
    found: dict[str, Any] = {"verses": len(lines)}
    for beam in (1, BEAM):
        out = model_dir / f"john.b{beam}.nbest"
        if not out.exists():
            marian_toolkit.decode(model_dir / "model.npz", vocabs, test, out, beam, threads,
                                  n_best=True, alignment="soft")  # fmt: skip
        theirs = marian_toolkit.read_nbest(out)
        nbest_same, strict_same, texts_same = 0, 0, 0
        worst_score, worst_relative, worst_attention = 0.0, 0.0, 0.0
        for line, their in zip(lines, theirs, strict=True):
            ours = search.translate(line, MarianRules(beam_size=beam))
            texts = [h.text for h in ours] == [h.text for h in their]
            if texts:
                texts_same += 1
                pairs = list(zip(ours, their, strict=True))
                score = max(abs(a.score - b.score) for a, b in pairs)
                relative = max(abs(a.score - b.score) / max(abs(b.score), 1e-9) for a, b in pairs)
                worst_relative = max(worst_relative, relative)
                attention = max(
                    float(np.abs(a.attention - marian_toolkit.soft_alignment(b.alignment)).max())
                    for a, b in pairs
                )
                worst_score, worst_attention = (
                    max(worst_score, score),
                    max(worst_attention, attention),
                )
                nbest_same += all(
                    abs(a.score - b.score) <= marian_toolkit.score_tolerance(b.score)
                    for a, b in pairs
                )
                strict_same += score <= 1e-4
        served_best = served(engine, lines, beam)
        best_same = sum(a == b[0].text for a, b in zip(served_best, theirs, strict=True))
        nbest = served_nbest(engine, lines, beam)
        nbest_served = sum(a == [h.text for h in b] for a, b in zip(nbest, theirs, strict=True))
        found[f"beam{beam}"] = {
            # the served n-best list (n = beam) with Marian's texts in Marian's order
            "served_nbest_texts_identical": f"{nbest_served}/{len(lines)}",
            # texts and order equal, scores within 1e-4 (or Marian's printed precision, coarser
            # below -100: marian_toolkit.score_tolerance); strictly within 1e-4
            "marian_rule_nbest_texts_identical": f"{texts_same}/{len(lines)}",
            "marian_rule_nbest_identical": f"{nbest_same}/{len(lines)}",
            "marian_rule_nbest_identical_strict_1e-4": f"{strict_same}/{len(lines)}",
            "max_score_difference": worst_score,
            "max_relative_score_difference": worst_relative,
            "max_attention_difference": worst_attention,
            "served_best_identical": f"{best_same}/{len(lines)}",
            "marian_best": [t[0].text for t in theirs],
            "served_best": served_best,
        }
    return found


def quality(found: dict[str, Any], data: Path) -> dict[str, Any]:
    test = grc_en.read_split(data, "test")
    scores: dict[str, Any] = {}
    for system, key in (("marian", "marian_best"), ("ours", "served_best")):
        hyps = [bible.strip_punctuation(h) for h in found[f"beam{BEAM}"][key]]
        row = grc_en.translation_scores(system, hyps, test.targets)
        scores[system] = {"bleu": round(row.bleu or 0.0, 2), "chrf": round(row.chrf or 0.0, 2)}
    return scores


def marian_system(model_dir: Path, threads: int, gemm: str) -> Callable[[list[str]], list[str]]:
    import pymarian

    src, tgt = vocab_files(model_dir)
    translator = pymarian.Translator(
        f"-m {model_dir / 'model.npz'} -v {src} {tgt} "
        f"--cpu-threads {threads} -b {BEAM} --mini-batch {BATCH} --maxi-batch 100 "
        f"--maxi-batch-sort src --gemm-type {gemm} --quiet"
    )

    def run(lines: list[str]) -> list[str]:
        return list(translator.translate(lines))

    return run


def ours_system(bundle: Path, threads: int, int8: bool) -> Callable[[list[str]], list[str]]:
    engine = load_engine(bundle, threads, int8)
    return lambda lines: served(engine, lines, BEAM)


def speed(model_dir: Path, lines: list[str], threads: int, repeats: int) -> dict[str, Any]:
    bundle = imported(model_dir)
    systems = {
        "ours_fp32": ours_system(bundle, threads, False),
        "ours_int8": ours_system(bundle, threads, True),
        **{name: marian_system(model_dir, threads, g) for name, g in MARIAN_GEMMS.items()},
    }
    load = os.getloadavg()[0]
    speeds, outputs = import_speed.time_systems(systems, lines, repeats)
    found: dict[str, Any] = {f"{name}_sent_per_s": v for name, v in speeds.items()}
    found["ratio_fp32"] = round(speeds["ours_fp32"] / speeds["marian_fp32"], 2)
    found["ratio_int8"] = round(speeds["ours_int8"] / speeds["marian_fp32"], 2)
    found["same_outputs_fp32"] = sum(
        a == b for a, b in zip(outputs["ours_fp32"], outputs["marian_fp32"], strict=True)
    )
    found["load_1min"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    return found


def train(work: Path, data: Path, name: str, after: str) -> None:
    options, kind, (src_dim, tgt_dim) = SHAPES[name]
    marian_toolkit.train(
        (data / "train.grc", data / "train.en"),
        work / name,
        (f"src.{kind}", f"tgt.{kind}"),
        [*TRAIN, "--dim-vocabs", str(src_dim), str(tgt_dim), *options],
        after=after,
    )


def format_table(results: dict[str, Any], threads: Sequence[int]) -> str:
    head = ["model", "BLEU Marian", "BLEU ours", "chrF Marian", "chrF ours",
            "beam 1 n-best (Marian's rule)", "beam 5 n-best (Marian's rule)",
            "beam 1 served", "beam 5 served", "beam 1 served n-best", "beam 5 served n-best"]  # fmt: skip
    for t in threads:
        head += [f"{t}t ours fp32", f"{t}t ours int8", f"{t}t Marian fp32",
                 f"{t}t Marian packed8", f"{t}t ours/Marian fp32 (int8)"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        q, f = r.get("quality", {}), r.get("fidelity", {})
        cells = [name]
        cells += [
            str(q.get(s, {}).get(m, "")) for m in ("bleu", "chrf") for s in ("marian", "ours")
        ]
        cells += [f.get(f"beam{b}", {}).get("marian_rule_nbest_identical", "") for b in (1, BEAM)]
        cells += [f.get(f"beam{b}", {}).get("served_best_identical", "") for b in (1, BEAM)]
        cells += [f.get(f"beam{b}", {}).get("served_nbest_texts_identical", "") for b in (1, BEAM)]
        for t in threads:
            s = r.get(f"speed_{t}t", {})
            cells += [str(s.get(k, "")) for k in ("ours_fp32_sent_per_s", "ours_int8_sent_per_s",
                                                  "marian_fp32_sent_per_s",
                                                  "marian_packed8_sent_per_s")]  # fmt: skip
            cells.append(f"{s.get('ratio_fp32', '')}x ({s.get('ratio_int8', '')}x)" if s else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="export.data.bible's output")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--models", default="s2s", help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--phases", default="fidelity,quality,speed")
    parser.add_argument("--train", default="", help="train missing models for this long (1300u)")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed-verses", type=int, default=160)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    phases, threads = args.phases.split(","), [int(t) for t in args.threads.split(",")]
    results: dict[str, Any] = {}
    if args.json and args.json.exists():
        results = json.loads(args.json.read_text())
    test = args.data / "test.grc"
    john = test.read_text(encoding="utf-8").splitlines()
    for name in args.models.split(","):
        if args.train and not (args.work / name / "model.npz").exists():
            train(args.work, args.data, name, args.train)
        r = results.setdefault(name, {})
        if "fidelity" in phases:
            r["fidelity"] = fidelity(args.work / name, test, 1)
        if "quality" in phases:
            r["quality"] = quality(r["fidelity"], args.data)
        if "speed" in phases:
            for t in threads:
                r[f"speed_{t}t"] = speed(
                    args.work / name, john[: args.speed_verses], t, args.repeats
                )
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print(format_table(results, threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
