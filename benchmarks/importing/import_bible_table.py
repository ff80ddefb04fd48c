"""Our Greek→English model beside the same split's models trained by OpenNMT-py and Joey NMT and
imported: one side-by-side table on John (877 verses).

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.importing.import_bible_table --data /work/data/grc-en \
        --work /work/runs/import_bible_full --bundle models/grc-en-nt --repeats 3 --threads 1,2 \
        --json docs/benchmarks/import_bible_table.json

Rows: our own model (`--bundle`, Translate at beam 5 with its default options) and the four toolkit
models of `python -m benchmarks.importing.import_speed --bible DATA --setup full` (trained there
once and reused from --work: OpenNMT-py with `sentencepiece` and with `bpe`, Joey NMT with
`sentencepiece` and with `subword-nmt`; imported with s2s-import). Columns:
- BLEU and chrF (sacrebleu) as benchmarks/alignment/grc_en.py scores them: references the BSB words
  without `exclude` rows, hypotheses with punctuation stripped; the imported models' served output
  at beam 5 with the fidelity settings (no length penalty, at most 100 target tokens);
- AER / precision / recall of the model's attention against Biblica's gold links (test.pharaoh),
  through our Align path (service/decode/align/aligner.py `align` on the bundle), links `argmax` and `grow`,
  and `head` for a bundle with a link head (ours);
- fidelity: verses whose served output equals the toolkit's own translate command's output
  (onmt_translate / `python -m joeynmt translate`), greedy and beam 5;
- decode speed in sentences/s, beam 5, batches of 32, decode only, ours fp32 and int8 against the
  toolkit's in-process translate API, interleaved rounds, medians
  (benchmarks/importing/import_speed.py's measuring code), per thread count, over John's first
  `--speed-verses` verses (160: Joey NMT's beam search took 276 s for the whole of John, so 3 rounds
  of every system on all 877 verses would take over an hour). Our model has no toolkit; its int8
  decoder is quantized into a copy of the bundle under --work (models/ is left as it is).

`--phases` runs some of fidelity, quality, align, speed; results of a phase not run are taken from
an existing --json file, so the 2-thread speeds can be measured last (`--phases speed --threads 2`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

import torch

from benchmarks.alignment import grc_en
from benchmarks.importing import import_speed
from export.data import bible
from export.metrics.aer import parse_pharaoh, score_corpus
from export.onnx.quantize import quantize_decoder
from export.toolkits import toolkits
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.model.bundle import add_files, read_manifest

LINKS = ("argmax", "grow", "head")  # "head": only a bundle with a link head (ours) has it
PHASES = ("fidelity", "quality", "align", "speed")
TOOLKIT_LABEL = {"opennmt-py": "OpenNMT-py", "joeynmt": "Joey NMT"}


def load_engine(bundle: Path, threads: int = 1) -> Engine:
    """The bundle on CPU with room for the longest verses, warmed up."""
    engine = Engine.load(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=threads),
        EngineLimits(max_source_tokens=1024, max_length=1024),
    )
    engine.warm_up()
    return engine


def decode(engine: Engine, sources: Sequence[str], options: SearchOptions) -> list[str]:
    """Best hypothesis per source, in order, batches of 32."""
    out: list[str] = []
    for start in range(0, len(sources), import_speed.BATCH):
        batch = engine.translate(sources[start : start + import_speed.BATCH], options, "none")
        out += [t.hypotheses[0].text for t in batch]
    return out


def toolkit_options(beam: int) -> SearchOptions:
    """The settings the toolkits' translate commands are run with (export/toolkits/toolkits.py)."""
    return SearchOptions(beam_size=beam, max_length_a=0.0, max_length_b=import_speed.MAX_LEN)


def toolkit_translate(model: dict[str, Any], src: Path, beam: int) -> list[str]:
    """The toolkit's own translate command on src (cached next to the model)."""
    out = model["bundle"].parent / f"{src.stem}.beam{beam}.txt"
    if not out.exists():
        if model["toolkit"] == "opennmt-py":
            toolkits.translate_onmt(model["ckpt"], src, out, beam, extra=model["extra"])
        else:
            toolkits.translate_joey(model["config"], src, out, beam)
    return toolkits.read_lines(out)


def fidelity(model: dict[str, Any], src: Path, engine: Engine) -> dict[str, Any]:
    """Verses whose served output equals the toolkit's own, greedy and beam 5; the beam-5 outputs."""
    sources = toolkits.read_lines(src)
    found: dict[str, Any] = {}
    for beam, key in ((1, "greedy"), (5, "beam5")):
        ours = decode(engine, sources, toolkit_options(beam))
        theirs = toolkit_translate(model, src, beam)
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        found[f"identical_{key}"] = f"{same}/{len(sources)}"
        found[f"outputs_{key}"] = ours
    return found


def quality(hypotheses: Sequence[str], test: grc_en.Split) -> dict[str, float]:
    row = grc_en.translation_scores(
        "", [bible.strip_punctuation(h) for h in hypotheses], test.targets
    )
    return {"bleu": round(row.bleu or 0.0, 2), "chrf": round(row.chrf or 0.0, 2)}


def alignment(engine: Engine, test: grc_en.Split) -> dict[str, float]:
    """AER, precision and recall of Align's links in each of LINKS."""
    found: dict[str, float] = {}
    for mode in LINKS:
        if mode == "head" and engine.link_head is None:
            continue
        lines = grc_en.align_served(engine, test.pairs, mode)
        counts = score_corpus([parse_pharaoh(line) for line in lines], test.gold)
        found[f"aer_{mode}"] = round(counts.aer, 3)
        found[f"precision_{mode}"] = round(counts.precision, 3)
        found[f"recall_{mode}"] = round(counts.recall, 3)
    return found


def int8_copy(bundle: Path, work: Path) -> Path:
    """A copy of `bundle` with an int8 decoder (quantized as `s2s-export --int8` does), made again
    when the bundle's decoder is not the copy's."""
    out = work / f"{bundle.name}-int8"
    if (out / "decoder.int8.onnx").exists():
        if same_decoder(bundle, out):
            return out
        shutil.rmtree(out)
    shutil.copytree(bundle, out, dirs_exist_ok=True)
    quantize_decoder(out / "decoder.onnx", out / "decoder.int8.onnx")
    add_files(out, ["decoder.int8.onnx"])
    return out


def same_decoder(bundle: Path, copy: Path) -> bool:
    files = [read_manifest(folder)["files"]["decoder.onnx"] for folder in (bundle, copy)]
    return files[0] == files[1]


def speed(model: dict[str, Any], lines: list[str], repeats: int, threads: int) -> dict[str, Any]:
    """Sentences/s of ours fp32 and int8 and (for imported models) the toolkit's, interleaved."""
    torch.set_num_threads(threads)
    systems = {
        "ours": import_speed.ours(model["bundle"], threads, int8=False),
        "ours_int8": import_speed.ours(model["int8_bundle"], threads, int8=True),
    }
    if model["toolkit"] == "opennmt-py":
        systems["toolkit"] = import_speed.onmt_system(model["ckpt"], model.get("extra"))
    elif model["toolkit"] == "joeynmt":
        systems["toolkit"] = import_speed.joey_system(model["config"])
    load_before = os.getloadavg()[0]
    speeds, _ = import_speed.time_systems(systems, lines, repeats)
    found: dict[str, Any] = {f"{k}_sent_per_s_{threads}t": v for k, v in speeds.items()}
    # the 1-minute load average around the measurement: the cores are shared
    found[f"load_{threads}t"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    if "toolkit" in speeds:
        found[f"ratio_{threads}t"] = round(speeds["ours"] / speeds["toolkit"], 2)
        found[f"ratio_int8_{threads}t"] = round(speeds["ours_int8"] / speeds["toolkit"], 2)
    return found


def models_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Our model, then the imported ones (trained and imported by import_speed if missing)."""
    ours = {"system": f"ours: {args.bundle.name} (Translate)", "toolkit": None,
            "bundle": args.bundle, "int8_bundle": int8_copy(args.bundle, args.work)}  # fmt: skip
    setup = import_speed.BIBLE_SETUPS[args.setup]
    toolkit_names = tuple(t for t in args.toolkits.split(",") if t)
    tokenizers = tuple(args.tokenizers.split(","))
    imported = import_speed.prepare_bible(args.data, args.work, tokenizers, setup, toolkit_names)
    for m in imported:
        m["system"] = f"{TOOLKIT_LABEL[m['toolkit']]}, {m['tokenizer']} (imported)"
        m["int8_bundle"] = m["bundle"]
    return [ours, *imported]


def run(
    args: argparse.Namespace, rows: dict[str, dict[str, Any]], save: Callable[[], None]
) -> None:
    """Fill rows (system -> results) with the phases asked for, calling `save` after each model."""
    grc_en.ensure_data(args.data)
    test = grc_en.read_split(args.data, "test", args.limit)
    src = args.work / "task" / "test.src"
    if args.limit:  # a file of the first verses, for the toolkits' commands
        src = args.work / f"john{args.limit}.src"
        src.write_text("".join(line + "\n" for line in test.sources))
    models = models_of(args)
    for m in models:
        row = rows.setdefault(m["system"], {"system": m["system"]})
        engine = load_engine(m["bundle"]) if set(args.phases) - {"speed"} else None
        if "fidelity" in args.phases and m["toolkit"] and engine:
            found = fidelity(m, src, engine)
            row.update({k: v for k, v in found.items() if k.startswith("identical")})
            m["beam5"] = found["outputs_beam5"]
        if "quality" in args.phases and engine:
            hyps = m.get("beam5") or (
                grc_en.translate(engine, test.sources, 5, 32)
                if not m["toolkit"]
                else decode(engine, test.sources, toolkit_options(5))
            )
            row.update(quality(hyps, test))
        if "align" in args.phases and engine:
            row.update(alignment(engine, test))
        print(json.dumps(row), flush=True)
        save()
    if "speed" in args.phases:
        lines = test.sources[: args.speed_verses]
        for threads in args.threads:
            for m in models:
                rows[m["system"]].update(speed(m, lines, args.repeats, threads))
                print(json.dumps(rows[m["system"]]), flush=True)
                save()


def format_table(rows: Sequence[dict[str, Any]], threads: Sequence[int], title: str) -> str:
    def cell(row: dict[str, Any], key: str, fmt: str = "") -> str:
        value = row.get(key)
        return "" if value is None else format(value, fmt)

    head = ["system", "BLEU", "chrF"]
    head += [f"{w} {mode}" for mode in LINKS for w in ("AER", "P", "R")]
    head += ["greedy identical", "beam 5 identical"]
    for t in threads:
        head += [f"{t}t ours fp32", f"{t}t ours int8", f"{t}t toolkit", f"{t}t ours/toolkit (int8)"]
    lines = [title, "", "| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for row in rows:
        cells = [row["system"], cell(row, "bleu", ".1f"), cell(row, "chrf", ".1f")]
        for mode in LINKS:
            cells += [cell(row, f"{w}_{mode}", ".3f") for w in ("aer", "precision", "recall")]
        cells += [cell(row, "identical_greedy"), cell(row, "identical_beam5")]
        for t in threads:
            cells += [
                cell(row, f"{k}_sent_per_s_{t}t", ".1f") for k in ("ours", "ours_int8", "toolkit")
            ]
            ratio = row.get(f"ratio_{t}t")
            cells.append("" if ratio is None else f"{ratio:.2f}x ({row[f'ratio_int8_{t}t']:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_note(rows: Sequence[dict[str, Any]], threads: Sequence[int]) -> str:
    """The range of the 1-minute load average seen around each thread count's speed rounds."""
    parts = []
    for t in threads:
        seen = [v for row in rows for v in row.get(f"load_{t}t", [])]
        if seen:
            parts.append(f"{t} thread(s) {min(seen):.1f}-{max(seen):.1f}")
    return "\nLoad average (1 min) around the speed rounds: " + ", ".join(parts) if parts else ""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--work", type=Path, default=Path("runs/import_bible_full"))
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--setup", choices=sorted(import_speed.BIBLE_SETUPS), default="full")
    p.add_argument("--toolkits", default="opennmt-py,joeynmt", help="imported rows ('' for none)")
    p.add_argument("--tokenizers", default="sentencepiece,bpe", help="of the imported rows")
    p.add_argument("--limit", type=int, help="only the first N verses of John (a quick check)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--speed-verses",
        type=int,
        default=160,
        help="speed: the first N verses of John (5 batches)",
    )
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (speed)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"some of {','.join(PHASES)}")
    p.add_argument("--json", type=Path, help="results: read for phases not run, then written")
    args = p.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    args.phases = args.phases.split(",")
    if unknown := set(args.phases) - set(PHASES):
        p.error(f"unknown phases {sorted(unknown)}: choose from {PHASES}")
    logging.disable(logging.INFO)
    torch.set_num_threads(1)
    previous = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    rows = {r["system"]: r for r in previous.get("rows", [])}
    timed = set(args.threads) if "speed" in args.phases else set()
    shown = sorted(timed | set(previous.get("threads", [])))
    test_size = args.limit or len(toolkits.read_lines(args.work / "task" / "test.src"))
    title = (
        f"John: {test_size} verses, beam 5, batches of 32 (speeds in sentences/s over its first "
        f"{min(args.speed_verses, test_size)})"
    )

    def save() -> None:  # after every model: a long run stopped midway keeps what it measured
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            report = {"title": title, "threads": shown, "rows": list(rows.values())}
            partial = args.json.with_suffix(".partial")
            partial.write_text(json.dumps(report, indent=2) + "\n")
            partial.replace(args.json)

    run(args, rows, save)
    print(format_table(list(rows.values()), shown, title))
    print(load_note(list(rows.values()), shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
